"""Eval rollouts: named prompt sets and env test splits, pass@1 and unbiased pass@k."""

from __future__ import annotations

import asyncio
import json
import re

import pytest

from agentrl.eval.metrics import pass_at_k
from agentrl.rollout.config import RolloutConfig
from agentrl.rollout.evaluation import run_evaluation, summarize, write_eval_results
from agentrl.rollout.sample import Sample
from tests.unit.test_rollout_episode import calc_policy, make_ctx
from tests.unit.test_rollout_runner import TASKS


def half_right(text, rid):
    """Right for samples 0 and 1 of each prompt, wrong for 2 and 3."""
    reply = calc_policy(text, rid)
    index = int(re.search(r"-s(\d+)", rid).group(1))
    return re.sub(r"Answer: .*", "Answer: -999", reply) if "Answer:" in reply and index >= 2 else reply


def test_named_sets_and_env_test_split(tmp_path):
    data = tmp_path / "mini.jsonl"
    data.write_text("".join(json.dumps(t) + "\n" for t in TASKS[:3]))
    config = RolloutConfig(env="calc", eval_prompt_data=[["mini", str(data)]], eval_env=["calc"],
                           n_samples_per_eval_prompt=4, eval_max_prompts=2)  # fmt: skip
    config.validate()
    ctx = make_ctx(half_right)
    ctx.args = config
    result = asyncio.run(run_evaluation(ctx, step=7))
    assert result["step"] == 7 and set(result["sets"]) == {"mini", "calc"}
    for name in ("mini", "calc"):
        metrics = result["sets"][name]
        assert metrics["n_prompts"] == 2 and metrics["n_samples"] == 8
        assert metrics["pass@1"] == pytest.approx(0.5)
        assert metrics["pass@2"] == pytest.approx(pass_at_k(4, 2, 2))
        assert metrics["pass@4"] == 1.0
        assert metrics["mean_reward"] == pytest.approx(0.5)
    out = tmp_path / "eval.jsonl"
    write_eval_results(out, result)
    write_eval_results(out, {**result, "step": 8})
    assert [json.loads(line)["step"] for line in out.read_text().splitlines()] == [7, 8]


def test_summarize_counts_only_full_successes():
    groups = [[Sample(group_id=0, reward=r) for r in (1.0, 0.5, 0.0)],
              [Sample(group_id=1, reward=r) for r in (1.0, 1.0, 0.0)]]  # fmt: skip
    metrics = summarize(groups)
    assert metrics["pass@1"] == pytest.approx((1 / 3 + 2 / 3) / 2)
    assert metrics["pass@2"] == pytest.approx((pass_at_k(3, 1, 2) + pass_at_k(3, 2, 2)) / 2)
    assert metrics["pass@3"] == 1.0 and metrics["mean_reward"] == pytest.approx(3.5 / 6)
