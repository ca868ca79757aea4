"""``agentrl eval --policy openai`` against a small OpenAI-look-alike server written here: the
calc episode played with native tool calls, retries (429 with Retry-After, 5xx, timeouts,
refused connections), what is not retried (4xx, malformed replies), malformed tool-call
arguments, usage totals, and the flags' validation. The real-server test is in
tests/integration/test_vllm_backend.py."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from typing import Any

import pytest
from aiohttp import web

from agentrl.cli import build_parser
from agentrl.errors import ConfigError
from agentrl.eval.metrics import summarize
from agentrl.eval.openai_policy import (
    MAX_RETRY_AFTER_S,
    OpenAITurns,
    retry_after_s,
    server_message,
    to_openai_messages,
)
from agentrl.eval.runner import EvalSet, evaluate_sets
from agentrl.records.sample import Sample, Status
from agentrl.rollout.build import env_factory, scripted_context
from agentrl.rollout.config import RolloutConfig
from agentrl.run.evaluate import evaluate, format_table, parse_eval_config
from agentrl_envs.calc.env import CalcEnv

TASKS = CalcEnv().task_set("test", limit=2)
EXPRESSIONS = {task["question"]: task["expression"] for task in TASKS}
CALC_TOOLS = CalcEnv().toolbox.schemas

Respond = Callable[[dict[str, Any], int], Awaitable[web.StreamResponse]]


def completion(content: str | None = "", calls: list[tuple[str | None, Any]] = (), *,
               finish: str = "stop", usage: tuple[int, int] = (10, 3)) -> web.Response:
    """A chat completion; each call is (name, arguments), with ids call-0, call-1, ..."""
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if calls:
        message["tool_calls"] = [
            {"id": f"call-{i}", "type": "function",
             "function": {"arguments": arguments, **({"name": name} if name is not None else {})}}
            for i, (name, arguments) in enumerate(calls)]
    prompt, generated = usage
    return web.json_response({
        "id": "chatcmpl-1", "object": "chat.completion", "model": "tiny",
        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
        "usage": {"prompt_tokens": prompt, "completion_tokens": generated,
                  "total_tokens": prompt + generated}})


def error(status: int, message: str, headers: dict[str, str] | None = None) -> web.Response:
    return web.json_response({"error": {"message": message, "type": "error", "code": status}},
                             status=status, headers=headers)


async def solve(body: dict[str, Any], index: int) -> web.Response:
    """Calc's expert: the calculator on the task's expression, then its result as the answer."""
    last = body["messages"][-1]
    if last["role"] == "tool":
        return completion(f"The result is {last['content']}.\nAnswer: {last['content']}")
    expression = EXPRESSIONS[body["messages"][1]["content"]]
    return completion(None, [("calculator", json.dumps({"expression": expression}))],
                      finish="tool_calls")


class Server:
    """``POST /v1/chat/completions`` answered by ``respond(body, index)``; keeps every request's
    body, headers and arrival time."""

    def __init__(self, respond: Respond) -> None:
        self.respond = respond
        self.bodies: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        self.times: list[float] = []
        self.release = asyncio.Event()  # what a hanging reply waits for
        self.url = ""

    async def __aenter__(self) -> Server:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._handle)
        self.runner = web.AppRunner(app, handler_cancellation=True)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        host, port = self.runner.addresses[0][:2]
        self.url = f"http://{host}:{port}/v1"
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        self.release.set()
        await self.runner.cleanup()

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        self.times.append(time.perf_counter())
        self.headers.append(dict(request.headers))
        self.bodies.append(await request.json())
        return await self.respond(self.bodies[-1], len(self.bodies) - 1)

    async def hang(self, body: dict[str, Any], index: int) -> web.Response:
        await self.release.wait()
        return completion("late")


def command_line(url: str, *flags: str) -> list[str]:
    return ["eval", "--env", "calc", "--policy", "openai", "--base-url", url, "--model", "tiny",
            *flags]


async def run_cli(argv: list[str]) -> tuple[dict[str, Any], list[Sample]]:
    """``agentrl eval ARGV`` in this event loop: the summary and the samples of its one set."""
    rollout, evaluation = parse_eval_config(build_parser().parse_args(argv))
    summary, groups = await evaluate(rollout, evaluation)
    (set_groups,) = groups.values()
    return summary, [s for g in set_groups for s in g]


async def play(turns: OpenAITurns, limit: int = 1) -> tuple[dict[str, Any], list[Sample]]:
    """Calc's test tasks played by ``turns`` (built here, for retry waits shorter than the
    flags give), as ``agentrl eval`` plays them; closes ``turns``."""
    config = RolloutConfig(env="calc", eval_max_prompts=limit)
    envs = env_factory(config)
    try:
        ctx = scripted_context(config, turns, envs)
        (result,) = (await evaluate_sets(ctx, [EvalSet("calc", None, "calc")], "eval")).values()
    finally:
        await turns.close()
        await envs.aclose()
    metrics, groups = result
    return metrics, [s for g in groups for s in g]


def test_a_server_with_native_tool_calls_solves_calc(monkeypatch):
    monkeypatch.setenv("AGENTRL_TEST_KEY", "sk-test")

    async def scenario() -> None:
        async with Server(solve) as server:
            summary, samples = await run_cli(command_line(
                server.url, "--limit", "2", "--temperature", "0.5", "--rollout-top-p", "0.9",
                "--max-response-len", "32", "--api-key-env", "AGENTRL_TEST_KEY"))
        (metrics,) = summary["sets"].values()
        assert summary["policy"] == "openai:tiny"
        assert metrics["success_rate"] == 1.0 and metrics["statuses"] == {"completed": 2}
        assert metrics["tool_calls"] == 2 and metrics["tool_errors"] == {}
        assert metrics["mean_turns"] == 2.0
        assert metrics["usage"] == {"prompt_tokens": 40, "completion_tokens": 12,
                                    "total_tokens": 52}
        assert "tokens" in format_table("calc", summary["policy"], metrics)
        for sample in samples:
            assert sample.metadata["usage"] == {"prompt_tokens": 20, "completion_tokens": 6,
                                                "total_tokens": 26}
            first, second = sample.turns
            assert first.tool_names == ["calculator"] and second.tool_names == []
            assert all(t.role == "assistant" and t.finish_reason == "stop" and t.generate_s > 0
                       for t in sample.turns)
        assert len(server.bodies) == 4
        assert all(h["Authorization"] == "Bearer sk-test" for h in server.headers)
        for body in server.bodies:
            assert body["model"] == "tiny" and body["tools"] == CALC_TOOLS
            assert body["max_tokens"] == 32 and body["temperature"] == 0.5
            assert body["top_p"] == 0.9 and "stop" not in body
        answered = [b["messages"] for b in server.bodies if b["messages"][-1]["role"] == "tool"]
        assert len(answered) == 2
        for messages in answered:
            system, user, assistant, tool = messages
            assert system["role"] == "system" and user == {"role": "user",
                                                           "content": user["content"]}
            expression = EXPRESSIONS[user["content"]]
            assert assistant == {"role": "assistant", "content": "", "tool_calls": [
                {"id": "call-0", "type": "function", "function": {
                    "name": "calculator", "arguments": json.dumps({"expression": expression})}}]}
            answer = next(t["answer"] for t in TASKS if t["expression"] == expression)
            assert tool == {"role": "tool", "tool_call_id": "call-0", "content": str(answer)}

    asyncio.run(scenario())


def test_no_api_key_sends_no_authorization(monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)

    async def scenario() -> None:
        async with Server(solve) as server:
            summary, _ = await run_cli(command_line(server.url, "--limit", "1"))
        assert summary["sets"]["calc"]["success_rate"] == 1.0
        assert server.headers and not any("Authorization" in h for h in server.headers)

    asyncio.run(scenario())


def test_429_is_retried_after_the_servers_retry_after():
    async def respond(body: dict[str, Any], index: int) -> web.Response:
        if index == 0:
            return error(429, "rate limited", {"Retry-After": "0.3"})
        return await solve(body, index)

    async def scenario() -> None:
        async with Server(respond) as server:
            summary, (sample,) = await run_cli(command_line(server.url, "--limit", "1"))
        assert sample.status is Status.COMPLETED and sample.reward == 1.0
        assert len(server.bodies) == 3 and server.bodies[0] == server.bodies[1]
        assert server.times[1] - server.times[0] >= 0.3
        assert sample.turns[0].generate_s >= 0.3  # the wait is the policy's time

    asyncio.run(scenario())


def test_5xx_is_retried_then_fails_the_episode_with_the_servers_reason():
    async def respond(body: dict[str, Any], index: int) -> web.Response:
        return error(500, "engine crashed\nat step 3")

    async def scenario() -> None:
        async with Server(respond) as server:
            metrics, (sample,) = await play(OpenAITurns(server.url, "tiny", max_retries=2,
                                                        backoff_s=0.01))
        assert len(server.bodies) == 3
        assert sample.status is Status.FAILED and metrics["failed"] == 1
        reason = sample.metadata["error"]
        assert reason.startswith(f"PolicyServerError: POST {server.url}/chat/completions: "
                                 "HTTP 500 Internal Server Error: engine crashed at step 3")
        assert "gave up after 2 retries" in reason
        assert list(metrics["errors"]) == [reason]  # one line: the summary shows all of it

    asyncio.run(scenario())


def test_a_4xx_is_not_retried():
    async def respond(body: dict[str, Any], index: int) -> web.Response:
        return error(400, "The model `tiny` does not exist.")

    async def scenario() -> None:
        async with Server(respond) as server:
            _, (sample,) = await play(OpenAITurns(server.url, "tiny", max_retries=3,
                                                  backoff_s=0.01))
        assert len(server.bodies) == 1 and sample.status is Status.FAILED
        reason = sample.metadata["error"]
        assert "HTTP 400 Bad Request: The model `tiny` does not exist." in reason
        assert "not retried" in reason

    asyncio.run(scenario())


def test_a_401_without_a_key_says_how_to_send_one():
    async def respond(body: dict[str, Any], index: int) -> web.Response:
        return error(401, "Incorrect API key provided")

    async def scenario() -> None:
        async with Server(respond) as server:
            _, (sample,) = await play(OpenAITurns(server.url, "tiny"))
        assert "HTTP 401" in sample.metadata["error"] and "--api-key-env" in sample.metadata["error"]

    asyncio.run(scenario())


def test_the_per_request_timeout_fires_and_is_retried():
    async def scenario() -> None:
        server = Server(solve)
        server.respond = server.hang
        async with server:
            started = time.perf_counter()
            _, (sample,) = await play(OpenAITurns(server.url, "tiny", request_timeout=0.2,
                                                  max_retries=1, backoff_s=0.01))
            elapsed = time.perf_counter() - started
        assert len(server.bodies) == 2 and sample.status is Status.FAILED
        assert "no reply within 0.2 s (--request-timeout)" in sample.metadata["error"]
        assert "gave up after 1 retries" in sample.metadata["error"]
        assert elapsed >= 0.4  # two 0.2 s timeouts; the default (120 s) would hang the test

    asyncio.run(scenario())


def test_a_refused_connection_is_retried_then_named():
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    url = f"http://127.0.0.1:{port}/v1"
    _, (sample,) = asyncio.run(play(OpenAITurns(url, "tiny", max_retries=1, backoff_s=0.01)))
    reason = sample.metadata["error"]
    assert sample.status is Status.FAILED
    assert f"POST {url}/chat/completions: cannot reach the server" in reason
    assert "gave up after 1 retries" in reason


@pytest.mark.parametrize("body", ["not json", "[1, 2]", json.dumps({"choices": []}),
                                  json.dumps({"choices": [{"message": "hi"}]})])
def test_a_reply_that_is_not_a_chat_completion_fails_unretried(body):
    async def respond(request_body: dict[str, Any], index: int) -> web.Response:
        return web.Response(text=body, content_type="application/json")

    async def scenario() -> None:
        async with Server(respond) as server:
            _, (sample,) = await play(OpenAITurns(server.url, "tiny", backoff_s=0.01))
        assert len(server.bodies) == 1 and sample.status is Status.FAILED
        assert sample.metadata["error"].startswith("PolicyServerError: ")

    asyncio.run(scenario())


def test_malformed_tool_call_arguments_become_tool_errors_not_crashes():
    """Arguments that are not JSON, and a call without a name: the env answers both with tool
    errors; the model's next turn sees them, each paired with its call's id."""
    async def respond(body: dict[str, Any], index: int) -> web.Response:
        if body["messages"][-1]["role"] != "tool":
            return completion(None, [("calculator", '{"expression": "1+'), (None, "{}")])
        return completion("Answer: 0")

    async def scenario() -> None:
        async with Server(respond) as server:
            metrics, (sample,) = await play(OpenAITurns(server.url, "tiny"))
        assert sample.status is Status.COMPLETED and metrics["failed"] == 0
        assert sample.metadata["tool_errors"] == {"malformed_arguments": 2}
        *_, assistant, bad_json, no_name = server.bodies[1]["messages"]
        assert [c["id"] for c in assistant["tool_calls"]] == ["call-0", "call-1"]
        assert assistant["tool_calls"][0]["function"]["arguments"] == '{"expression": "1+'
        assert bad_json["tool_call_id"] == "call-0" and no_name["tool_call_id"] == "call-1"
        assert bad_json["content"].startswith("Error (malformed_arguments): ")
        assert no_name["content"].startswith("Error (malformed_arguments): ")

    asyncio.run(scenario())


def test_a_reply_cut_at_max_tokens_truncates_the_episode():
    async def respond(body: dict[str, Any], index: int) -> web.Response:
        return completion("Let me th", finish="length", usage=(7, 16))

    async def scenario() -> None:
        async with Server(respond) as server:
            metrics, (sample,) = await play(OpenAITurns(server.url, "tiny", max_tokens=16))
        assert sample.status is Status.TRUNCATED and sample.metadata["finish"] == "length"
        assert sample.metadata["messages"][-1] == {"role": "assistant", "content": "Let me th"}
        assert [t.finish_reason for t in sample.turns] == ["length"]
        assert metrics["usage"] == {"prompt_tokens": 7, "completion_tokens": 16,
                                    "total_tokens": 23}
        assert server.bodies[0]["max_tokens"] == 16

    asyncio.run(scenario())


def test_retry_after_forms():
    soon = format_datetime(datetime.now(UTC) + timedelta(seconds=30), usegmt=True)
    assert retry_after_s({"Retry-After": "2"}) == 2.0
    assert retry_after_s({"retry-after": "0.25"}) == 0.25
    assert retry_after_s({"retry-after-ms": "150", "Retry-After": "9"}) == 0.15
    assert 25 < retry_after_s({"Retry-After": soon}) <= 30
    assert retry_after_s({"Retry-After": "3600"}) == MAX_RETRY_AFTER_S
    assert retry_after_s({"Retry-After": "-5"}) == 0.0
    assert retry_after_s({"Retry-After": "soon"}) is None and retry_after_s({}) is None


def test_server_messages_of_common_error_bodies():
    assert server_message('{"error": {"message": "bad\\nthing"}}') == "bad thing"
    assert server_message('{"object": "error", "message": "too long"}') == "too long"
    assert server_message('{"detail": "Not Found"}') == "Not Found"
    assert server_message('{"error": "overloaded"}') == "overloaded"
    assert server_message("<html>502 Bad Gateway</html>") == "<html>502 Bad Gateway</html>"
    assert server_message("") == "(empty body)"


def test_foreign_assistant_turns_get_ids_and_every_tool_message_answers_a_call():
    """Assistant messages this policy did not write (a few-shot prompt) are converted; a tool
    message beyond the calls listed (the env's reply to one it could not read) gets a call."""
    messages = [
        {"role": "user", "content": "2+2?", "name": "alice"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"name": "calculator", "arguments": {"expression": "2+2"}}]},
        {"role": "tool", "name": "calculator", "content": "4"},
        {"role": "tool", "name": "(malformed)", "content": "Error (malformed_arguments): ..."},
        {"role": "assistant", "content": "Answer: 4"},
    ]
    user, assistant, first, second, final = to_openai_messages(messages)
    assert user == {"role": "user", "content": "2+2?", "name": "alice"}
    assert assistant["tool_calls"] == [
        {"id": "call_1_0", "type": "function",
         "function": {"name": "calculator", "arguments": '{"expression": "2+2"}'}},
        {"id": "call_3", "type": "function", "function": {"name": "(malformed)", "arguments": "{}"}}]
    assert first["tool_call_id"] == "call_1_0" and second["tool_call_id"] == "call_3"
    assert final == {"role": "assistant", "content": "Answer: 4"}
    assert "tool_calls" in messages[1] and len(messages[1]["tool_calls"]) == 1  # not changed


@pytest.mark.parametrize(("flags", "match"), [
    (["--policy", "openai", "--model", "m"], "--policy openai needs --base-url"),
    (["--policy", "openai", "--base-url", "http://127.0.0.1:8000/v1"], "needs --model"),
    (["--policy", "openai", "--base-url", "127.0.0.1:8000/v1", "--model", "m"],
     "--base-url must be an http:// or https:// URL"),
    (["--policy", "openai", "--base-url", "ftp://host/v1", "--model", "m"], "--base-url must be"),
    (["--request-timeout", "0"], "--request-timeout must be > 0"),
    (["--max-retries", "-1"], "--max-retries must be >= 0"),
])
def test_flag_validation(flags, match):
    with pytest.raises(ConfigError, match=match):
        parse_eval_config(build_parser().parse_args(["eval", "--env", "calc", *flags]))


def test_summaries_without_usage_have_no_usage_key_nor_row():
    sample = Sample(group_id=0, index=0, reward=1.0, status=Status.COMPLETED)
    metrics = {**summarize([[sample]]), "wall_s": 0.0, "skipped_rows": 0}
    assert "usage" not in metrics and "tokens" not in format_table("calc", "oracle", metrics)
    sample.metadata["usage"] = {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}
    metrics = {**summarize([[sample]]), "wall_s": 0.0, "skipped_rows": 0}
    assert metrics["usage"]["total_tokens"] == 0
    assert "tokens" not in format_table("calc", "openai:m", metrics)
