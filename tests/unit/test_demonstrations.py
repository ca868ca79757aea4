"""Demonstrations for the supervised warm start: conversations and env oracles as samples."""

from __future__ import annotations

import asyncio

import pytest

from agentrl.errors import DataError
from agentrl.records.sample import Sample, Status
from agentrl.rollout.demonstrations import conversation_sample, demonstrations, oracle_sample
from tests.unit.test_rollout_episode import TASK, make_ctx

CONVERSATION = [
    {"role": "system", "content": "Use the calculator."},
    {"role": "user", "content": "What is 6 * 7?"},
    {"role": "assistant", "content": "Computing.",
     "tool_calls": [{"name": "calculator", "arguments": {"expression": "6 * 7"}}]},
    {"role": "tool", "name": "calculator", "content": "42"},
    {"role": "assistant", "content": "Answer: 42"},
]


def test_conversation_sample_trains_assistant_turns_only():
    ctx = make_ctx()
    renderer = ctx.renderer
    sample = conversation_sample(renderer, CONVERSATION)
    sample.check()
    assert [t.role for t in sample.turns] == ["assistant", "environment", "assistant"]
    # the whole sequence is the template's render; only the assistant spans are trained
    full = renderer.encode(renderer.render_text(CONVERSATION))
    assert sample.tokens == full[: len(sample.tokens)]
    text = renderer.tokenizer.decode
    trained = [t for t, m in zip(sample.tokens[sample.prompt_length:], sample.loss_mask, strict=True) if m]
    assert text(trained) == text(renderer.encode(
        renderer.assistant_text(CONVERSATION[:2], CONVERSATION[2]) + "<|im_end|>"
        + "Answer: 42<|im_end|>"))
    with pytest.raises(DataError, match="at least one assistant message"):
        conversation_sample(renderer, CONVERSATION[:2])


def test_oracle_sample_plays_the_env_oracle():
    ctx = make_ctx()
    sample = asyncio.run(oracle_sample(ctx, Sample(group_id=0, metadata={"task": TASK})))
    sample.check()
    assert sample.status is Status.COMPLETED and sample.reward == 1.0
    assert "Answer: 43" in sample.response and sample.loss_mask.count(0) > 0
    assert sample.rollout_log_probs == [0.0] * sample.response_length


def test_demonstrations_mix_conversations_and_oracles():
    ctx = make_ctx()
    groups = [[Sample(group_id=0, prompt=CONVERSATION)], [Sample(group_id=1, metadata={"task": TASK})]]
    demos = asyncio.run(demonstrations(ctx, groups))
    assert [d.metadata["demonstration"] for d in demos] == ["conversation", "oracle"]
    assert [d.group_id for d in demos] == [0, 1]
