"""The gateway's cost: a chat call through it against the same generate called on the engine.

16 concurrent sessions on the built-in tiny model, each a 3-call conversation (each call extends
the previous one: the usual agent case, where the gateway appends the template delta to the
recorded tokens). The agent side is a plain HTTP client (aiohttp), and, reported apart, the
real ``openai`` SDK (``AsyncOpenAI``), whose own request building and response parsing run on
the same interpreter as the engine and cost more than the gateway does. The baseline makes the very same engine requests (the prompt ids the gateway sent, the same sampling) directly
on the engine, 16 at a time. Both sides generate a fixed 32 tokens a call (``ignore_eos``), so they
do the same engine work; rounds alternate between the two to spread the machine's noise.

* ``gateway_overhead_ratio``: median per-call latency through the gateway (plain HTTP client) /
  directly (target <= 1.2); ``gateway_overhead_ratio_openai_sdk``: the same with the SDK;
* ``gateway_requests_per_s``: chat calls per second through the gateway at 16 sessions.

    python bench/gateway.py [--rounds 4] [--sessions 16]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time

import aiohttp
import openai

from agentrl.chat import ChatRenderer
from agentrl.engine import EmbeddedEngine, SamplingParams
from agentrl.gateway import Gateway
from agentrl.models import build_tiny_model

CALLS = 3
NEW_TOKENS = 32


async def through_gateway(gateway: Gateway, client: openai.AsyncOpenAI | aiohttp.ClientSession,
                          sessions: int, round_: int) -> tuple[list[float], list[list[int]], float]:
    """Plays the conversations through the gateway; returns per-call latencies, the prompt ids
    the engine got, and the wall time. ``client``: the openai SDK (each session gets it with its
    key) or a bare aiohttp session; either is built once (building an SDK client costs tens of
    ms, none of it the gateway's)."""
    opened = [gateway.open_session(f"b{round_}-g{i}-s0") for i in range(sessions)]
    latencies: list[float] = []

    async def call(i: int, messages: list[dict]) -> dict:
        if isinstance(client, openai.AsyncOpenAI):
            reply = await client.with_options(api_key=opened[i].key).chat.completions.create(
                model=gateway.model, messages=messages, max_tokens=NEW_TOKENS)
            return reply.choices[0].message.model_dump(exclude_none=True)
        body = {"model": gateway.model, "messages": messages, "max_tokens": NEW_TOKENS}
        async with client.post(f"{gateway.base_url(opened[i])}/chat/completions", json=body) as r:
            return (await r.json())["choices"][0]["message"]

    async def conversation(i: int) -> None:
        messages = [{"role": "user", "content": f"Conversation {i}: tell me about the number {i}."}]
        for _ in range(CALLS):
            started = time.perf_counter()
            reply = await call(i, messages)
            latencies.append(time.perf_counter() - started)
            messages += [reply, {"role": "user", "content": "Go on."}]

    started = time.perf_counter()
    await asyncio.gather(*(conversation(i) for i in range(sessions)))
    wall = time.perf_counter() - started
    prompts = [call.prompt_ids for s in opened for call in s.calls]
    for session in opened:
        await gateway.close_session(session)
    return latencies, prompts, wall


async def direct(engine: EmbeddedEngine, sampling: SamplingParams, prompts: list[list[int]],
                 sessions: int) -> list[float]:
    """The same requests on the engine, ``sessions`` at a time, in the same call order."""
    latencies: list[float] = []

    async def one(ids: list[int], rid: str) -> None:
        started = time.perf_counter()
        await engine.generate(ids, sampling, rid=rid)
        latencies.append(time.perf_counter() - started)

    by_session = [prompts[i * CALLS:(i + 1) * CALLS] for i in range(sessions)]

    async def conversation(i: int) -> None:
        for k, ids in enumerate(by_session[i]):
            await one(ids, f"d{i}-t{k}")

    await asyncio.gather(*(conversation(i) for i in range(sessions)))
    return latencies


async def main(rounds: int, sessions: int) -> None:
    engine = EmbeddedEngine.from_pretrained(build_tiny_model(), max_batch_size=sessions)
    renderer = ChatRenderer(engine.tokenizer, "hermes")
    sampling = SamplingParams(max_new_tokens=NEW_TOKENS, ignore_eos=True, sampling_seed=None)
    try:
        async with Gateway(engine, renderer, sampling, 2048) as gateway, aiohttp.ClientSession() as bare:
            sdk = openai.AsyncOpenAI(base_url=f"{gateway.url}/v1", api_key="x")
            clients = {"http": bare, "openai-sdk": sdk}
            for client in clients.values():  # warm-up: code paths, connections
                await through_gateway(gateway, client, sessions, -1)
            via: dict[str, list[float]] = {name: [] for name in clients}
            rps: dict[str, list[float]] = {name: [] for name in clients}
            base: list[float] = []
            for r in range(rounds):
                for name, client in clients.items():
                    latencies, prompts, wall = await through_gateway(gateway, client, sessions, r)
                    via[name] += latencies
                    rps[name].append(len(latencies) / wall)
                    base += await direct(engine, sampling, prompts, sessions)
            await sdk.close()
    finally:
        await engine.close()
    direct_ms = statistics.median(base) * 1e3
    for name in clients:
        print(f"{name}: {sessions} sessions x {CALLS} calls x {rounds} rounds: median call "
              f"{statistics.median(via[name]) * 1e3:.1f} ms through the gateway, {direct_ms:.1f} ms "
              f"directly; {statistics.median(rps[name]):.1f} calls/s")
    ratio = statistics.median(via["http"]) * 1e3 / direct_ms
    sdk_ratio = statistics.median(via["openai-sdk"]) * 1e3 / direct_ms
    print(json.dumps({"name": "gateway_overhead_ratio", "value": round(ratio, 3), "target": "<= 1.2"}))
    print(json.dumps({"name": "gateway_overhead_ratio_openai_sdk", "value": round(sdk_ratio, 3),
                      "target": "report"}))
    print(json.dumps({"name": "gateway_requests_per_s", "value": round(statistics.median(rps["http"]), 2),
                      "target": "report"}))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--sessions", type=int, default=16)
    options = parser.parse_args()
    asyncio.run(main(options.rounds, options.sessions))
