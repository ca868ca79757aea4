"""Demonstrations for a supervised warm start (``--loss-type sft_loss``), as samples.

A demonstration is a sample in the rollout's own layout, so the trainer needs no second path:
the prompt ids, then each assistant turn as the tokenizer encodes its text plus the end-of-turn
token (loss mask 1 - what the model learns to produce), and each environment or user reply as
the chat template's delta (loss mask 0). Two sources:

* an env's scripted oracle (:meth:`~agentrl.ToolEnv.oracle_action`) played on the sample's task,
  the tools really running (:func:`oracle_sample`);
* a conversation with tool calls, e.g. a JSONL row's ``messages`` (:func:`conversation_sample`):
  every assistant message is a trained turn, written as the chat template writes it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from agentrl.chat import ChatRenderer
from agentrl.errors import DataError
from agentrl.rollout.episode import RolloutContext
from agentrl.rollout.sample import Sample, Status
from agentrl.rollout.trajectory import Trajectory

__all__ = ["DemoBatch", "conversation_sample", "demonstrations", "oracle_sample"]


def _action_text(env: Any, action: Any) -> str:
    """An oracle action as the raw text a model would write (in the env's tool-call format)."""
    if isinstance(action, str):
        return action
    from agentrl.tools.calls import ToolCall

    calls = [c if isinstance(c, ToolCall) else ToolCall(c["name"], dict(c.get("arguments") or {}))
             for c in action.get("tool_calls") or ()]  # fmt: skip
    return env.format.render(str(action.get("content") or ""), calls)


async def oracle_sample(ctx: RolloutContext, sample: Sample) -> Sample:
    """Plays the env's oracle on ``sample``'s task (or seed) and fills ``sample`` with it.

    Raises:
        DataError: No env (``--env``), or the env has no oracle.
    """
    if ctx.env_factory is None:
        raise DataError("oracle demonstrations need --env (an env with a scripted oracle)")
    env = ctx.env_factory()
    renderer = ctx.renderer
    eot = renderer.encode(renderer.end_of_turn)
    try:
        meta = sample.metadata
        observation, info = await env.areset(
            seed=meta.get("seed"), options={"task": meta["task"]} if "task" in meta else None)
        tools = list(info["tools"]) or None
        history = [dict(m) for m in observation]
        sample.prompt = [dict(m) for m in observation]
        sample.tokens = renderer.prompt_ids(history, tools)
        sample.response_length, sample.loss_mask, sample.rollout_log_probs = 0, [], []
        sample.turns = []
        trajectory = Trajectory(sample, renderer, ctx.max_context_len)
        while True:
            try:
                text = _action_text(env, env.oracle_action(info["task"], env.messages))
            except Exception as exc:
                raise DataError(f"{type(env).__name__} gives no oracle demonstration: {exc}") from exc
            ids = renderer.encode(text) + eot
            trajectory.append_assistant(ids, [0.0] * len(ids))
            observation, reward, terminated, truncated, info_step = await env.astep(text)
            if terminated or truncated:
                sample.reward = reward
                sample.status = Status.COMPLETED if terminated else Status.TRUNCATED
                break
            history.append(dict(env.messages[-(len(observation) + 1)]))
            appended, fits = trajectory.append_env(history, observation, tools)
            if not fits:
                sample.reward, sample.status = 0.0, Status.TRUNCATED
                break
            history.extend(appended)
    finally:
        await env.aclose()
    sample.response = renderer.tokenizer.decode(sample.tokens[sample.prompt_length :],
                                                skip_special_tokens=True)  # fmt: skip
    sample.metadata["demonstration"] = "oracle"
    return sample


def conversation_sample(
    renderer: ChatRenderer, messages: Sequence[Mapping[str, Any]], *,
    tools: Sequence[Mapping[str, Any]] | None = None, group_id: Any = 0,
) -> Sample:  # fmt: skip
    """A demonstration from a conversation: every assistant message is a trained turn.

    Raises:
        DataError: The conversation has no assistant message.
    """
    messages = [dict(m) for m in messages]
    starts = [i for i, m in enumerate(messages) if m.get("role") == "assistant"]
    if not starts:
        raise DataError("a demonstration conversation needs at least one assistant message")
    eot = renderer.encode(renderer.end_of_turn)
    prompt = messages[: starts[0]]
    sample = Sample(group_id=group_id, prompt=prompt, tokens=renderer.prompt_ids(prompt, tools))
    trajectory = Trajectory(sample, renderer, max_context_len=1 << 30)
    for turn, at in enumerate(starts):
        ids = renderer.encode(renderer.assistant_text(messages[:at], messages[at], tools)) + eot
        trajectory.append_assistant(ids, [0.0] * len(ids))
        end = starts[turn + 1] if turn + 1 < len(starts) else at + 1  # trailing replies: untrained
        if end > at + 1:
            trajectory.append_env(messages[: at + 1], messages[at + 1 : end], tools,
                                  min_generation_room=0)  # fmt: skip
    sample.status, sample.reward = Status.COMPLETED, 0.0
    sample.metadata["demonstration"] = "conversation"
    return sample


async def demonstrations(ctx: RolloutContext, groups: Sequence[Sequence[Sample]]) -> list[Sample]:
    """Demonstration samples for data-source groups: a prompt that is a conversation with
    assistant turns is used as it is; anything else is played by the env's oracle."""
    out = []
    for group in groups:
        for sample in group:
            prompt = sample.prompt
            if isinstance(prompt, list) and any(m.get("role") == "assistant" for m in prompt):
                tools = sample.metadata.get("tools")
                demo = conversation_sample(ctx.renderer, prompt, tools=tools, group_id=sample.group_id)
                demo.index, demo.metadata = sample.index, {**sample.metadata, **demo.metadata}
                out.append(demo)
            else:
                out.append(await oracle_sample(ctx, sample))
    return out


class DemoBatch:
    """A batch of demonstrations with the metrics a rollout batch reports."""

    def __init__(self, samples: list[Sample]) -> None:
        self.samples = samples
        rewards = [s.reward or 0.0 for s in samples]
        self.metrics = {
            "rollout/samples": float(len(samples)),
            "rollout/reward_mean": sum(rewards) / max(len(rewards), 1),
            "rollout/response_len_mean": sum(s.response_length for s in samples) / max(len(samples), 1),
        }
