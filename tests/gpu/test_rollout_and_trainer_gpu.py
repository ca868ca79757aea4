"""On a CUDA machine: the embedded engine and the Megatron actor in bf16 agree (the reference
system's step-0 check: mean |logp_train - logp_rollout| <= 0.1), and a GRPO step runs."""

from __future__ import annotations

import asyncio

import torch

from agentrl.engine import EmbeddedEngine, SamplingParams
from agentrl.models import build_tiny_model
from agentrl.records.sample import Sample, Status, Turn
from agentrl.trainer.actor import MegatronActor
from agentrl.trainer.config import TrainerConfig


def engine_samples(count: int = 8) -> list[Sample]:
    async def run() -> list[Sample]:
        engine = EmbeddedEngine.from_pretrained(build_tiny_model(), device="cuda")
        try:
            prompts = [[1, 20 + i, 30, 40 + i, 2] for i in range(count)]
            outs = await asyncio.gather(*(engine.generate(p, SamplingParams(max_new_tokens=24))
                                          for p in prompts))
        finally:
            await engine.close()
        samples = []
        for i, (prompt, out) in enumerate(zip(prompts, outs, strict=True)):
            n = len(out.output_ids)
            samples.append(Sample(group_id=i // 4, index=i % 4, tokens=prompt + out.output_ids,
                                  response_length=n, loss_mask=[1] * n,
                                  rollout_log_probs=out.output_logprobs, reward=float(i % 2),
                                  status=Status.COMPLETED, turns=[Turn("assistant", 0, n)]))
        return samples

    return asyncio.run(run())


def test_bf16_trainer_logprobs_match_the_engine_and_a_step_runs():
    samples = engine_samples()
    actor = MegatronActor(TrainerConfig(lr=1e-5, micro_batch_size=4), hf_checkpoint=build_tiny_model())
    assert actor.device.type == "cuda" and actor.params_dtype == torch.bfloat16
    metrics = actor.train(samples)
    assert metrics["logprob_abs_diff"] <= 0.1, metrics
    assert all(v == v for v in metrics.values())  # no NaN
