"""MegatronActor on CPU: log-prob parity with the embedded engine on its own multi-turn samples,
step-0 KL, the direction of a GRPO step, micro-batch invariance, checkpoints (and the fallback
from a damaged one), and TP=2 == TP=1."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import math
import os
import shutil
from pathlib import Path

import pytest
import torch

import agentrl
from agentrl.chat import ChatRenderer
from agentrl.engine import EmbeddedEngine, SamplingParams
from agentrl.errors import ConfigError
from agentrl.models import build_tiny_model, build_tiny_moe_model
from agentrl.records.sample import Sample, Status
from agentrl.rollout.config import RolloutConfig
from agentrl.rollout.episode import Episode, RolloutContext
from agentrl.run.checkpoints import checkpoint_folder, latest_checkpoint, mark_latest
from agentrl.trainer.actor import MegatronActor
from agentrl.trainer.config import TrainerConfig
from tests.support.distributed import free_port, spawn
from tests.support.engines import EveryTurnCalls, FixedLengthTurns
from tests.support.trainer_samples import uneven_samples

TEMPERATURE = 0.8


@agentrl.tool
def look() -> str:
    """Looks around."""
    return "a room with a door"


class LookEnv(agentrl.ToolEnv):
    tools = [look]

    def make_prompt(self, task):
        return [{"role": "user", "content": f"Task {task['i']}: look around."}]

    def compute_reward(self, task, final, state):
        return 0.0


def play_look_episodes(model: Path) -> list[Sample]:
    """8 multi-turn samples (2 groups of 4) the embedded engine samples from ``model``: three
    assistant turns (mask 1, engine log-probs) with two tool replies (mask 0) between them."""

    async def play() -> list[Sample]:
        engine = EmbeddedEngine.from_pretrained(model, max_batch_size=8)
        try:
            fmt = EveryTurnCalls("look")
            ctx = RolloutContext(
                RolloutConfig(max_turns=3), FixedLengthTurns(engine), ChatRenderer(engine.tokenizer, fmt),
                SamplingParams(max_new_tokens=10, temperature=TEMPERATURE), 512,
                lambda: LookEnv(max_turns=3, tool_call_format=fmt))
            group = [Sample(group_id=g, index=i, metadata={"task": {"i": g}})
                     for g in range(2) for i in range(4)]
            return list(await asyncio.gather(*(Episode(ctx, s, f"s{s.group_id}-{s.index}").run()
                                               for s in group)))
        finally:
            await engine.close()

    return asyncio.run(play())


@pytest.fixture(scope="module")
def samples() -> list[Sample]:
    """:func:`play_look_episodes` of the tiny model, with rewards."""
    out = play_look_episodes(build_tiny_model())
    for s in out:  # rewards with spread inside each group
        s.reward = float(s.index % 2)
        assert s.loss_mask.count(0) > 0 and s.metadata["turns"] == 3
    return out


def actor(**flags) -> MegatronActor:
    config = TrainerConfig(**{"lr": 1e-3, **flags})
    return MegatronActor(config, hf_checkpoint=build_tiny_model(), rollout_temperature=TEMPERATURE,
                         total_steps=4)


def shifted(samples: list[Sample], nats: list[float]) -> list[Sample]:
    """Copies of ``samples`` whose rollout log-probs are ``nats[row]`` lower: the importance
    ratio exp(old - rollout) of row ``row`` becomes exp(nats[row]) (times numerics)."""
    return [dataclasses.replace(s, rollout_log_probs=[x - shift for x in s.rollout_log_probs])
            for s, shift in zip(samples, nats, strict=True)]


def trained_logprobs(actor_: MegatronActor, samples: list[Sample]) -> torch.Tensor:
    """[B] mean log-prob of each sample's engine-sampled tokens."""
    logp = actor_.logprobs(samples)
    mask = torch.zeros_like(logp)
    for row, s in enumerate(samples):
        start = s.prompt_length - 1
        mask[row, start : start + s.response_length] = torch.tensor(s.loss_mask, dtype=torch.float32)
    return (logp * mask).sum(1) / mask.sum(1)


def test_trainer_logprobs_equal_the_engines(samples):
    logp = actor().logprobs(samples)
    worst = 0.0
    for row, s in enumerate(samples):
        start = s.prompt_length - 1
        mine = logp[row, start : start + s.response_length]
        engine = torch.tensor(s.rollout_log_probs)
        mask = torch.tensor(s.loss_mask, dtype=torch.bool)
        worst = max(worst, float((mine[mask] - engine[mask]).abs().max()))
        assert torch.all(mine[~mask] == 0)  # tool-reply tokens are not scored
    assert worst < 1e-5, worst


def test_step_zero_kl_is_zero_and_grpo_moves_logprobs_by_advantage(samples):
    a = actor(use_kl_loss=True, kl_loss_coef=0.01, use_tis=True)
    before = trained_logprobs(a, samples)
    metrics = a.train(samples)
    assert abs(metrics["ppo_kl"]) < 1e-8 and abs(metrics["kl_loss"]) < 1e-8
    assert metrics["logprob_abs_diff"] < 1e-5 and metrics["grad_norm"] > 0
    change = trained_logprobs(a, samples) - before
    rewards = torch.tensor([s.reward for s in samples])
    assert torch.all(change[rewards == 1] > 0) and torch.all(change[rewards == 0] < 0), change
    # the engine sampled with these very weights: the importance ratio is 1 up to numerics
    for key in ("is_ratio_mean", "is_ratio_min", "is_ratio_max"):
        assert metrics[key] == pytest.approx(1.0, abs=1e-5), (key, metrics[key])
    assert metrics["logprob_drift"] < 1e-6 and metrics["is_clipped_fraction"] == 0
    assert "is_masked_fraction" not in metrics

    # mis: rows whose rollout log-probs are 1 nat lower (ratio e > --tis-clip 2) drop out
    odd = [float(s.index % 2) for s in samples]
    mis = actor(off_policy_correction="mis").train(shifted(samples, odd))
    trained = [s.loss_mask.count(1) for s in samples]
    dropped = sum(n for n, shift in zip(trained, odd, strict=True) if shift) / sum(trained)
    assert mis["is_masked_fraction"] == pytest.approx(dropped, abs=1e-12)
    assert mis["is_ratio_max"] == pytest.approx(math.e, rel=1e-5)
    assert math.isfinite(mis["loss"]) and mis["grad_norm"] > 0
    assert not any(key.startswith("is_") for key in actor().train(samples))  # none: no metrics


def test_micro_batching_does_not_change_the_step(samples):
    whole = actor(micro_batch_size=8).train(samples)
    split = actor(micro_batch_size=3).train(samples)
    dynamic = actor(use_dynamic_batch_size=True, max_tokens_per_gpu=400).train(samples)
    for key in ("loss", "pg_loss", "grad_norm"):
        assert split[key] == pytest.approx(whole[key], abs=1e-6, rel=1e-5), key
        assert dynamic[key] == pytest.approx(whole[key], abs=1e-6, rel=1e-5), key


def test_a_sample_that_failed_before_its_prompt_trains_as_nothing(samples):
    """Regression: an episode that failed in reset has no tokens; alone in a micro-batch it made
    the Megatron step reshape an empty tensor (the whole run crashed)."""
    failed = Sample(group_id=samples[0].group_id, index=samples[0].index, reward=0.0,
                    status=Status.FAILED, metadata={"error": "KeyError: 'question'"})
    batch = [failed, *samples[1:]]
    for flags in ({"micro_batch_size": 1}, {"use_dynamic_batch_size": True, "max_tokens_per_gpu": 400}):
        metrics = actor(**flags).train([dataclasses.replace(s) for s in batch])
        assert torch.isfinite(torch.tensor(metrics["loss"])) and metrics["grad_norm"] > 0


def test_checkpoint_resumes_model_optimizer_and_step(samples, tmp_path):
    first = actor(num_steps_per_rollout=2, global_batch_size=4)
    first.train(samples)
    first.save_checkpoint(tmp_path / "ckpt", extra={"rollout_id": 0})
    resumed = actor(num_steps_per_rollout=2, global_batch_size=4)
    assert resumed.load_checkpoint(tmp_path / "ckpt") == {"rollout_id": 0}
    assert resumed.step == first.step == 2
    assert torch.allclose(resumed.logprobs(samples), first.logprobs(samples), atol=1e-6)
    # the next rollout trains identically: Adam moments and the schedule came back too
    again, continued = resumed.train(samples), first.train(samples)
    for key in ("loss", "grad_norm", "lr"):
        assert again[key] == pytest.approx(continued[key], abs=1e-7), key
    assert torch.allclose(resumed.logprobs(samples), first.logprobs(samples), atol=1e-6)


def test_micro_batches_too_large_to_keep_are_recomputed_to_the_same_step(samples, monkeypatch):
    """By default a micro-batch whose activations would not fit is trained with full
    recomputation: the step is the one that kept them, and the model goes back to keeping
    activations for the next micro-batch."""
    monkeypatch.setattr("agentrl.trainer.actor.too_large_to_keep", lambda *args: True)  # none fits
    kept = actor(recompute_activations=False)  # --no-recompute-activations: never
    kept_metrics = kept.train(samples)
    assert kept.recomputed_micro_batches == 0
    recomputed = actor()
    metrics = recomputed.train(samples)
    assert recomputed.recomputed_micro_batches == len(samples)  # --micro-batch-size 1
    assert recomputed.model.config.recompute_granularity is None
    for key in ("loss", "grad_norm"):
        assert metrics[key] == pytest.approx(kept_metrics[key], abs=1e-6), key
    assert torch.allclose(recomputed.logprobs(samples), kept.logprobs(samples), atol=1e-6)


def test_a_truncated_checkpoint_falls_back_to_the_previous_one(samples, tmp_path):
    a = actor()
    a.train(samples)  # as in train.py: the first save follows a step (Adam's state exists)
    older = checkpoint_folder(tmp_path, 1)
    a.save_checkpoint(older, extra={"next_rollout": 1})
    (older / "data.json").write_text("{}")
    mark_latest(tmp_path, older)
    a.train(samples)
    newest = checkpoint_folder(tmp_path, 2)
    a.save_checkpoint(newest, extra={"next_rollout": 2})
    (newest / "data.json").write_text("{}")
    mark_latest(tmp_path, newest)
    shard = sorted(newest.glob("*.distcp"))[0]
    shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])  # a disk that filled up

    reports: list[str] = []
    assert latest_checkpoint(tmp_path, report=reports.append) == older
    assert f"{shard.name} is {shard.stat().st_size} bytes" in reports[0]
    assert actor().load_checkpoint(older) == {"next_rollout": 1}
    with pytest.raises(ConfigError, match=f"checkpoint {newest} cannot be loaded"):
        actor().load_checkpoint(newest)


def test_hf_export_serves_the_engine(samples, tmp_path):
    a = actor()
    a.train(samples)
    state = a.hf_state_dict()

    async def engine_logprob_after_update() -> float:
        engine = EmbeddedEngine.from_pretrained(build_tiny_model())
        try:
            await engine.update_weights(state_dict=state, version="1")
            s = samples[0]
            out = await engine.generate(s.tokens[: s.prompt_length],
                                        SamplingParams(max_new_tokens=1, temperature=TEMPERATURE))
            assert out.weight_version == "1"
            probe = Sample(group_id=0, tokens=s.tokens[: s.prompt_length] + out.output_ids,
                           response_length=1, loss_mask=[1], rollout_log_probs=out.output_logprobs,
                           reward=0.0)
            mine = a.logprobs([probe])[0, s.prompt_length - 1]
            return abs(float(mine) - out.output_logprobs[0])
        finally:
            await engine.close()

    assert asyncio.run(engine_logprob_after_update()) < 1e-5


def test_a_mixture_of_experts_trains_resumes_and_exports(samples, tmp_path):
    """Qwen3-MoE (the tiny one scripts/make-tiny-moe.py writes) with its load-balancing loss on:
    a GRPO step moves it, a checkpoint resumes model, Adam moments and schedule exactly, and the
    export is a Qwen3-MoE folder whose transformers log-probs are the trainer's."""
    from transformers import AutoModelForCausalLM

    def moe_actor() -> MegatronActor:
        config = TrainerConfig(lr=1e-3, num_steps_per_rollout=2, global_batch_size=4,
                               moe_aux_loss_coeff=0.01)
        return MegatronActor(config, hf_checkpoint=build_tiny_moe_model(),
                             rollout_temperature=TEMPERATURE, total_steps=4)

    first = moe_actor()
    before = first.logprobs(samples)
    metrics = first.train(samples)
    assert math.isfinite(metrics["loss"]) and metrics["grad_norm"] > 0
    assert not torch.allclose(first.logprobs(samples), before)
    first.save_checkpoint(tmp_path / "ckpt", extra={"rollout_id": 0})
    resumed = moe_actor()
    assert resumed.load_checkpoint(tmp_path / "ckpt") == {"rollout_id": 0}
    assert torch.allclose(resumed.logprobs(samples), first.logprobs(samples), atol=1e-6)
    again, continued = resumed.train(samples), first.train(samples)
    for key in ("loss", "grad_norm", "lr"):
        assert again[key] == pytest.approx(continued[key], abs=1e-7), key

    first.save_hf(tmp_path / "hf")
    exported = AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    assert type(exported).__name__ == "Qwen3MoeForCausalLM"
    s = samples[0]
    with torch.no_grad():
        logits = exported(torch.tensor([s.tokens])).logits[0, :-1] / TEMPERATURE
    theirs = logits.log_softmax(-1).gather(-1, torch.tensor(s.tokens[1:])[:, None])[:, 0]
    trained = [s.prompt_length - 1 + i for i, m in enumerate(s.loss_mask) if m]  # where it computes
    mine = first.logprobs([s])[0, trained]
    torch.testing.assert_close(mine, theirs[trained], rtol=0, atol=1e-4)


def test_lora_on_a_mixture_of_experts_adapts_its_attention_as_peft_does(samples, tmp_path):
    """LoRA on Qwen3-MoE's attention projections (the experts are refused: see model_flags):
    the adapters train, and PEFT puts them on the base model to give the merged export."""
    import peft
    import transformers

    config = TrainerConfig(lr=1e-3, lora_rank=4, lora_target_modules="q_proj,k_proj,v_proj,o_proj")
    a = MegatronActor(config, hf_checkpoint=build_tiny_moe_model(), rollout_temperature=TEMPERATURE,
                      total_steps=2)
    assert a.train(samples)["grad_norm"] > 0
    adapter, merged = Path(a.save_adapter(tmp_path / "adapter")), tmp_path / "merged"
    a.save_hf(merged)
    load = transformers.AutoModelForCausalLM.from_pretrained
    on_base = peft.PeftModel.from_pretrained(load(build_tiny_moe_model(), dtype=torch.float32), str(adapter))
    ids = torch.tensor([samples[0].tokens[:40]])
    with torch.no_grad():
        torch.testing.assert_close(on_base.eval()(ids).logits, load(merged).eval()(ids).logits,
                                   rtol=0, atol=1e-5)


def _near_tied_moe(directory: Path) -> Path:
    """The tiny Qwen3-MoE with every router row within 1e-6 of the first: each token's top-2
    is decided by float rounding, which differs between the engine and the trainer."""
    from safetensors.torch import load_file, save_file

    shutil.copytree(build_tiny_moe_model(), directory)
    weights = load_file(directory / "model.safetensors")
    generator = torch.Generator().manual_seed(0)
    for name, w in weights.items():
        if name.endswith("mlp.gate.weight"):
            weights[name] = (w[0][None] + 1e-6 * torch.randn(w.shape, generator=generator)).contiguous()
    save_file(weights, directory / "model.safetensors", metadata={"format": "pt"})
    return directory


def test_routing_replay_gives_the_trainer_the_engines_logprobs_on_near_tied_routers(tmp_path):
    """Without replay the trainer routes near-tied tokens to other experts than the engine did
    and its log-probs drift from the rollout's; replaying the routes the engine recorded brings
    them back to float rounding. Gradients still reach the router through the replayed scores."""
    model = _near_tied_moe(tmp_path / "moe")
    rollout = play_look_episodes(model)
    for s in rollout:  # every position the engine ran, through three turns and two tool replies
        assert s.routed_experts is not None and s.routed_experts.positions == len(s.tokens) - 1
        s.reward = float(s.index % 2)
    trained = [[s.prompt_length - 1 + i for i, m in enumerate(s.loss_mask) if m] for s in rollout]
    mismatch = {}
    for replay in (False, True):
        a = MegatronActor(TrainerConfig(lr=1e-3, routing_replay=replay), hf_checkpoint=model,
                          rollout_temperature=TEMPERATURE, total_steps=1)
        logp = a.logprobs(rollout)
        diffs = torch.cat([(logp[row, positions] - torch.tensor(
            [lp for lp, m in zip(s.rollout_log_probs, s.loss_mask, strict=True) if m])).abs()
            for row, (s, positions) in enumerate(zip(rollout, trained, strict=True))])
        mismatch[replay] = float(diffs.mean())
        if replay:
            assert a.replayed_rows == [8, 8]
            router = a.hf_state_dict()["model.layers.0.mlp.gate.weight"]
            metrics = a.train(rollout)
            assert metrics["routing_replayed"] == 1.0 and metrics["grad_norm"] > 0
            assert not torch.equal(a.hf_state_dict()["model.layers.0.mlp.gate.weight"], router)
    assert mismatch[True] < 1e-5 < 1e-4 < mismatch[False], mismatch


def _tp2_worker(rank: int, port: int, data: str, out: str) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    samples = [Sample.from_json(line) for line in Path(data).read_text().splitlines()]
    a = actor(tensor_model_parallel_size=2, lr=1e-4, micro_batch_size=4)
    before = a.logprobs(samples)
    metrics = a.train(samples)
    after = a.logprobs(samples)
    # the TP=1 checkpoint (model, optimizer, schedule) resharded into this TP=2 actor
    resumed = actor(tensor_model_parallel_size=2, lr=1e-4, micro_batch_size=4)
    extra = resumed.load_checkpoint(Path(out) / "tp1-ckpt")
    loaded = resumed.logprobs(samples)
    next_metrics = resumed.train(samples)
    torch.save({"before": before, "after": after, "metrics": metrics, "loaded": loaded,
                "extra": extra, "step": resumed.step, "next": next_metrics},
               Path(out) / f"rank{rank}.pt")


def test_tensor_parallel_2_equals_1(samples, tmp_path):
    data = tmp_path / "samples.jsonl"
    data.write_text("".join(s.to_json() + "\n" for s in samples))
    single = actor(lr=1e-4, micro_batch_size=4)
    before = single.logprobs(samples)
    metrics = single.train(samples)
    after = single.logprobs(samples)
    single.save_checkpoint(tmp_path / "tp1-ckpt", extra={"rollout_id": 3})
    spawn(_tp2_worker, (free_port(), str(data), str(tmp_path)))
    next_metrics = single.train(samples)
    for rank in (0, 1):
        got = torch.load(tmp_path / f"rank{rank}.pt")
        assert torch.allclose(got["before"], before, atol=1e-5)
        for key in ("loss", "pg_loss", "ppo_kl", "grad_norm"):
            assert got["metrics"][key] == pytest.approx(metrics[key], abs=1e-5, rel=1e-5), key
        assert torch.allclose(got["after"], after, atol=1e-4)
        # resharded checkpoint: same weights, step and optimizer state as the TP=1 run
        assert got["extra"] == {"rollout_id": 3} and got["step"] == 2
        assert torch.allclose(got["loaded"], after, atol=1e-5)
        for key in ("loss", "grad_norm", "lr"):
            assert got["next"][key] == pytest.approx(next_metrics[key], abs=1e-5, rel=1e-5), key
    json.dumps(metrics)  # metrics are plain floats, ready for a JSONL log


def test_ppo_trains_a_critic_towards_the_returns(samples, tmp_path):
    a = actor(advantage_estimator="ppo", critic_lr=1e-3)
    assert torch.all(a.values(samples) == 0)  # a zero head: GAE starts from the plain reward
    losses = [a.train(samples)["value_loss"] for _ in range(6)]
    assert losses[0] == pytest.approx(0.25, abs=1e-6)  # 0.5 * mean((0 - r)^2), r in {0, 1}
    assert losses[-1] < losses[0] * 0.6, losses
    # the values moved from 0 to near the mean return (the rewards here are arbitrary labels, so
    # the mean is what a critic can learn about them)
    values = a.values(samples)
    mask = torch.zeros_like(values)
    for row, s in enumerate(samples):
        start = s.prompt_length - 1
        mask[row, start : start + s.response_length] = torch.tensor(s.loss_mask, dtype=torch.float32)
    mean_return = sum(s.reward for s in samples) / len(samples)
    assert abs(float((values * mask).sum() / mask.sum()) - mean_return) < 0.25
    a.save_checkpoint(tmp_path / "ppo")
    b = actor(advantage_estimator="ppo", critic_lr=1e-3)
    b.load_checkpoint(tmp_path / "ppo")
    assert torch.allclose(b.values(samples), values, atol=1e-6)
    assert b.train(samples)["value_loss"] == pytest.approx(a.train(samples)["value_loss"], rel=1e-5)


def test_sft_loss_learns_the_demonstrations():
    from transformers import AutoTokenizer

    from agentrl.rollout.demonstrations import conversation_sample
    from tests.unit.test_demonstrations import CONVERSATION

    renderer = ChatRenderer(AutoTokenizer.from_pretrained(str(build_tiny_model())))
    demos = [conversation_sample(renderer, CONVERSATION, group_id=i) for i in range(4)]
    a = MegatronActor(TrainerConfig(lr=1e-3, loss_type="sft_loss", micro_batch_size=2),
                      hf_checkpoint=build_tiny_model(), rollout_temperature=1.0)
    before = trained_logprobs(a, demos)
    losses = [a.train(demos)["sft_loss"] for _ in range(5)]
    assert losses[0] == pytest.approx(-float(before.mean()), rel=1e-4)  # NLL of the trained tokens
    assert losses[-1] < losses[0] - 0.5, losses  # nats per token
    assert torch.all(trained_logprobs(a, demos) > before)


def _dp2_worker(rank: int, port: int, data: str, out: str) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    samples = [Sample.from_json(line) for line in Path(data).read_text().splitlines()]
    a = actor(lr=1e-4, micro_batch_size=2, global_batch_size=4, num_steps_per_rollout=2,
              off_policy_correction="tis")
    assert (a.dp_rank, a.dp_size) == (rank, 2)
    metrics = a.train(samples)
    sft = actor(lr=1e-3, micro_batch_size=2, loss_type="sft_loss")
    sft_metrics = sft.train(samples)
    torch.save({"metrics": metrics, "after": a.logprobs(samples), "sft": sft_metrics,
                "sft_after": sft.logprobs(samples)}, Path(out) / f"dp-rank{rank}.pt")


def test_data_parallel_2_splits_the_batch_and_equals_1(samples, tmp_path):
    """Two data-parallel replicas each run half of every step's micro-batches; the update, the
    loss and every metric equal one replica running all of them. The rollout log-probs are
    shifted by row, so that the importance ratios' extremes lie on different replicas (row 0 on
    rank 0, row 7 on rank 1)."""
    samples = shifted(samples, [0.1 * row for row in range(len(samples))])
    data = tmp_path / "samples.jsonl"
    data.write_text("".join(s.to_json() + "\n" for s in samples))
    spawn(_dp2_worker, (free_port(), str(data), str(tmp_path)))
    single = actor(lr=1e-4, micro_batch_size=2, global_batch_size=4, num_steps_per_rollout=2,
                   off_policy_correction="tis")
    metrics = single.train(samples)
    assert metrics["is_ratio_min"] == pytest.approx(1.0, abs=1e-5)
    assert metrics["is_ratio_max"] == pytest.approx(math.exp(0.7), rel=1e-5)  # > 2: clipped
    row7 = samples[7].loss_mask.count(1) / sum(s.loss_mask.count(1) for s in samples)
    assert metrics["is_clipped_fraction"] == pytest.approx(row7, abs=1e-12)
    after = single.logprobs(samples)
    sft = actor(lr=1e-3, micro_batch_size=2, loss_type="sft_loss")
    sft_metrics = sft.train(samples)
    sft_after = sft.logprobs(samples)
    for rank in (0, 1):
        got = torch.load(tmp_path / f"dp-rank{rank}.pt")
        for key in ("loss", "pg_loss", "entropy", "clip_fraction", "ppo_kl", "grad_norm",
                    "logprob_abs_diff", "is_ratio_mean", "is_ratio_min", "is_ratio_max",
                    "is_clipped_fraction", "logprob_drift"):
            assert got["metrics"][key] == pytest.approx(metrics[key], abs=1e-5, rel=1e-4), key
        assert torch.allclose(got["after"], after, atol=1e-4)
        for key in ("sft_loss", "grad_norm"):
            assert got["sft"][key] == pytest.approx(sft_metrics[key], abs=1e-5, rel=1e-4), key
        assert torch.allclose(got["sft_after"], sft_after, atol=1e-4)


def _ep2_config() -> TrainerConfig:
    # 3 rows a micro-batch: 8 rows make 3 micro-batches, 2 on rank 0 and 1 (and an idle one) on rank 1
    return TrainerConfig(lr=1e-4, micro_batch_size=3, num_steps_per_rollout=2, global_batch_size=4)


def _ep2_worker(rank: int, port: int, data: str, out: str) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    samples = [Sample.from_json(line) for line in Path(data).read_text().splitlines()]
    config = dataclasses.replace(_ep2_config(), expert_model_parallel_size=2)
    a = MegatronActor(config, hf_checkpoint=build_tiny_moe_model(), rollout_temperature=TEMPERATURE,
                      total_steps=4)
    assert (a.ep_size, a.dp_size) == (2, 2)
    before = a.logprobs(samples)
    metrics = a.train(samples)
    a.save_checkpoint(Path(out) / "ep2-ckpt", extra={"rollout_id": 0})
    resumed = MegatronActor(config, hf_checkpoint=build_tiny_moe_model(), rollout_temperature=TEMPERATURE,
                            total_steps=4)
    assert resumed.load_checkpoint(Path(out) / "ep2-ckpt") == {"rollout_id": 0}
    torch.save({"before": before, "metrics": metrics, "after": a.logprobs(samples),
                "resumed": resumed.logprobs(samples), "export": a.hf_state_dict()},
               Path(out) / f"ep-rank{rank}.pt")


def test_expert_parallel_2_splits_the_experts_and_equals_1(samples, tmp_path):
    """Two ranks each hold half of every layer's experts and train half of each step's
    micro-batches (one rank runs an idle one to keep in step: the experts all-gather every
    rank's tokens); log-probs, the step's metrics, the weights after it and their export equal
    one process holding every expert; its checkpoint resumes at EP=2, and is refused at another
    size with the flag to use."""
    data = tmp_path / "samples.jsonl"
    data.write_text("".join(s.to_json() + "\n" for s in samples))
    spawn(_ep2_worker, (free_port(), str(data), str(tmp_path)))
    single = MegatronActor(_ep2_config(), hf_checkpoint=build_tiny_moe_model(),
                           rollout_temperature=TEMPERATURE, total_steps=4)
    before = single.logprobs(samples)
    metrics = single.train(samples)
    after, export = single.logprobs(samples), single.hf_state_dict()
    for rank in (0, 1):
        got = torch.load(tmp_path / f"ep-rank{rank}.pt")
        assert torch.allclose(got["before"], before, atol=1e-5)
        for key in ("loss", "pg_loss", "entropy", "grad_norm", "logprob_abs_diff"):
            assert got["metrics"][key] == pytest.approx(metrics[key], abs=1e-5, rel=1e-4), key
        assert torch.allclose(got["after"], after, atol=1e-4)
        assert torch.allclose(got["resumed"], got["after"], atol=1e-6)  # resumed at EP=2
        assert got["export"].keys() == export.keys()
        for name in export:  # Adam turns a near-zero gradient into a step of up to lr, whose
            # sign float rounding can flip (embeddings of unseen tokens): two runs then part by
            # up to 2 x lr a step, over 2 steps
            assert float((got["export"][name] - export[name]).abs().max()) <= 4e-4, name
    with pytest.raises(ConfigError, match=r"was saved with --expert-model-parallel-size 2; this run has 1"):
        single.load_checkpoint(tmp_path / "ep2-ckpt")


def test_trainer_logprobs_equal_those_the_gateway_recorded():
    """An openai-client agent through the gateway (3 turns, then a rewritten history: two
    segments, both trained with ``all``): the trainer's log-probs of every sampled token equal
    the engine's, as the gateway recorded them."""
    import openai

    from agentrl.gateway import Gateway

    async def play() -> list[Sample]:
        engine = EmbeddedEngine.from_pretrained(build_tiny_model(), max_batch_size=8)
        renderer = ChatRenderer(engine.tokenizer, "hermes")
        sampling = SamplingParams(max_new_tokens=10, temperature=TEMPERATURE,
                                  stop_token_ids=tuple(renderer.encode(renderer.end_of_turn)))
        out: list[Sample] = []
        try:
            async with Gateway(engine, renderer, sampling, 512) as gateway:
                for g in range(2):
                    session = gateway.open_session(f"gw{g}-s0")
                    client = openai.AsyncOpenAI(base_url=gateway.base_url(session), api_key="x")
                    messages = [{"role": "user", "content": f"Task {g}: look around."}]
                    for _ in range(3):
                        reply = await client.chat.completions.create(model=gateway.model,
                                                                     messages=messages)
                        messages += [reply.choices[0].message.model_dump(exclude_none=True),
                                     {"role": "user", "content": "and then?"}]
                    messages = [messages[0], {"role": "user", "content": "Summary: a room."}]
                    await client.chat.completions.create(model=gateway.model, messages=messages)
                    await client.close()
                    out += session.samples(Sample(group_id=g, reward=float(g)), "all")
        finally:
            await engine.close()
        return out

    samples = asyncio.run(play())
    assert len(samples) == 4 and [s.metadata["segment"] for s in samples] == [0, 1, 0, 1]
    logp = actor().logprobs(samples)
    worst = 0.0
    for row, s in enumerate(samples):
        start = s.prompt_length - 1
        mine = logp[row, start : start + s.response_length]
        mask = torch.tensor(s.loss_mask, dtype=torch.bool)
        worst = max(worst, float((mine[mask] - torch.tensor(s.rollout_log_probs)[mask]).abs().max()))
    assert worst < 1e-5, worst


HOST_READS = ("item", "tolist", "cpu", "__float__", "__int__", "__bool__")
"""The tensor methods that read a value back to the host (on a GPU: a synchronisation)."""


def host_reads_in_a_train_call(samples: list[Sample], monkeypatch, **flags) -> int:
    trainer = actor(**flags)
    count = 0

    def counting(name):
        original = getattr(torch.Tensor, name)

        def wrapper(self, *args, **kwargs):
            nonlocal count
            count += 1
            return original(self, *args, **kwargs)
        return wrapper

    with monkeypatch.context() as patch:
        for name in HOST_READS:
            patch.setattr(torch.Tensor, name, counting(name))
        trainer.train(samples)
    return count


def test_a_steps_host_reads_do_not_grow_with_its_micro_batches(samples, monkeypatch):
    """Metrics stay on the device through the micro-batch loop and cross to the host once per
    step: 8 micro-batches of 1 sample read the host as often as 2 of 4."""
    many = host_reads_in_a_train_call(samples, monkeypatch, micro_batch_size=1, global_batch_size=8)
    few = host_reads_in_a_train_call(samples, monkeypatch, micro_batch_size=4, global_batch_size=8)
    assert many == few, (many, few)


def test_the_head_at_trained_positions_only_equals_the_head_everywhere(samples):
    """The LM head and log-softmax run only where the mask trains a token: the log-probs,
    entropies and gradients equal those of the head run at every position, and the output
    layer saw exactly the trained positions."""
    from agentrl.trainer.batch import build_batch
    from agentrl.trainer.hf_convert import unwrap_model
    from agentrl.trainer.trained_positions import trained_token_logprobs

    trainer = actor()
    batch = build_batch(samples)
    seen = []
    layer = unwrap_model(trainer.model).output_layer
    handle = layer.register_forward_hook(lambda module, args, out: seen.append(args[0].shape[:2]))
    results = {}
    try:
        for every in (False, True):
            trainer.ddp.zero_grad_buffer()  # DDP accumulates into main_grad
            trainer.model.zero_grad()
            logp, ent = trained_token_logprobs(
                trainer.model, batch.tokens, batch.mask, vocab_size=trainer.vocab_size,
                temperature=TEMPERATURE, chunk_size=None, entropy=True, every_position=every)
            (logp.sum() + 0.1 * ent.sum()).backward()
            grads = [p.main_grad.clone() if getattr(p, "main_grad", None) is not None else p.grad.clone()
                     for p in trainer.model.parameters() if p.requires_grad]
            results[every] = (logp.detach(), ent.detach(), grads)
    finally:
        handle.remove()
    trained = int(batch.mask.sum())
    assert seen[0] == (trained, 1) and seen[1] == batch.tokens.T.shape  # n positions, then all
    (lp, en, gr), (lp_all, en_all, gr_all) = results[False], results[True]
    assert torch.allclose(lp, lp_all, atol=1e-5) and torch.allclose(en, en_all, atol=1e-5)
    assert all(torch.allclose(a, b, atol=1e-5) for a, b in zip(gr, gr_all, strict=True))


@pytest.mark.parametrize("layout", ["sbhd", "thd"])
def test_packed_micro_batches_give_the_padded_logprobs_and_gradients(layout):
    """Rows concatenated without padding (positions restarting, attention within each row)
    give the padded batch's per-token log-probs, entropies and gradients, in agentrl's packed
    form and in Megatron's thd form (the one Transformer Engine's attention reads)."""
    from agentrl.trainer.batch import build_batch
    from agentrl.trainer.trained_positions import packed_trained_logprobs, trained_token_logprobs

    trainer = actor()
    batch = build_batch(uneven_samples())
    results = {}
    for packed in (False, True):
        trainer.ddp.zero_grad_buffer()
        trainer.model.zero_grad()
        if packed:
            logp, ent = packed_trained_logprobs(
                trainer.model, batch.tokens, batch.lengths.tolist(), batch.mask, device=trainer.device,
                vocab_size=trainer.vocab_size, temperature=TEMPERATURE, chunk_size=None, entropy=True,
                layout=layout)
        else:
            logp, ent = trained_token_logprobs(
                trainer.model, batch.tokens, batch.mask, vocab_size=trainer.vocab_size,
                temperature=TEMPERATURE, chunk_size=None, entropy=True)
        (logp.sum() + 0.1 * ent.sum()).backward()
        grads = [p.main_grad.clone() if getattr(p, "main_grad", None) is not None else p.grad.clone()
                 for p in trainer.model.parameters() if p.requires_grad]
        results[packed] = (logp.detach(), ent.detach(), grads)
    (lp, en, gr), (lp_packed, en_packed, gr_packed) = results[False], results[True]
    assert len(set(batch.lengths.tolist())) > 1  # rows of different lengths: padding matters
    assert (lp_packed - lp).abs().max() <= 1e-5 and (en_packed - en).abs().max() <= 1e-5
    assert all(torch.allclose(a, b, atol=1e-5) for a, b in zip(gr, gr_packed, strict=True))


def _packed_tp2_worker(rank: int, port: int, data: str, out: str) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    samples = [Sample.from_json(line) for line in Path(data).read_text().splitlines()]
    a = actor(tensor_model_parallel_size=2, lr=1e-4, use_dynamic_batch_size=True, max_tokens_per_gpu=90)
    before = a.logprobs(samples)
    metrics = a.train(samples)
    fixed = actor(tensor_model_parallel_size=2, lr=1e-4, micro_batch_size=2).train(samples)
    torch.save({"before": before, "metrics": metrics, "after": a.logprobs(samples), "fixed": fixed},
               Path(out) / f"packed-rank{rank}.pt")


def test_packed_steps_equal_across_micro_batchings_and_tp_2(tmp_path):
    """Steps on packed micro-batches (rows of different lengths) chosen by a budget of 90 real
    tokens equal those on packed micro-batches of 2 rows, at TP=1 and, vocabulary and heads
    sharded, at TP=2 (packed = padded itself: the test above, gradients included)."""
    samples = uneven_samples()
    padded = actor(lr=1e-4, micro_batch_size=2)
    before = padded.logprobs(samples)
    metrics = padded.train(samples)
    after = padded.logprobs(samples)
    packed = actor(lr=1e-4, use_dynamic_batch_size=True, max_tokens_per_gpu=90)
    assert any(len(m) > 1 for m in packed._micro(build_batch_of(samples)))  # rows really share a pack
    assert torch.allclose(packed.logprobs(samples), before, atol=1e-5)
    packed_metrics = packed.train(samples)
    for key in ("loss", "pg_loss", "grad_norm", "entropy"):
        assert packed_metrics[key] == pytest.approx(metrics[key], abs=1e-5, rel=1e-5), key
    assert torch.allclose(packed.logprobs(samples), after, atol=1e-4)
    data = tmp_path / "samples.jsonl"
    data.write_text("".join(s.to_json() + "\n" for s in samples))
    spawn(_packed_tp2_worker, (free_port(), str(data), str(tmp_path)))
    for rank in (0, 1):
        got = torch.load(tmp_path / f"packed-rank{rank}.pt")
        assert torch.allclose(got["before"], before, atol=1e-5)
        for key in ("loss", "pg_loss", "grad_norm"):  # budget = fixed micro-batches, both at TP=2
            assert got["metrics"][key] == pytest.approx(got["fixed"][key], abs=1e-6, rel=1e-6), key
        # and TP=2 = TP=1, to the precision TP's sharded sums keep on this batch (~4e-5 of the
        # gradient norm, padded as packed)
        for key in ("loss", "pg_loss", "grad_norm"):
            assert got["metrics"][key] == pytest.approx(metrics[key], abs=1e-5, rel=1e-4), key
        assert torch.allclose(got["after"], after, atol=1e-4)


def build_batch_of(samples: list[Sample]):
    from agentrl.trainer.batch import build_batch

    return build_batch(samples)
