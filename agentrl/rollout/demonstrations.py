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

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from agentrl.chat import ChatRenderer
from agentrl.errors import DataError
from agentrl.rollout.episode import Episode, RolloutContext, ScriptedTurns, oracle_policy
from agentrl.rollout.sample import Sample, Status
from agentrl.rollout.trajectory import Trajectory

__all__ = ["DemoBatch", "conversation_sample", "demonstrations", "oracle_sample"]

log = logging.getLogger(__name__)

ORACLE = ScriptedTurns(oracle_policy, "oracle")


async def oracle_sample(ctx: RolloutContext, sample: Sample) -> Sample:
    """Plays the env's oracle on ``sample``'s task (or seed) and fills ``sample`` with it: an
    :class:`~agentrl.rollout.episode.Episode` whose turns come from the oracle.

    Returns:
        The sample; ``failed`` (with ``metadata["error"]``) when the env or its oracle broke.

    Raises:
        DataError: No env (``--env``).
    """
    if ctx.envs is None:
        raise DataError("oracle demonstrations need --env (an env with a scripted oracle)")
    episode = Episode(ctx, sample, f"demo-g{sample.group_id}-s{sample.index}", turns=ORACLE)
    await episode.run()
    sample.metadata["demonstration"] = "oracle"
    return sample


def conversation_sample(
    renderer: ChatRenderer, messages: Sequence[Mapping[str, Any]], *,
    tools: Sequence[Mapping[str, Any]] | None = None, group_id: Any = 0,
) -> Sample:
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
                                  min_generation_room=0)
    sample.status, sample.reward = Status.COMPLETED, 0.0
    sample.metadata["demonstration"] = "conversation"
    return sample


async def demonstrations(ctx: RolloutContext, groups: Sequence[Sequence[Sample]]) -> list[Sample]:
    """Demonstration samples for data-source groups: a prompt that is a conversation with
    assistant turns is used as it is; anything else is played by the env's oracle.

    A demonstration that failed (the oracle or the env broke on that task) stays in the batch,
    so the batch keeps its size, with every loss-mask entry 0 (it has nothing to teach) and a
    warning naming the task and the reason.

    Raises:
        DataError: Every demonstration failed (e.g. the env has no oracle); names the reason.
    """
    out, failed = [], []
    for group in groups:
        for sample in group:
            prompt = sample.prompt
            if isinstance(prompt, list) and any(m.get("role") == "assistant" for m in prompt):
                tools = sample.metadata.get("tools")
                demo = conversation_sample(ctx.renderer, prompt, tools=tools, group_id=sample.group_id)
                demo.index, demo.metadata = sample.index, {**sample.metadata, **demo.metadata}
                out.append(demo)
                continue
            demo = await oracle_sample(ctx, sample)
            if demo.status is Status.FAILED:
                failed.append(demo)
                demo.loss_mask = [0] * demo.response_length
                log.warning("no oracle demonstration for task %s: %s",
                            demo.metadata.get("task_id"), demo.metadata.get("error"))
            out.append(demo)
    if failed and len(failed) == len(out):
        raise DataError(f"no demonstration could be played: {failed[0].metadata.get('error')}")
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
