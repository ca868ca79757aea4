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
from agentrl.records.sample import Sample, Status
from agentrl.records.trajectory import Trajectory
from agentrl.rollout.data import SkippedRow, report_skipped, row_location
from agentrl.rollout.episode import Episode, RolloutContext, ScriptedTurns, oracle_policy
from agentrl.rollout.overlong import OVERLONG_FINISH, prompt_ids_within

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
    warning naming the task and the reason. One that does not fit the context (its prompt, or a
    conversation longer than ``--rollout-max-context-len``, measured without tokenizing more
    than the context holds) stays as a ``skipped`` sample without tokens, its row reported with
    file and line.

    Raises:
        DataError: Every demonstration failed or was skipped (e.g. the env has no oracle);
            names the reason.
    """
    out, failed = [], []
    for group in groups:
        for sample in group:
            prompt = sample.prompt
            if isinstance(prompt, list) and any(m.get("role") == "assistant" for m in prompt):
                tools = sample.metadata.get("tools")
                demo = _conversation_within(ctx, sample, prompt, tools)
                out.append(demo)
                if demo.status is Status.SKIPPED:
                    failed.append(demo)
                continue
            demo = await oracle_sample(ctx, sample)
            if demo.status is Status.SKIPPED:  # no tokens: nothing to mask
                failed.append(demo)
            elif demo.status is Status.FAILED:
                failed.append(demo)
                demo.loss_mask = [0] * demo.response_length
                log.warning("no oracle demonstration for task %s: %s",
                            demo.metadata.get("task_id"), demo.metadata.get("error"))
            out.append(demo)
    skipped = {row_location(s.metadata.get("source") or {}): s for s in failed
               if s.status is Status.SKIPPED}
    for (file, line), demo in skipped.items():  # once per row, not per sample of its group
        report_skipped(SkippedRow(file, line, str(demo.metadata.get("error", ""))))
    if failed and len(failed) == len(out):
        raise DataError(f"no demonstration could be played: {failed[0].metadata.get('error')}")
    return out


def _conversation_within(ctx: RolloutContext, sample: Sample, messages: list[dict[str, Any]],
                         tools: Sequence[Mapping[str, Any]] | None) -> Sample:
    """:func:`conversation_sample` of ``messages`` for ``sample``, or ``sample`` itself, skipped,
    when the conversation is longer than the context (then it is never tokenized whole)."""
    assert ctx.renderer is not None
    limit = ctx.max_context_len
    found = prompt_ids_within(ctx.renderer, messages, tools, limit, generation_prompt=False)
    if not isinstance(found, int):
        demo = conversation_sample(ctx.renderer, messages, tools=tools, group_id=sample.group_id)
        if len(demo.tokens) <= limit:  # the turn-by-turn encoding may differ by a token or two
            demo.index, demo.metadata = sample.index, {**sample.metadata, **demo.metadata}
            return demo
        found = len(demo.tokens)
    sample.tokens, sample.response_length, sample.loss_mask, sample.rollout_log_probs = [], 0, [], []
    sample.token_versions = []
    sample.status, sample.reward = Status.SKIPPED, 0.0
    sample.metadata.update(finish=OVERLONG_FINISH, demonstration="conversation", error=(
        f"the demonstration has at least {found} tokens, more than the context of {limit} "
        "(--rollout-max-context-len); shorten it"))
    return sample


class DemoBatch:
    """A batch of demonstrations with the metrics a rollout batch reports."""

    def __init__(self, samples: list[Sample]) -> None:
        self.samples = samples
        rewards = [s.reward or 0.0 for s in samples]
        self.metrics = {
            "rollout/samples": float(len(samples)),
            "rollout/reward_mean": sum(rewards) / max(len(rewards), 1),
            "rollout/response_len_mean": sum(s.response_length for s in samples) / max(len(samples), 1),
            "rollout/overlong_prompts": float(len({  # prompts, as a rollout counts them
                row_location(s.metadata.get("source") or {}) for s in samples
                if s.status is Status.SKIPPED})),
        }
