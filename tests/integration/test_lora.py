"""LoRA adapters on the Megatron actor (CPU, tiny model): the adapted forward is W x + (alpha/r) B A x
by hand, step 0 equals the base, only adapters get gradients and change, every loss trains
with them, exports merge them, and TP=2 equals TP=1."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from agentrl.errors import ConfigError
from agentrl.models import build_tiny_model
from agentrl.records.sample import Sample
from agentrl.run.export import export_hf
from agentrl.trainer.actor import MegatronActor
from agentrl.trainer.config import TrainerConfig, lora_targets
from agentrl.trainer.lora import lora_modules
from tests.support.distributed import free_port, spawn
from tests.support.trainer_samples import uneven_samples

TEMPERATURE = 0.8
LORA = {"lora_rank": 4, "lora_alpha": 8.0}


def actor(**flags) -> MegatronActor:
    config = TrainerConfig(**{"lr": 1e-3, **flags})
    return MegatronActor(config, hf_checkpoint=build_tiny_model(), rollout_temperature=TEMPERATURE,
                         total_steps=4)


def adapters(a: MegatronActor) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in a.model.named_parameters() if "lora_" in n}


def base(a: MegatronActor) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in a.model.named_parameters() if "lora_" not in n}


def test_the_adapted_forward_is_w_plus_scaled_b_a_by_hand():
    a = actor(**LORA)
    generator = torch.Generator().manual_seed(3)
    for name, module in lora_modules(a.model):
        with torch.no_grad():
            module.lora_b.copy_(torch.randn(module.lora_b.shape, generator=generator))
        x = torch.randn(5, 2, module.weight.shape[1], generator=generator)  # [s, b, in]
        out, _ = module(x)
        w, lora_a, lora_b = module.weight.detach(), module.lora_a.detach(), module.lora_b.detach()
        expected = x @ w.T + (8.0 / 4) * (x @ lora_a.T) @ lora_b.T
        assert torch.allclose(out, expected, atol=1e-5), name
    names = [n for n, _ in lora_modules(a.model)]
    assert len(names) == 4 * 4  # 4 decoder layers x qkv, proj, fc1, fc2 (all-linear)


def test_step_zero_equals_the_base_and_only_adapters_train():
    samples = uneven_samples()
    plain = actor()
    adapted = actor(**LORA)
    assert torch.equal(adapted.logprobs(samples), plain.logprobs(samples))  # B = 0
    trainable = [n for n, p in adapted.model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    optimized = sum(p.numel() for g in adapted.optimizer.param_groups for p in g["params"])
    assert optimized == sum(p.numel() for _, p in adapted.model.named_parameters() if p.requires_grad)
    before_base, before_adapters = base(adapted), adapters(adapted)
    metrics = adapted.train(samples)
    assert metrics["grad_norm"] > 0
    assert all(torch.equal(before_base[n], p) for n, p in base(adapted).items())
    changed = [n for n, p in adapters(adapted).items() if not torch.equal(before_adapters[n], p)]
    assert any(".lora_b" in n for n in changed)
    assert not torch.equal(adapted.logprobs(samples), plain.logprobs(samples))


@pytest.mark.parametrize("flags", [
    {"advantage_estimator": "grpo"},
    {"advantage_estimator": "gspo"},
    {"advantage_estimator": "ppo", "critic_lr": 1e-3},
    {"loss_type": "sft_loss"},
    {"advantage_estimator": "grpo", "use_kl_loss": True, "kl_loss_coef": 0.1, "lora_dropout": 0.1},
], ids=["grpo", "gspo", "ppo", "sft", "grpo-kl-dropout"])
def test_every_loss_trains_the_adapters_only(flags):
    samples = uneven_samples()
    a = actor(**LORA, **flags)
    before = base(a)
    metrics = a.train(samples)
    assert all(v == v for v in metrics.values()), metrics  # no NaN
    assert all(torch.equal(before[n], p) for n, p in base(a).items())
    if a.ref_model is not None:  # the reference is the base model, without adapters
        assert not any("lora_" in n for n, _ in a.ref_model.named_parameters())


def test_exports_merge_the_adapters_and_transformers_agrees():
    """After a step, the Hugging Face export (what the engines load) holds W + (alpha/r) B A,
    and transformers' model on it gives the trainer's log-probs."""
    import transformers

    samples = uneven_samples(4)
    a = actor(**LORA)
    a.train(samples)
    exported = a.hf_state_dict()
    module = a.model.decoder.layers[0].mlp.linear_fc2
    merged = module.weight + 2.0 * module.lora_b @ module.lora_a
    assert torch.allclose(exported["model.layers.0.mlp.down_proj.weight"], merged.detach(), atol=1e-6)
    config = transformers.AutoConfig.from_pretrained(build_tiny_model())
    hf = transformers.AutoModelForCausalLM.from_config(config).float().eval()
    missing, unexpected = hf.load_state_dict(exported, strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}
    hf.tie_weights()
    ours = a.logprobs(samples)
    for row, s in enumerate(samples):
        ids = torch.tensor([s.tokens])
        with torch.no_grad():
            logits = hf(ids).logits[0, :-1] / TEMPERATURE
        theirs = torch.log_softmax(logits.float(), -1).gather(1, ids[0, 1:, None])[:, 0]
        start = s.prompt_length - 1
        span = slice(start, start + s.response_length)
        mask = torch.tensor(s.loss_mask, dtype=torch.bool)
        assert torch.allclose(ours[row, span][mask], theirs[span][mask], atol=1e-4)


def _tp2_worker(rank: int, port: int, data: str, out: str) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    samples = [Sample.from_json(line) for line in Path(data).read_text().splitlines()]
    a = actor(tensor_model_parallel_size=2, micro_batch_size=2, **LORA)
    metrics = a.train(samples)
    resumed = actor(tensor_model_parallel_size=2, micro_batch_size=2, **LORA)
    resumed.load_checkpoint(Path(out) / "tp1-ckpt")  # adapters and their optimizer, resharded
    torch.save({"metrics": metrics, "after": a.logprobs(samples), "export": a.hf_state_dict(),
                "resumed": resumed.logprobs(samples)}, Path(out) / f"lora-rank{rank}.pt")


def test_tensor_parallel_2_trains_the_same_adapters_as_tp1_and_resumes_its_checkpoint(tmp_path):
    samples = uneven_samples()
    single = actor(micro_batch_size=2, **LORA)
    metrics = single.train(samples)
    after, export = single.logprobs(samples), single.hf_state_dict()
    single.save_checkpoint(tmp_path / "tp1-ckpt")
    data = tmp_path / "samples.jsonl"
    data.write_text("".join(s.to_json() + "\n" for s in samples))
    spawn(_tp2_worker, (free_port(), str(data), str(tmp_path)))
    for rank in (0, 1):
        got = torch.load(tmp_path / f"lora-rank{rank}.pt")
        for key in ("loss", "pg_loss", "grad_norm"):
            assert got["metrics"][key] == pytest.approx(metrics[key], abs=1e-5, rel=1e-4), key
        assert torch.allclose(got["after"], after, atol=1e-4)
        assert torch.allclose(got["resumed"], after, atol=1e-5), (got["resumed"] - after).abs().max()  # a TP=1 checkpoint at TP=2
        for name, tensor in export.items():
            assert torch.allclose(got["export"][name], tensor, atol=1e-5), name


def test_lora_flags_are_checked_with_the_flag_named():
    assert lora_targets("all-linear") == ("self_attention.linear_qkv", "self_attention.linear_proj",
                                          "mlp.linear_fc1", "mlp.linear_fc2")
    assert lora_targets("o_proj, down_proj") == ("self_attention.linear_proj", "mlp.linear_fc2")
    for flags, message in (
        ({"lora_target_modules": "q_proj,v_proj"}, r"q_proj, k_proj, v_proj are one fused layer .*linear_qkv"),
        ({"lora_target_modules": "q_lin"}, r"--lora-target-modules: unknown q_lin"),
        ({"lora_dropout": 1.0}, r"--lora-dropout must be in \[0, 1\)"),
        ({"lora_alpha": 0.0}, r"--lora-alpha must be > 0"),
        ({"sequence_parallel": True}, r"--lora-rank does not work with --sequence-parallel"),
    ):
        with pytest.raises(ConfigError, match=message):
            TrainerConfig(**{**LORA, **flags}).validate()
    with pytest.raises(ConfigError, match=r"--lora-lr has no effect without --lora-rank"):
        TrainerConfig(lora_lr=1e-4).validate()
    with pytest.raises(ConfigError, match=r"--lora-rank must be >= 0"):
        TrainerConfig(lora_rank=-1).validate()


def test_the_peft_export_loads_with_peft_onto_the_base_with_the_trainers_logits(tmp_path):
    """The adapters in PEFT's format (adapter_config.json + adapter_model.safetensors) load
    with the real peft onto the Hugging Face base model; its log-probs equal the trainer's,
    and the merged export beside it equals peft's merge."""
    import peft
    import transformers

    samples = uneven_samples(4)
    a = actor(**LORA, lora_target_modules="q_proj,k_proj,v_proj,down_proj")
    a.train(samples)
    export = export_hf(a, tmp_path / "export", build_tiny_model(), chat_template=None, lora=True)
    adapter = export.adapter
    config = json.loads((adapter / "adapter_config.json").read_text())
    assert config["target_modules"] == ["down_proj", "k_proj", "q_proj", "v_proj"]
    assert (config["r"], config["lora_alpha"]) == (4, 8.0)
    base_model = transformers.AutoModelForCausalLM.from_pretrained(build_tiny_model(), dtype=torch.float32)
    model = peft.PeftModel.from_pretrained(base_model, str(adapter)).eval()
    ours = a.logprobs(samples)
    for row, s in enumerate(samples):
        ids = torch.tensor([s.tokens])
        with torch.no_grad():
            logits = model(input_ids=ids).logits[0, :-1] / TEMPERATURE
        theirs = torch.log_softmax(logits.float(), -1).gather(1, ids[0, 1:, None])[:, 0]
        start = s.prompt_length - 1
        span = slice(start, start + s.response_length)
        mask = torch.tensor(s.loss_mask, dtype=torch.bool)
        assert torch.allclose(ours[row, span][mask], theirs[span][mask], atol=1e-4)
    merged = model.merge_and_unload().state_dict()
    exported = transformers.AutoModelForCausalLM.from_pretrained(export.model, dtype=torch.float32).state_dict()
    for name in ("model.layers.1.self_attn.k_proj.weight", "model.layers.2.mlp.down_proj.weight"):
        assert torch.allclose(merged[name], exported[name], atol=1e-6), name


def test_a_resumed_lora_run_equals_an_uninterrupted_one(tmp_path):
    samples = uneven_samples(8)
    first = actor(**LORA, num_steps_per_rollout=2, global_batch_size=4)
    first.train(samples)
    first.save_checkpoint(tmp_path / "ckpt", extra={"rollout_id": 0})
    resumed = actor(**LORA, num_steps_per_rollout=2, global_batch_size=4)
    assert resumed.load_checkpoint(tmp_path / "ckpt") == {"rollout_id": 0}
    assert all(torch.equal(p, adapters(first)[n]) for n, p in adapters(resumed).items())
    again, continued = resumed.train(samples), first.train(samples)
    for key in ("loss", "grad_norm", "lr"):
        assert again[key] == pytest.approx(continued[key], abs=1e-7), key
    assert torch.allclose(resumed.logprobs(samples), first.logprobs(samples), atol=1e-6)
