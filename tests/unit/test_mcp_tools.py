"""agentrl.tools.mcp without servers: declarations, listed tools as agentrl tools, validation
before a call is sent, result rendering, and the tool_error kind."""

from __future__ import annotations

import asyncio
import base64
import subprocess
import sys

import pytest

from agentrl import tool
from agentrl.errors import McpServerError, ToolErrorKind, ToolServerError
from agentrl.tools import Toolbox, ToolCall
from agentrl.tools.mcp import McpEpisode, McpServer, McpTool, render_result

types = pytest.importorskip("mcp.types", reason="needs the MCP SDK: pip install 'agentrl[mcp]'")


def _spec(name: str = "echo", schema: dict | None = None, **kwargs) -> types.Tool:
    schema = schema or {"type": "object", "properties": {"text": {"type": "string"}},
                        "required": ["text"]}
    return types.Tool(name=name, input_schema=schema, **kwargs)


SERVER = McpServer(command="/usr/bin/my-server", args=["--flag"], name="srv")


def test_mcp_server_declaration():
    with pytest.raises(ValueError, match="exactly one"):
        McpServer()
    with pytest.raises(ValueError, match="exactly one"):
        McpServer(command="x", url="http://127.0.0.1:1/mcp")
    with pytest.raises(ValueError, match="sandbox"):
        McpServer(url="http://127.0.0.1:1/mcp", sandbox=True)
    with pytest.raises(ValueError, match="lifetime='episode'"):
        McpServer(command="x", sandbox=True, lifetime="run")
    with pytest.raises(ValueError, match="tool_prefix"):
        McpServer(command="x", tool_prefix="1bad")
    with pytest.raises(ValueError, match="headers"):
        McpServer(command="x", headers={"a": "b"})
    with pytest.raises(ValueError, match="args"):
        McpServer(url="http://127.0.0.1:1/mcp", args=["x"])
    with pytest.raises(ValueError, match="http"):
        McpServer(url="ftp://host/mcp")
    with pytest.raises(ValueError, match="list of strings"):
        McpServer(command="x", args="--flag")
    with pytest.raises(ValueError, match="timeout"):
        McpServer(command="x", timeout=0)

    assert McpServer(command="/usr/local/bin/mcp-server-time").label == "mcp-server-time"
    assert McpServer(url="http://127.0.0.1:8000/mcp").label == "127.0.0.1"
    assert McpServer(command="x", name="mine").label == "mine"
    module = McpServer.python_module("mcp_server_git", "-r", ".", python="/usr/bin/python3")
    assert module.command == "/usr/bin/python3" and module.args == ("-m", "mcp_server_git", "-r", ".")
    assert module.label == "mcp_server_git"

    assert McpServer(command="x", args=["a"]).key == McpServer(command="x", args=("a",)).key
    assert McpServer(command="x", args=["a"]) == McpServer(command="x", args=["a"])
    assert McpServer(command="x", args=["a"]).key != McpServer(command="x", args=["b"]).key
    assert len({McpServer(command="x"), McpServer(command="x")}) == 1


def test_importing_the_package_imports_no_sdk():
    code = ("import sys, agentrl.tools.mcp, agentrl.tools.mcp._client, agentrl.tools.mcp._tool, "
            "agentrl.env; print(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('mcp', 'mcp_types', 'httpx2', 'anyio')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_mcp_tool_from_listing():
    t = McpTool(SERVER, _spec(description="Echoes."))
    assert t.schema == {"type": "function", "function": {
        "name": "echo", "description": "Echoes.", "parameters": _spec().input_schema}}
    assert t.remote_name == "echo" and t.server is SERVER

    assert McpTool(SERVER, _spec(title="Echo tool")).description == "Echo tool"
    assert McpTool(SERVER, _spec()).description == "Tool 'echo' of the MCP server 'srv'."

    with pytest.raises(McpServerError, match="tool_prefix") as bad_name:
        McpTool(SERVER, _spec(name="1bad"))
    assert "'srv'" in str(bad_name.value)
    prefixed = McpTool(McpServer(command="x", tool_prefix="t_"), _spec(name="1bad"))
    assert prefixed.name == "t_1bad" and prefixed.remote_name == "1bad"

    draft7 = {"$schema": "http://json-schema.org/draft-07/schema#", "type": "object",
              "properties": {"pair": {"type": "array", "items": [{"type": "string"}, {"type": "integer"}]}}}
    tuple_tool = McpTool(SERVER, _spec(name="pair", schema=draft7))
    tuple_tool.validate({"pair": ["a", 1]})

    with pytest.raises(McpServerError, match="invalid JSON schema") as bad_schema:
        McpTool(SERVER, _spec(name="broken", schema={"type": "object",
                                                     "properties": {"x": {"type": "nonsense"}}}))
    assert "'srv'" in str(bad_schema.value) and "'broken'" in str(bad_schema.value)


class _FakeEpisode(McpEpisode):
    def __init__(self, answer=None, delay: float = 0.0) -> None:
        super().__init__([])
        self.calls: list[tuple[str, dict]] = []
        self._answer = answer
        self._delay = delay

    async def call(self, tool, arguments):
        self.calls.append((tool.remote_name, arguments))
        if self._delay:
            await asyncio.sleep(self._delay)
        if isinstance(self._answer, Exception):
            raise self._answer
        return self._answer


def _run(t: McpTool, arguments, fake: McpEpisode):
    return asyncio.run(Toolbox([t]).run(ToolCall(t.name, arguments), {McpEpisode: fake}))


def test_mcp_tool_validates_before_calling():
    t = McpTool(SERVER, _spec())
    fake = _FakeEpisode("fine")
    wrong_type = _run(t, {"text": 5}, fake)
    assert wrong_type.error is ToolErrorKind.SCHEMA_VIOLATION and "at $.text" in wrong_type.content
    assert _run(t, [1, 2], fake).error is ToolErrorKind.MALFORMED_ARGUMENTS
    assert fake.calls == []
    good = _run(t, {"text": "hi"}, fake)
    assert (good.error, good.content, fake.calls) == (None, "fine", [("echo", {"text": "hi"})])

    failing = _run(t, {"text": "hi"}, _FakeEpisode(ToolServerError("the server said no", server="srv")))
    assert failing.error is ToolErrorKind.TOOL_ERROR
    assert failing.content == "Error (tool_error): the server said no"

    slow = McpTool(McpServer(command="x", timeout=0.2), _spec())
    timed_out = _run(slow, {"text": "hi"}, _FakeEpisode("late", delay=30))
    assert timed_out.error is ToolErrorKind.TIMEOUT and "timed out after 0.2 s" in timed_out.content


def test_mcp_tool_outside_an_episode_is_a_definition_error():
    from agentrl.errors import ToolDefinitionError

    t = McpTool(SERVER, _spec())
    with pytest.raises(ToolDefinitionError, match="inside an env episode"):
        asyncio.run(Toolbox([t]).run(ToolCall("echo", {"text": "x"}), {}))
    with pytest.raises(TypeError, match="through an env"):
        t(text="x")


def test_render_result():
    text = types.TextContent(type="text", text="a")
    png = base64.b64encode(b"\x89PNG\r\n").decode()
    result = types.CallToolResult(content=[
        text, types.TextContent(type="text", text="b"),
        types.ImageContent(type="image", data=png, mime_type="image/png"),
        types.AudioContent(type="audio", data=base64.b64encode(b"RIFF").decode(), mime_type="audio/wav"),
        types.EmbeddedResource(type="resource", resource=types.TextResourceContents(
            uri="file:///a.txt", mime_type="text/plain", text="inside")),
        types.EmbeddedResource(type="resource", resource=types.BlobResourceContents(
            uri="file:///b.bin", mime_type="application/zip", blob=base64.b64encode(b"12345").decode())),
        types.ResourceLink(type="resource_link", name="spec", uri="https://example.invalid/spec"),
    ])
    assert render_result(result, 10_000) == (
        "a\nb\n[image: image/png, 6 bytes]\n[audio: audio/wav, 4 bytes]\n"
        "[resource: file:///a.txt]\ninside\n[resource: file:///b.bin, application/zip, 5 bytes]\n"
        "[resource link: spec https://example.invalid/spec]"
    )
    assert render_result(result, 10_000) == render_result(result, 10_000)

    only_structured = types.CallToolResult(content=[], structured_content={"b": 2, "a": [1]})
    assert render_result(only_structured, 100) == '{"a": [1], "b": 2}'
    both = types.CallToolResult(content=[types.TextContent(type="text", text='{"b": 2}')],
                                structured_content={"b": 2})
    assert render_result(both, 100) == '{"b": 2}'
    assert render_result(types.CallToolResult(content=[]), 100) == ""

    long = types.CallToolResult(content=[types.TextContent(type="text", text="x" * 50)])
    assert render_result(long, 20) == "x" * 20 + "\n[... 30 more characters cut ...]"


def test_tool_error_kind():
    assert ToolErrorKind("tool_error") is ToolErrorKind.TOOL_ERROR
    error = ToolServerError("gone", server="srv", connection_lost=True)
    assert error.kind is ToolErrorKind.TOOL_ERROR and error.server == "srv" and error.connection_lost


def test_tool_schema_dialect_unchanged_for_plain_tools():
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"],
              "additionalProperties": False, "$schema": "https://json-schema.org/draft/2020-12/schema"}

    @tool(parameters=schema, inline=True)
    def count(n: int) -> int:
        """Counts."""
        return n

    outcome = asyncio.run(Toolbox([count]).run(ToolCall("count", {"n": "3"}), {}))
    assert outcome.error is ToolErrorKind.SCHEMA_VIOLATION and "at $.n" in outcome.content
    assert asyncio.run(Toolbox([count]).run(ToolCall("count", {"n": 3}), {})).content == "3"


def test_list_envs_names_mcp_servers_without_starting_them(monkeypatch, capsys):
    import json
    from pathlib import Path

    from agentrl.cli import main
    from agentrl.env import registry

    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[2] / "examples"))
    monkeypatch.delitem(sys.modules, "mcp_time_env", raising=False)
    try:
        assert main(["list-envs", "--module", "mcp_time_env", "--json"]) == 0
    finally:  # its registration is undone with the registry: so is the import
        sys.modules.pop("mcp_time_env", None)
    rows = {row["id"]: row for row in json.loads(capsys.readouterr().out)}
    assert rows["time-mcp-v0"]["tools"] == "mcp:time"


# --- the env side, with connections that need no server ---------------------------------------


class _FakeConnection:
    def __init__(self, server: McpServer, specs) -> None:
        self.server = server
        self.tools = tuple(McpTool(server, s) for s in specs)
        self.server_info = "fake 1.0"
        self.alive = True
        self.closed = 0

    async def call_tool(self, tool, arguments):
        return f"{tool.remote_name} got {arguments}"

    async def close(self):
        self.closed += 1


class _FakePool:
    def __init__(self, connection: _FakeConnection) -> None:
        self.connection = connection
        self.opened = 0

    async def open_episode(self, servers, *, sandbox=None):
        self.opened += 1
        return McpEpisode([self.connection])

    def connections(self):
        return []

    async def aclose(self):
        raise AssertionError("a pool the env was given is closed by its owner")


def _env_class():
    from agentrl import ToolEnv

    class Env(ToolEnv):
        def make_prompt(self, task):
            return [{"role": "user", "content": "go"}]

        def compute_reward(self, task, final, state):
            return 0.0

    return Env


@tool(inline=True)
def native(text: str) -> str:
    """A tool of the env itself.

    Args:
        text: Anything.
    """
    return text


def test_env_adds_mcp_tools_at_reset_and_injects_the_episode():
    connection = _FakeConnection(SERVER, [_spec(name="lookup")])
    pool = _FakePool(connection)
    env = _env_class()(tools=[native], mcp_servers=[SERVER])
    env.use_mcp_pool(pool)
    assert env.toolbox.names == ["native"]  # nothing started in the constructor
    _, info = env.reset(options={"task": {}})
    assert [s["function"]["name"] for s in info["tools"]] == ["native", "lookup"]
    assert env.mcp_status() == [{"name": "srv", "server_info": "fake 1.0", "lifetime": "episode",
                                 "sandbox": False, "connected": True, "tools": ["lookup"]}]
    obs, *_ = env.step({"role": "assistant", "content": "", "tool_calls": [
        {"name": "lookup", "arguments": {"text": "x"}}]})
    assert obs[0]["content"] == "lookup got {'text': 'x'}"
    env.reset(options={"task": {}})
    assert connection.closed == 1 and pool.opened == 2 and env.toolbox.names == ["native", "lookup"]
    env.close()
    assert connection.closed == 2 and env.mcp_status() == [] and env.mcp_info[0]["name"] == "srv"


def test_env_rejects_clashing_mcp_tools():
    from agentrl.errors import McpServerError

    env = _env_class()(tools=[native], mcp_servers=[SERVER])
    env.use_mcp_pool(_FakePool(_FakeConnection(SERVER, [_spec(name="native")])))
    with pytest.raises(McpServerError, match="clash.*tool_prefix"):
        env.reset(options={"task": {}})
    assert env._episode_open is False
    env.close()


def test_env_checks_its_declarations():
    Env = _env_class()
    with pytest.raises(TypeError, match="McpServer"):
        Env(mcp_servers=[{"command": "x"}])
    with pytest.raises(ValueError, match="labelled 'x'"):
        Env(mcp_servers=[McpServer(command="x"), McpServer(command="/bin/x", args=["-v"])])


def test_env_factory_shares_one_mcp_pool(monkeypatch):
    from agentrl.env import EnvFactory, registry
    from agentrl.tools.mcp import McpPool

    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))
    Env = _env_class()
    Env.mcp_servers = (McpServer(command="x", lifetime="run"),)
    registry.register_env("mcp-unit-v0", entry_point=Env)
    factory = EnvFactory("mcp-unit")
    one, two = factory(), factory.for_env("mcp-unit")()
    assert isinstance(one.mcp_pool, McpPool) and one.mcp_pool is two.mcp_pool is factory.mcp_pool
    assert not one._mcp.owns_pool and factory.make("calc").mcp_pool is None
    for env in (one, two):
        env.close()
    asyncio.run(factory.aclose())
    assert factory.mcp_pool is None
