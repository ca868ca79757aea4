"""An OpenAI Agents SDK agent as a black-box agent for ``calc``: its model is agentrl's
OpenAI-compatible endpoint (chat completions), its one tool runs the env's calculator.

    agentrl eval --env calc --agent examples/openai_agents_agent.py:run ...
    python train.py --env calc --agent-function-path examples/openai_agents_agent.py:run ...

agentrl calls :func:`run` once per episode. The agent's instructions are the env's system
message, its input the env's user message (the problem). Its ``calculator`` function tool awaits
``endpoint.call_tool("calculator", ...)``, which runs the env's own tool in the episode; the SDK
runs function tools on the episode's event loop, so no thread is involved. The agent ends with
an answer text without a tool call ("Answer: N", as the env's system prompt asks); that is the
last assistant message agentrl's endpoint recorded, which ``calc``'s ``compute_reward`` reads.
So the function returns ``None``: agentrl grades the episode with the env.

The model is ``OpenAIChatCompletionsModel`` on an ``AsyncOpenAI`` client at
``endpoint.base_url``: the SDK's default is OpenAI's Responses API, which agentrl's endpoint does
not serve. Tracing is off: it would upload spans to OpenAI.

Requires ``pip install openai-agents`` (tested with 0.24.0).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Awaitable, Mapping, Sequence
from typing import Any, Protocol

# Read once, on the SDK's first trace; set before the SDK is imported so that no trace is ever
# recorded or exported (RunConfig(tracing_disabled=True) below covers this agent's runs too).
os.environ.setdefault("OPENAI_AGENTS_DISABLE_TRACING", "1")

from agents import Agent, OpenAIChatCompletionsModel, RunConfig, Runner, function_tool
from agents.exceptions import MaxTurnsExceeded
from openai import AsyncOpenAI

MAX_TURNS = int(os.environ.get("AGENTRL_AGENTS_MAX_TURNS", "4"))
"""Most model calls per episode (``Runner.run``'s ``max_turns``; ``calc`` allows 4 turns)."""

log = logging.getLogger(__name__)


class Endpoint(Protocol):
    """What agentrl passes to an agent function (the attributes this agent uses)."""

    base_url: str
    api_key: str
    model: str
    messages: Sequence[Mapping[str, Any]]

    def call_tool(self, name: str, arguments: dict[str, Any]) -> Awaitable[str]:
        """Runs one of the env's tools in the episode; returns its result text (an
        ``Error (...)`` text when the call failed)."""


def prompt_parts(task: Mapping[str, Any], messages: Sequence[Mapping[str, Any]]) -> tuple[str, str]:
    """(instructions, input): the env's system message and its last user message (the task's
    question when the env sent none)."""
    system = "\n\n".join(str(m["content"]) for m in messages if m.get("role") == "system")
    users = [str(m["content"]) for m in messages if m.get("role") == "user"]
    question = users[-1] if users else str(task["question"])
    return system, question


def build_agent(endpoint: Endpoint, client: AsyncOpenAI, instructions: str) -> Agent[Any]:
    """The agent: ``endpoint``'s model over chat completions, one ``calculator`` tool."""

    @function_tool
    async def calculator(expression: str) -> str:
        """Evaluates an arithmetic expression and returns the result.

        Args:
            expression: Numbers with + - * / // % ** and parentheses, e.g. "37*12+5".
        """
        return await endpoint.call_tool("calculator", {"expression": expression})

    return Agent(
        name="calc",
        instructions=instructions,
        model=OpenAIChatCompletionsModel(model=endpoint.model, openai_client=client),
        tools=[calculator],
    )


async def run(task: Mapping[str, Any], endpoint: Endpoint) -> None:
    """Plays one ``calc`` episode with the Agents SDK; the env grades the final answer."""
    instructions, question = prompt_parts(task, endpoint.messages)
    async with AsyncOpenAI(base_url=endpoint.base_url, api_key=endpoint.api_key) as client:
        agent = build_agent(endpoint, client, instructions)
        try:
            result = await Runner.run(
                agent, question, max_turns=MAX_TURNS,
                run_config=RunConfig(tracing_disabled=True),
            )
        except MaxTurnsExceeded:
            # Out of turns is a normal end of an episode: the env scores what was answered.
            log.info("agent ran out of turns (%d)", MAX_TURNS)
            return None
    log.info("agent answered: %r", result.final_output)
    return None
