"""MCP servers as env tools, with real servers: our SDK-based test server (stdio and streamable
HTTP), and the reference ``mcp-server-time`` and ``mcp-server-git`` (in the episode's sandbox).

Server starts cost seconds here, so servers are shared where a test allows it
(``lifetime="run"`` in a module fixture).
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from agentrl import SandboxedToolEnv, check_env
from agentrl.errors import EnvCheckError, McpServerError
from agentrl.sandbox import _procs
from agentrl.tools.mcp import McpServer, list_mcp_tools
from tests.support.mcp_envs import (
    SERVER,
    SITE_PACKAGES,
    GitEnv,
    McpTestEnv,
    call,
    missing,
    sdk_server,
    system_python_reason,
)
from tests.support.sandboxes import backend_skip_reason

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(bool(missing("mcp")), reason=missing("mcp") or ""),
]
REPO = Path(__file__).resolve().parents[2]
SERVER_TOOLS = ["echo", "add", "structured", "counter", "pid", "calls", "fail", "protocol_error",
                "crash", "sleep", "picture", "resource", "cwd"]


def _gone(pid: int, timeout: float = 30.0) -> bool:
    """Waits until process ``pid`` no longer runs (gone or a zombie)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    return True
        except OSError:
            return True
        time.sleep(0.05)
    return False


def _with_marker(marker: str) -> list[int]:
    """Pids of processes whose command line contains ``marker``."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if marker.encode() in f.read():
                    found.append(int(pid))
        except OSError:
            continue
    return found


# --- A: one shared server (two declarations) for many checks ---------------------------------


@pytest.fixture(scope="module")
def shared_env():
    env = McpTestEnv(mcp_servers=[
        sdk_server(lifetime="run"),
        sdk_server(name="slow", lifetime="run", timeout=0.5, tool_prefix="slow_",
                   tools=["sleep", "echo"]),
    ])
    env.reset(seed=0)
    yield env
    env.close()


def test_tools_and_schemas_in_info(shared_env):
    _, info = shared_env.reset(seed=1)
    names = [s["function"]["name"] for s in info["tools"]]
    assert names == [*SERVER_TOOLS, "slow_echo", "slow_sleep"]  # listing order
    echo = info["tools"][0]["function"]
    assert echo["parameters"]["required"] == ["text"]
    assert echo["description"] == "Returns text repeated `times` times."
    assert shared_env.toolbox.names == names
    assert [s["name"] for s in shared_env.mcp_status()] == ["test", "slow"]
    assert shared_env.mcp_status()[0]["server_info"] == "agentrl-test 0.1"


def test_text_structured_image_resource(shared_env):
    shared_env.reset(seed=1)
    assert call(shared_env, "echo", {"text": "hi", "times": 2})[:2] == ("hihi", {})
    assert call(shared_env, "add", {"a": 2, "b": 3})[0] == "5"
    assert call(shared_env, "structured", {})[0] == '{"k": 1}'
    assert call(shared_env, "picture", {})[0] == "[image: image/png, 67 bytes]"
    assert call(shared_env, "resource", {})[0] == "[resource: file:///notes.txt]\nhello"


def test_schema_violation_is_a_message_not_a_call(shared_env):
    shared_env.reset(seed=1)
    before = int(call(shared_env, "calls", {})[0])
    text, errors, terminated = call(shared_env, "echo", {"text": 5})
    assert text.startswith("Error (schema_violation): invalid arguments for 'echo' at $.text")
    assert errors == {"schema_violation": 1} and not terminated
    after = int(call(shared_env, "calls", {})[0])
    assert after - before == 1  # only the second `calls` reached the server


def test_is_error_result(shared_env):
    shared_env.reset(seed=1)
    text, errors, terminated = call(shared_env, "fail", {"message": "no such file"})
    assert text == "Error (tool_error): Error executing tool fail: no such file"
    assert errors == {"tool_error": 1} and not terminated


def test_protocol_error(shared_env):
    shared_env.reset(seed=1)
    text, errors, _ = call(shared_env, "protocol_error", {})
    assert text == "Error (tool_error): the MCP server 'test' rejected the call: bad thing (JSON-RPC error -32602)"
    assert errors == {"tool_error": 1}
    assert call(shared_env, "echo", {"text": "still here"})[:2] == ("still here", {})


def test_call_timeout(shared_env):
    shared_env.reset(seed=1)
    text, errors, _ = call(shared_env, "slow_sleep", {"seconds": 30})
    assert text == "Error (timeout): tool 'slow_sleep' timed out after 0.5 s"
    assert errors == {"timeout": 1}
    assert call(shared_env, "slow_echo", {"text": "after"})[:2] == ("after", {})


def test_shared_state_and_pid_across_episodes(shared_env):
    shared_env.reset(seed=1)
    first, pid = int(call(shared_env, "counter", {})[0]), call(shared_env, "pid", {})[0]
    shared_env.reset(seed=2)
    assert int(call(shared_env, "counter", {})[0]) == first + 1
    assert call(shared_env, "pid", {})[0] == pid
    assert len(shared_env.mcp_pool.connections()) == 2


# --- B, C: per-episode servers, crashes -----------------------------------------------------


def _crash_and_check(env) -> None:
    text, errors, terminated = call(env, "crash", {})
    assert text.startswith("Error (tool_error): the MCP server 'test' stopped during the call")
    assert "restarts with the next one" in text
    assert errors == {"tool_error": 1} and terminated is False
    text, errors, _ = call(env, "echo", {"text": "x"})
    assert text.startswith("Error (tool_error): the MCP server 'test' is not running")
    assert errors == {"tool_error": 1}


def test_crash_of_a_shared_server_restarts_it(shared_env):
    shared_env.reset(seed=1)
    before = call(shared_env, "pid", {})[0]
    _crash_and_check(shared_env)
    assert call(shared_env, "slow_echo", {"text": "other server"})[0] == "other server"
    shared_env.reset(seed=1)
    assert call(shared_env, "pid", {})[0] != before
    assert call(shared_env, "echo", {"text": "back"})[:2] == ("back", {})
    assert all(c.alive for c in shared_env.mcp_pool.connections())
    assert len(shared_env.mcp_pool.connections()) == 2


def test_episode_lifetime_isolates_restarts_and_closes():
    env = McpTestEnv(mcp_servers=[sdk_server()])
    try:
        env.reset(seed=0)
        assert call(env, "counter", {})[0] == "1"
        first = int(call(env, "pid", {})[0])
        _crash_and_check(env)
        env.reset(seed=0)
        assert call(env, "counter", {})[0] == "1"  # a fresh server: no state carried over
        second = int(call(env, "pid", {})[0])
        assert first != second
        assert call(env, "echo", {"text": "back"})[:2] == ("back", {})
        assert _gone(first), "the first episode's server still runs"
    finally:
        env.close()
    assert _gone(second), "the server still runs after close()"
    assert env.mcp_pool.connections() == [] and env.mcp_status() == []


# --- D: servers that do not start -----------------------------------------------------------


def test_start_failures_are_env_errors():
    cases = [
        (McpServer(command="/nonexistent/agentrl-mcp", name="ghost"), "ghost"),
        (McpServer(command=sys.executable, name="boom",
                   args=["-c", "import sys; sys.stderr.write('boom'); sys.exit(2)"]), "boom"),
    ]
    for server, text in cases:
        env = McpTestEnv(mcp_servers=[server])
        with pytest.raises(McpServerError, match=text) as failure:
            env.reset(seed=0)
        assert server.target.split()[0] in str(failure.value)
        assert env._episode_open is False
        env.close()

    # One server that never answers, next to one that starts: both are gone after the failure.
    marker = f"agentrl-mcp-{uuid.uuid4().hex}"
    hanging = McpServer(command=sys.executable, name="hang", startup_timeout=1,
                        args=["-c", "import time; time.sleep(60)", marker])
    env = McpTestEnv(mcp_servers=[sdk_server(extra_args=[marker]), hanging])
    with pytest.raises(McpServerError, match="'hang'.*within 1 s"):
        env.reset(seed=0)
    assert env._episode_open is False
    env.close()
    deadline = time.monotonic() + 30
    while _with_marker(marker) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _with_marker(marker) == [], "a server of the failed start still runs"


def test_sandboxed_start_failure_releases_the_sandbox():
    class Broken(McpTestEnv, SandboxedToolEnv):
        mcp_servers = (McpServer(command="/nonexistent/agentrl-mcp", name="ghost", sandbox=True),)

    env = Broken(sandbox="process")
    with pytest.raises(McpServerError, match="ghost") as failure:
        env.reset(seed=0)
    assert "not found" in str(failure.value)  # the sandbox's shell said so on stderr
    assert env._episode_open is False and env.sandbox is None
    assert env._pool is not None and env._pool.stats["in_use"] == 0
    env.close()

    no_sandbox = McpTestEnv(mcp_servers=[McpServer(command="cat", sandbox=True)])
    with pytest.raises(McpServerError, match="use a SandboxedToolEnv"):
        no_sandbox.reset(seed=0)
    no_sandbox.close()


# --- E: streamable HTTP ---------------------------------------------------------------------


@pytest.fixture
def http_server():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, SERVER, "--http", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close()
            break
        except OSError:
            if proc.poll() is not None:
                pytest.fail(f"the HTTP test server exited with {proc.returncode}")
            time.sleep(0.1)
    else:
        proc.kill()
        pytest.fail("the HTTP test server did not listen within 60 s")
    yield proc, f"http://127.0.0.1:{port}/mcp"
    proc.kill()
    proc.wait()


def test_streamable_http(http_server):
    proc, url = http_server
    listed = asyncio.run(list_mcp_tools(McpServer(url=url)))
    assert [t.name for t in listed] == SERVER_TOOLS and listed[0].remote_name == "echo"
    env = McpTestEnv(mcp_servers=[McpServer(url=url, lifetime="run", name="web")])
    try:
        _, info = env.reset(seed=0)
        assert [s["function"]["name"] for s in info["tools"]] == SERVER_TOOLS
        assert call(env, "echo", {"text": "over http"})[:2] == ("over http", {})
        assert call(env, "fail", {"message": "x"})[1] == {"tool_error": 1}
        proc.kill()
        proc.wait()
        text, errors, terminated = call(env, "echo", {"text": "anyone?"})
        assert text.startswith("Error (tool_error): the MCP server 'web' stopped during the call")
        assert errors == {"tool_error": 1} and not terminated
        text, errors, _ = call(env, "echo", {"text": "still?"})  # no stray cancellation
        assert text.startswith("Error (tool_error): the MCP server 'web' is not running")
        with pytest.raises(McpServerError, match="'web'"):
            env.reset(seed=0)  # the server stays down: restarting it fails the reset
    finally:
        env.close()


# --- F, H: the reference time server, and check_env -----------------------------------------


def _time_env_class(monkeypatch):
    """The example's env class (its module registers an id: into a copy of the registry)."""
    from agentrl.env import registry

    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))
    spec = importlib.util.spec_from_file_location("mcp_time_env", REPO / "examples" / "mcp_time_env.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.TimeEnv


@pytest.mark.skipif(bool(missing("mcp_server_time")), reason=missing("mcp_server_time") or "")
def test_mcp_server_time_and_check_env(monkeypatch):
    env = _time_env_class(monkeypatch)(max_turns=6)
    _, info = env.reset(seed=0)
    assert {s["function"]["name"] for s in info["tools"]} == {"get_current_time", "convert_time"}
    text, errors, _ = call(env, "get_current_time", {"timezone": "UTC"})
    assert errors == {} and json.loads(text)["timezone"] == "UTC"
    text, errors, _ = call(env, "get_current_time", {"timezone": "Mars/Base"})
    assert text.startswith("Error (tool_error): ") and "Invalid timezone" in text
    text, errors, _ = call(env, "get_current_time", {})
    assert text.startswith("Error (schema_violation): ") and "'timezone' is a required property" in text
    text, errors, _ = call(env, "convert_time", {"source_timezone": "UTC", "time": "12:00",
                                                  "target_timezone": "Asia/Tokyo"})
    assert errors == {} and "21:00" in json.loads(text)["target"]["datetime"]
    check_env(env, oracle_episodes=2)  # the same run-lifetime server: no new start
    assert env.mcp_pool.connections() == [] and env.mcp_info[0]["server_info"].startswith("mcp-time ")


def test_check_env_reports_a_bad_schema():
    env = McpTestEnv(mcp_servers=[sdk_server(name="bad", extra_args=["--bad-schema"])])
    with pytest.raises(EnvCheckError) as failure:
        check_env(env)
    message = str(failure.value)
    assert "'reset' failed" in message and "invalid JSON schema" in message
    assert "'bad'" in message and "'broken'" in message
    env.close()


# --- G: the reference git server in the episode's sandbox -----------------------------------


def _git_skip(backend: str) -> str | None:
    return backend_skip_reason(backend) or missing("mcp_server_git") or system_python_reason()


@pytest.mark.parametrize("backend", [
    pytest.param(b, marks=pytest.mark.skipif(bool(_git_skip(b)), reason=_git_skip(b) or ""))
    for b in ("process", "bwrap")
])
def test_mcp_server_git_in_sandbox(backend):
    env = GitEnv(sandbox=backend, sandbox_options={"ro_binds": [SITE_PACKAGES]})
    try:
        env.reset(seed=0)
        sandbox = env.sandbox
        text, errors, _ = call(env, "git_status", {"repo_path": "."})
        assert errors == {} and "notes.txt" in text and "Untracked" in text
        assert call(env, "git_add", {"repo_path": ".", "files": ["notes.txt"]})[1] == {}
        assert call(env, "git_commit", {"repo_path": ".", "message": "add notes"})[1] == {}
        log = env._run_sync(sandbox.exec("git log -1 --format=%s"))
        assert log.stdout.strip() == "add notes"  # the server worked in the episode's workspace
        text, errors, _ = call(env, "git_status", {"repo_path": "/etc"})
        assert errors == {"tool_error": 1} and "outside the allowed repository" in text
        env.step("done")  # the final answer ends the episode: server stopped, sandbox released
        assert env.mcp_status() == [] and env.sandbox is None and sandbox.closed
        assert env._pool is not None and env._pool.stats["in_use"] == 0
        if _procs.IS_ROOT:  # the server ran as the sandbox's own uid: nothing of it is left
            assert [p for p in os.listdir("/proc") if p.isdigit() and _procs.owner_uid(p) == sandbox.uid] == []
    finally:
        env.close()
