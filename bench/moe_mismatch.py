"""The trainer's log-probs against the rollout's: a dense model, a mixture of experts routed
again by the trainer, and the same mixture with routing replay (``--routing-replay``).

The embedded engine samples single-turn responses from the built-in tiny Qwen2 and the tiny
Qwen3-MoE (``scripts/make-tiny-moe.py``), in float32 (the engine's CPU precision), reporting
each position's experts. The Megatron trainer then scores the same tokens, in float32 and in
bfloat16 (``--bf16``: the precision gap of a GPU run, where engine and trainer kernels differ),
and the script reports, over the sampled tokens, the mean absolute log-prob difference and the
k3 estimate of KL(rollout policy || trainer), as ``train/logprob_abs_diff`` and
``train/logprob_k3_kl`` log them in a run.

Both MoE rows score the same samples with the same weights: the only difference is whether
the trainer routes each token again or replays the engine's choice, so their ratio is what
replay removes. Random tiny models route on near-tied scores, the worst case for flips; a
trained router separates its experts more.

    python bench/moe_mismatch.py [--samples 32] [--new-tokens 64]

Prints a table, then one JSON line per headline figure: moe_replay_k3_ratio_bf16 (the k3 KL
with replay over without, trainer in bfloat16) and moe_replay_vs_dense_k3_bf16 (with replay
over the dense model's).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import warnings

import torch

from agentrl.algorithms import kl_estimate
from agentrl.engine import EmbeddedEngine, SamplingParams
from agentrl.models import build_tiny_model, build_tiny_moe_model
from agentrl.records.sample import Sample
from agentrl.trainer.actor import MegatronActor
from agentrl.trainer.config import TrainerConfig

TEMPERATURE = 1.0


def rollout(model: str, count: int, new_tokens: int) -> list[Sample]:
    """``count`` samples of random prompts, each with its engine log-probs and routes."""

    async def play() -> list[Sample]:
        engine = EmbeddedEngine.from_pretrained(model, max_batch_size=count)
        try:
            generator = torch.Generator().manual_seed(0)
            prompts = [torch.randint(10, 4000, (24,), generator=generator).tolist() for _ in range(count)]
            params = SamplingParams(max_new_tokens=new_tokens, temperature=TEMPERATURE, ignore_eos=True)
            outputs = await asyncio.gather(*(engine.generate(p, params.replace(sampling_seed=i))
                                             for i, p in enumerate(prompts)))
        finally:
            await engine.close()
        return [Sample(group_id=i // 4, index=i % 4, tokens=[*p, *out.output_ids],
                       response_length=len(out.output_ids), loss_mask=[1] * len(out.output_ids),
                       rollout_log_probs=list(out.output_logprobs), reward=float(i % 2),
                       routed_experts=out.routed_experts)
                for i, (p, out) in enumerate(zip(prompts, outputs, strict=True))]

    return asyncio.run(play())


def mismatch(model: str, samples: list[Sample], *, bf16: bool, replay: bool) -> tuple[float, float]:
    """(mean |trainer - rollout| log-prob, mean k3 KL(rollout || trainer)) over sampled tokens."""
    actor = MegatronActor(TrainerConfig(bf16=bf16, routing_replay=replay), hf_checkpoint=model,
                          rollout_temperature=TEMPERATURE, total_steps=1)
    logp = actor.logprobs(samples)
    trainer = torch.cat([logp[row, s.prompt_length - 1 : len(s.tokens) - 1] for row, s in enumerate(samples)])
    trainer = trainer.double()  # k3 ~ d^2 / 2: float32 rounds fp32-sized gaps to 0
    engine = torch.cat([torch.tensor(s.rollout_log_probs, dtype=torch.float64) for s in samples])
    return float((trainer - engine).abs().mean()), float(kl_estimate(engine, trainer, "k3").mean())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=32)
    parser.add_argument("--new-tokens", type=int, default=64)
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    dense, moe = str(build_tiny_model()), str(build_tiny_moe_model())
    dense_samples = rollout(dense, args.samples, args.new_tokens)
    moe_samples = rollout(moe, args.samples, args.new_tokens)
    rows = {}
    for precision, bf16 in (("fp32", False), ("bf16", True)):
        rows[("dense", precision)] = mismatch(dense, dense_samples, bf16=bf16, replay=False)
        rows[("moe, routed again", precision)] = mismatch(moe, moe_samples, bf16=bf16, replay=False)
        rows[("moe, routing replay", precision)] = mismatch(moe, moe_samples, bf16=bf16, replay=True)
    tokens = args.samples * args.new_tokens
    print(f"{tokens} sampled tokens per model; engine float32, trainer as the column says")
    print(f"{'model':<22}{'trainer':>8}{'mean |dlogp|':>15}{'k3 KL':>13}")
    for (name, precision), (abs_diff, k3) in rows.items():
        print(f"{name:<22}{precision:>8}{abs_diff:>15.3e}{k3:>13.3e}")
    replayed, again, plain = (rows[(name, "bf16")][1] for name in
                              ("moe, routing replay", "moe, routed again", "dense"))
    print(json.dumps({"name": "moe_replay_k3_ratio_bf16", "value": round(replayed / again, 4),
                      "target": "< 1 (replay lowers the trainer-engine KL)"}))
    print(json.dumps({"name": "moe_replay_vs_dense_k3_bf16", "value": round(replayed / plain, 4),
                      "target": "about 1 (what is left is precision, as for a dense model)"}))


if __name__ == "__main__":
    main()
