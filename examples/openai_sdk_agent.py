"""A tool-calling loop written against the plain ``openai`` SDK, as a black-box agent for ``calc``.

    agentrl eval --env calc --agent examples/openai_sdk_agent.py:run --limit 4
    python train.py --env calc --agent-function-path examples/openai_sdk_agent.py:run

agentrl calls :func:`run` once per episode with the episode's endpoint. The loop is what an
agent written for OpenAI's API does: send the conversation and the tools, run every tool call of
the reply (in parallel), send the results back, until the model answers without a call. The
env's own tools run in the episode through ``endpoint.call_tool``. The run returns ``None``, so
agentrl grades the episode with ``calc``'s ``compute_reward`` on the model's last reply.

:func:`run` streams each reply (``stream=True``) with the async client; :func:`run_sync` is the
same loop with the blocking client, run in a worker thread so that the event loop the episode
(and the gateway) runs on stays free.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any

import openai

MAX_CALLS = 4
"""Model calls per episode at most."""


async def _run_tools(endpoint: Any, calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
    async def one(call: dict[str, Any]) -> dict[str, Any]:
        try:
            arguments = json.loads(call["function"]["arguments"] or "{}")
        except ValueError:
            arguments = {}
        result = await endpoint.call_tool(call["function"]["name"], arguments)
        return {"role": "tool", "tool_call_id": call["id"], "content": result}

    return list(await asyncio.gather(*(one(c) for c in calls)))


async def _streamed_reply(client: openai.AsyncOpenAI, endpoint: Any,
                          messages: list[dict[str, Any]]) -> dict[str, Any]:
    """One streamed reply, put back together: text deltas, tool-call deltas by index."""
    stream = await client.chat.completions.create(model=endpoint.model, messages=messages,
                                                  tools=endpoint.tools, stream=True)
    content, calls = "", {}
    async for chunk in stream:
        for choice in chunk.choices:
            content += choice.delta.content or ""
            for delta in choice.delta.tool_calls or ():
                call = calls.setdefault(delta.index, {"id": delta.id, "type": "function",
                                                      "function": {"name": "", "arguments": ""}})
                call["function"]["name"] += delta.function.name or ""
                call["function"]["arguments"] += delta.function.arguments or ""
    message: dict[str, Any] = {"role": "assistant", "content": content or None}
    if calls:
        message["tool_calls"] = [calls[i] for i in sorted(calls)]
    return message


async def _play(endpoint: Any, reply: Callable[[list[dict[str, Any]]], Awaitable[dict[str, Any]]]) -> None:
    """The loop: ask, run the reply's tool calls, send their results, until a plain answer."""
    messages = [dict(m) for m in endpoint.messages]
    for _ in range(MAX_CALLS):
        message = await reply(messages)
        messages.append(message)
        if not message.get("tool_calls"):
            return
        messages += await _run_tools(endpoint, message["tool_calls"])


async def run(task: dict[str, Any], endpoint: Any) -> None:
    """Plays one ``calc`` episode with the async client, streaming."""
    client = openai.AsyncOpenAI(base_url=endpoint.base_url, api_key=endpoint.api_key)
    try:
        await _play(endpoint, lambda messages: _streamed_reply(client, endpoint, messages))
    finally:
        await client.close()


async def run_sync(task: dict[str, Any], endpoint: Any) -> None:
    """The same loop with the blocking ``openai.OpenAI`` client, in a worker thread."""
    client = openai.OpenAI(base_url=endpoint.base_url, api_key=endpoint.api_key)

    async def reply(messages: list[dict[str, Any]]) -> dict[str, Any]:
        response = await asyncio.to_thread(client.chat.completions.create, model=endpoint.model,
                                           messages=messages, tools=endpoint.tools)
        return response.choices[0].message.model_dump(exclude_none=True)

    try:
        await _play(endpoint, reply)
    finally:
        client.close()
