"""The gateway's HTTP API, driven by the real ``openai`` SDK (sync, async, streaming, parallel
tool calls) and by raw requests for every kind of bad input.

The engine is scripted (tests.support.engines.ScriptedEngine) so that the model writes real
tool calls; the gateway runs on its own event loop in a thread, as it does beside an agent.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
import urllib.error
import urllib.request

import openai
import pytest

from agentrl.gateway import Gateway
from agentrl.gateway.server import default_sampling, renderer_for
from agentrl.records.sample import Sample
from tests.support.engines import ScriptedEngine
from tests.support.tokenizers import tiny_tokenizer

pytestmark = pytest.mark.unit

MODEL = "agentrl-policy"
TOOLS = [{"type": "function", "function": {
    "name": "calculator", "description": "Evaluates arithmetic.",
    "parameters": {"type": "object", "properties": {"expression": {"type": "string"}},
                   "required": ["expression"]}}}]
TWO_CALLS = ('Two sums.\n<tool_call>\n{"name": "calculator", "arguments": {"expression": "6*7"}}\n'
             '</tool_call>\n<tool_call>\n{"name": "calculator", "arguments": {"expression": "1+1"}}'
             '\n</tool_call>')


def policy(text: str, rid: str) -> str:
    if "broken please" in text:
        return '<tool_call>\n{"name": "calculator", "arguments": {oops\n</tool_call>'
    if "slow please" in text:
        return "x " * 50
    if "tool_response" in text.rpartition("<|im_start|>user")[2]:
        return "Answer: 42"
    return TWO_CALLS


class LiveGateway:
    """A gateway on a scripted engine, served from a thread with its own event loop."""

    def __init__(self) -> None:
        self.engine = ScriptedEngine(tiny_tokenizer(), policy,
                                     delay_s=lambda rid: 0.0)
        self.renderer = renderer_for(self.engine, "hermes")
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.gateway = Gateway(self.engine, self.renderer, default_sampling(self.renderer, 128), 1024)
        self.url = self.call(self.gateway.start())

    def call(self, coroutine):
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(30)

    def session(self, rid: str):
        return self.call(_open(self.gateway, rid))

    def stop(self) -> None:
        self.call(self.gateway.stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


async def _open(gateway: Gateway, rid: str):
    return gateway.open_session(rid, client_sampling=True)


@pytest.fixture(scope="module")
def live():
    gateway = LiveGateway()
    yield gateway
    gateway.stop()


def _post(url: str, body: bytes, key: str | None = None) -> tuple[int, dict]:
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    request = urllib.request.Request(url, data=body, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_sync_client_parallel_tool_calls_then_answer_is_one_sample(live):
    session = live.session("r0-g0-s0")
    client = openai.OpenAI(base_url=live.gateway.base_url(session), api_key="unused")
    messages = [{"role": "user", "content": "What are 6*7 and 1+1?"}]
    first = client.chat.completions.create(model=MODEL, messages=messages, tools=TOOLS,
                                           logprobs=True)
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content == "Two sums."
    calls = choice.message.tool_calls
    assert [(c.function.name, json.loads(c.function.arguments)) for c in calls] == [
        ("calculator", {"expression": "6*7"}), ("calculator", {"expression": "1+1"})]
    assert len({c.id for c in calls}) == 2 and first.usage.completion_tokens > 0
    assert [t.logprob for t in choice.logprobs.content] == session.calls[0].choices[0]["output_logprobs"]
    messages.append(choice.message.model_dump(exclude_none=True))
    messages += [{"role": "tool", "tool_call_id": c.id, "content": v} for c, v in zip(calls, ["42", "2"], strict=True)]
    second = client.chat.completions.create(model=MODEL, messages=messages, tools=TOOLS)
    assert second.choices[0].message.content == "Answer: 42"
    assert [c.how for c in session.calls] == ["start", "extends"]
    [sample] = session.samples(Sample(group_id=0))
    sample.check()
    sampled = [t for t, m in zip(sample.tokens[sample.prompt_length:], sample.loss_mask, strict=True) if m]
    assert sampled == [t for c in session.calls for t in c.choices[0]["output_ids"]]


def test_async_streaming_client_gets_text_and_tool_calls(live):
    session = live.session("r0-g0-s1")

    async def play():
        client = openai.AsyncOpenAI(base_url=live.gateway.base_url(session), api_key="x")
        stream = await client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "sums?"}], tools=TOOLS,
            stream=True, stream_options={"include_usage": True})
        content, calls, finish, usage = "", {}, None, None
        async for chunk in stream:
            if chunk.usage is not None:
                usage = chunk.usage
            for c in chunk.choices:
                content += c.delta.content or ""
                for call in c.delta.tool_calls or ():
                    calls.setdefault(call.index, [call.function.name, ""])[1] += call.function.arguments or ""
                finish = c.finish_reason or finish
        await client.close()
        return content, calls, finish, usage

    content, calls, finish, usage = asyncio.run(play())
    assert content == "Two sums." and finish == "tool_calls" and usage.completion_tokens > 0
    assert [(name, json.loads(args)) for name, args in calls.values()] == [
        ("calculator", {"expression": "6*7"}), ("calculator", {"expression": "1+1"})]


def test_parallel_tool_calls_false_keeps_the_first_and_n_gives_choices(live):
    session = live.session("r0-g0-s2")
    client = openai.OpenAI(base_url=live.gateway.base_url(session), api_key="x")
    out = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "q"}],
                                         tools=TOOLS, parallel_tool_calls=False, n=3)
    assert len(out.choices) == 3
    assert all(len(c.message.tool_calls) == 1 for c in out.choices)
    assert len(session.calls[0].choices) == 3


def test_malformed_tool_call_comes_back_as_content(live):
    session = live.session("r0-g0-s3")
    client = openai.OpenAI(base_url=live.gateway.base_url(session), api_key="x")
    out = client.chat.completions.create(model=MODEL, tools=TOOLS,
                                         messages=[{"role": "user", "content": "broken please"}])
    assert out.choices[0].message.tool_calls is None
    assert out.choices[0].message.content.startswith("<tool_call>")


def test_completions_and_models_and_bearer_key(live):
    session = live.session("r0-g0-s4")
    client = openai.OpenAI(base_url=f"{live.url}/v1", api_key=session.key)
    assert [m.id for m in client.models.list()] == [MODEL]
    out = client.completions.create(model=MODEL, prompt="<|im_start|>user\nhi<|im_end|>\n"
                                    "<|im_start|>assistant\n", max_tokens=64, stop=["+"])
    assert out.choices[0].text == TWO_CALLS.split("+")[0] and out.choices[0].finish_reason == "stop"
    assert session.last_assistant_text == out.choices[0].text  # what a grader reads


@pytest.mark.parametrize(("body", "status", "code", "param"), [
    (b"{not json", 400, "invalid_json", None),
    (json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "x"}],
                 "temperatur": 0.5}).encode(), 400, "unknown_field", "temperatur"),
    (json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "x"}],
                 "n": 17}).encode(), 400, None, "n"),
    (json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "x " * 2000}]}).encode(),
     400, "context_length_exceeded", "messages"),
    (json.dumps({"model": "gpt-9", "messages": [{"role": "user", "content": "x"}]}).encode(),
     404, "model_not_found", "model"),
    (json.dumps({"model": MODEL, "messages": []}).encode(), 400, None, "messages"),
])
def test_bad_requests_get_openai_errors_and_leave_the_session_clean(live, body, status, code, param):
    session = live.session("r0-g1-s0")
    got, error = _post(live.gateway.base_url(session) + "/chat/completions", body)
    assert got == status and set(error["error"]) == {"message", "type", "param", "code"}
    assert error["error"]["code"] == code and error["error"]["param"] == param
    assert session.calls == [] and session.segments == []
    client = openai.OpenAI(base_url=live.gateway.base_url(session), api_key="x")
    client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "q"}])
    assert [c.how for c in session.calls] == ["start"]


def test_an_unknown_session_key_is_a_401(live):
    status, error = _post(f"{live.url}/v1/chat/completions", json.dumps(
        {"model": MODEL, "messages": [{"role": "user", "content": "x"}]}).encode(), key="nope")
    assert status == 401 and error["error"]["code"] == "invalid_api_key"
    status, error = _post(f"{live.url}/s/nope/v1/chat/completions", b"{}")
    assert status == 401
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=f"{live.url}/v1", api_key="nope").chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "x"}])


def test_a_client_that_disconnects_mid_stream_is_cleaned_up(live):
    live.engine.delay_s = lambda rid: 30.0 if rid.startswith("r0-g2") else 0.0
    session = live.session("r0-g2-s0")
    host, port = live.url.removeprefix("http://").split(":")
    body = json.dumps({"model": MODEL, "stream": True,
                       "messages": [{"role": "user", "content": "slow please"}]}).encode()
    path = f"/s/{session.key}/v1/chat/completions"
    with socket.create_connection((host, int(port)), timeout=10) as raw:
        raw.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                    f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
        assert b"text/event-stream" in raw.recv(4096)  # the stream started; now hang up
    deadline = time.monotonic() + 10
    while live.engine._inflight and time.monotonic() < deadline:  # the generation was aborted
        time.sleep(0.05)
    assert not live.engine._inflight
    assert session.calls == [] and session.segments == []  # nothing of it was recorded
    live.engine.delay_s = lambda rid: 0.0
    client = openai.OpenAI(base_url=live.gateway.base_url(session), api_key="x")
    out = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "q"}])
    assert out.choices[0].message.content and [c.how for c in session.calls] == ["start"]


def test_a_closed_session_refuses_requests(live):
    session = live.session("r0-g3-s0")
    live.call(live.gateway.close_session(session))
    status, error = _post(live.gateway.base_url(session) + "/chat/completions", json.dumps(
        {"model": MODEL, "messages": [{"role": "user", "content": "x"}]}).encode())
    assert status == 401


def test_the_rollouts_stop_ends_a_session_mid_call():
    """When the rollout has enough groups it sets its stop flag and aborts what runs: a
    session's call in flight then ends the session (stopped), instead of resuming the turn."""
    import threading

    from agentrl.gateway.protocol import parse_chat_request
    from agentrl.gateway.session import Session, SessionClosed

    engine = ScriptedEngine(tiny_tokenizer(), policy, delay_s=5.0)
    renderer = renderer_for(engine, "hermes")
    stopping = threading.Event()
    session = Session("k", engine, renderer, default_sampling(renderer), 1024, rid="r1-g0-s0",
                      stopping=stopping)
    request = parse_chat_request({"model": MODEL, "messages": [{"role": "user", "content": "q"}]})

    async def play():
        call = asyncio.create_task(session.chat(request))
        await asyncio.sleep(0.2)
        stopping.set()
        await engine.abort("r1-")
        with pytest.raises(SessionClosed):
            await call

    asyncio.run(play())
    assert session.stopped and session.calls == [] and session.segments == []
