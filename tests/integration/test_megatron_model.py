"""Megatron GPTModel from Hugging Face checkpoints: logits, weight round trips, TP=2, log-probs.

Small random models (vocab 300, padded to 384; hidden 64; 2 layers) and the built-in tiny
Qwen2. Tensor parallelism runs in two spawned gloo processes; one spawn does every TP=2 check
and writes its results to files the test compares with the in-process TP=1 run.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from agentrl.errors import ConfigError
from agentrl.trainer import distributed
from agentrl.trainer.distributed import destroy_model_parallel, init_model_parallel
from agentrl.trainer.hf_convert import (
    build_gpt_model,
    padded_vocab_size,
    transformer_config_from_hf,
)
from agentrl.trainer.hf_weights import (
    WeightMappingError,
    export_hf_state_dict,
    load_hf_weights,
    read_hf_state_dict,
    save_hf_checkpoint,
)
from agentrl.trainer.model_flags import check_model_flags
from agentrl.trainer.vocab_parallel import vocab_parallel_entropy, vocab_parallel_logprobs
from tests.support.distributed import free_port, spawn

pytestmark = pytest.mark.skipif(
    torch.cuda.is_available(), reason="CPU-tier Megatron tests; this machine has CUDA"
)

VOCAB, PADDED = 300, 384
TEMPERATURE = 0.7
KINDS = ("qwen2", "llama", "qwen3", "qwen3_moe")


@pytest.fixture(scope="module")
def tp1() -> Iterator[None]:
    init_model_parallel(1, 1)
    yield
    destroy_model_parallel()


def hf_model(kind: str, tie: bool, seed: int = 0) -> tuple[torch.nn.Module, dict[str, Any]]:
    """A random transformers model of ``kind`` and its config dict."""
    import transformers

    config_cls, model_cls = {
        "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM),
        "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
        "qwen3": (transformers.Qwen3Config, transformers.Qwen3ForCausalLM),
        "qwen3_moe": (transformers.Qwen3MoeConfig, transformers.Qwen3MoeForCausalLM),
    }[kind]
    extra: dict[str, Any] = {"head_dim": 24} if kind.startswith("qwen3") else {}  # != hidden / heads
    if kind == "qwen3_moe":  # 4 experts of width 32, 2 per token
        extra.update(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, norm_topk_prob=True)
    config = config_cls(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
        tie_word_embeddings=tie, rope_theta=10000.0, rms_norm_eps=1e-6, **extra,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = model_cls(config).float().eval()
    return model, config.to_dict()


def inputs(seed: int = 0, batch: int = 2, seq: int = 20) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, VOCAB, (batch, seq), generator=generator)
    return ids, torch.arange(seq).expand(batch, seq)


def plain_logprobs(logits: torch.Tensor, targets: torch.Tensor, vocab: int) -> torch.Tensor:
    """The reference: log_softmax over the real vocabulary, gathered at the targets."""
    logp = torch.log_softmax(logits[..., :vocab].float() / TEMPERATURE, dim=-1)
    return logp.gather(-1, targets[..., None])[..., 0]


def plain_entropy(logits: torch.Tensor, vocab: int) -> torch.Tensor:
    logp = torch.log_softmax(logits[..., :vocab].float() / TEMPERATURE, dim=-1)
    return -(logp.exp() * logp).sum(-1)


def export_grads(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Gradients under Hugging Face names (export of a model whose weights hold its grads)."""
    params = list(model.parameters())
    saved = [p.detach().clone() for p in params]
    with torch.no_grad():
        for p in params:
            p.copy_(p.main_grad if hasattr(p, "main_grad") else p.grad)
        grads = export_hf_state_dict(model)
        for p, s in zip(params, saved, strict=True):
            p.copy_(s)
    return grads


def rl_loss(logits: torch.Tensor, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, Any]:
    """(loss, per-token logprobs, entropy) of a policy-gradient-like loss on the shards."""
    targets = ids.roll(-1, dims=1)
    logp = vocab_parallel_logprobs(
        logits, targets, vocab_size=VOCAB, temperature=TEMPERATURE, chunk_size=7
    )
    entropy = vocab_parallel_entropy(
        logits, vocab_size=VOCAB, temperature=TEMPERATURE, chunk_size=5
    )
    weights = torch.linspace(-1.0, 1.0, logp.numel()).reshape(logp.shape)
    return -(weights * logp).mean() - 0.01 * entropy.mean(), logp, entropy


def adam_step(
    model: torch.nn.Module, ids: torch.Tensor, pos: torch.Tensor
) -> tuple[float, dict[str, torch.Tensor]]:
    """One Megatron DDP + Adam step (clipping active) on :func:`rl_loss`; returns the gradient
    norm and the new weights (exported through the DDP wrapper)."""
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

    ddp = DistributedDataParallel(model.config, DistributedDataParallelConfig(), model)
    optimizer = get_megatron_optimizer(
        OptimizerConfig(optimizer="adam", lr=1e-2, clip_grad=1e-3), [ddp]
    )
    ddp.zero_grad_buffer()
    optimizer.zero_grad()
    rl_loss(ddp(ids, pos, None), ids)[0].backward()
    ok, grad_norm, _ = optimizer.step()
    assert ok
    return float(grad_norm), export_hf_state_dict(ddp)


# --- TP=1 against transformers -----------------------------------------------------------------


@pytest.mark.parametrize("tie", [False, True], ids=["untied", "tied"])
@pytest.mark.parametrize("kind", KINDS)
def test_logits_match_transformers_and_round_trip(
    tp1: None, kind: str, tie: bool, tmp_path: Path
) -> None:
    from transformers import AutoModelForCausalLM

    reference, raw = hf_model(kind, tie)
    model = build_gpt_model(raw)
    assert model.share_embeddings_and_output_weights is tie
    load_hf_weights(model, reference.state_dict())
    ids, pos = inputs()
    with torch.no_grad():
        expected = reference(ids).logits
        logits = model(ids, pos, None)
    assert logits.shape == (2, 20, PADDED)
    torch.testing.assert_close(logits[..., :VOCAB], expected, rtol=0, atol=1e-5)

    exported = export_hf_state_dict(model)
    reference.save_pretrained(tmp_path / "reference")  # the names of checkpoint files (per expert)
    wanted = {
        k: v for k, v in read_hf_state_dict(tmp_path / "reference").items()
        if not (tie and k == "lm_head.weight")
    }
    assert exported.keys() == wanted.keys()
    for name, tensor in wanted.items():
        assert torch.equal(exported[name], tensor), name

    save_hf_checkpoint(model, raw, tmp_path / "hf")
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    with torch.no_grad():
        torch.testing.assert_close(reloaded(ids).logits, expected, rtol=0, atol=1e-5)


def test_tiny_model_loads_from_its_directory_and_saves_with_tokenizer(
    tp1: None, tmp_path: Path
) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from agentrl.models import build_tiny_model

    source = build_tiny_model()
    reference = AutoModelForCausalLM.from_pretrained(source).float().eval()
    model = build_gpt_model(source)
    load_hf_weights(model, source)
    tokenizer = AutoTokenizer.from_pretrained(source)
    ids = torch.tensor([tokenizer.encode("hello world, this is the tiny model")])
    pos = torch.arange(ids.shape[1])[None]
    vocab = reference.config.vocab_size
    with torch.no_grad():
        expected = reference(ids).logits
        torch.testing.assert_close(model(ids, pos, None)[..., :vocab], expected, rtol=0, atol=1e-5)

    out = save_hf_checkpoint(model, source, tmp_path / "out", tokenizer_dir=source)
    assert (out / "tokenizer.json").is_file() and (out / "generation_config.json").is_file()
    reloaded = AutoModelForCausalLM.from_pretrained(out).eval()
    assert AutoTokenizer.from_pretrained(out).encode("hello") == tokenizer.encode("hello")
    with torch.no_grad():
        torch.testing.assert_close(reloaded(ids).logits, expected, rtol=0, atol=1e-5)


# --- vocab-parallel log-probs at TP=1 ---------------------------------------------------------


@pytest.mark.parametrize("chunk_size", [None, 3, 1])
def test_vocab_parallel_logprobs_and_entropy_equal_the_plain_formula(
    tp1: None, chunk_size: int | None
) -> None:
    generator = torch.Generator().manual_seed(1)
    logits = torch.randn(2, 5, PADDED, generator=generator) * 3
    logits[..., VOCAB:] = 50.0  # padding must not count, however large its logits
    targets = torch.randint(0, VOCAB, (2, 5), generator=generator)
    upstream = torch.randn(2, 5, generator=generator)

    mine = logits.clone().requires_grad_()
    logp = vocab_parallel_logprobs(
        mine, targets, vocab_size=VOCAB, temperature=TEMPERATURE, chunk_size=chunk_size
    )
    entropy = vocab_parallel_entropy(
        mine, vocab_size=VOCAB, temperature=TEMPERATURE, chunk_size=chunk_size
    )
    (logp * upstream + 0.3 * entropy * upstream).sum().backward()

    plain = logits.clone().requires_grad_()
    ref_logp, ref_entropy = plain_logprobs(plain, targets, VOCAB), plain_entropy(plain, VOCAB)
    (ref_logp * upstream + 0.3 * ref_entropy * upstream).sum().backward()

    torch.testing.assert_close(logp, ref_logp, rtol=0, atol=1e-5)
    torch.testing.assert_close(entropy, ref_entropy, rtol=0, atol=1e-5)
    torch.testing.assert_close(mine.grad, plain.grad, rtol=0, atol=1e-5)
    assert torch.all(mine.grad[..., VOCAB:] == 0)


def test_vocab_parallel_logprobs_reject_bad_inputs(tp1: None) -> None:
    logits = torch.zeros(1, 3, PADDED)
    with pytest.raises(ValueError, match="targets"):
        vocab_parallel_logprobs(logits, torch.tensor([[0, 1, VOCAB]]), vocab_size=VOCAB)
    with pytest.raises(ValueError, match="temperature"):
        vocab_parallel_logprobs(logits, torch.zeros(1, 3, dtype=torch.long), vocab_size=VOCAB,
                                temperature=0.0)
    with pytest.raises(ValueError, match="vocab_size"):
        vocab_parallel_entropy(logits, vocab_size=PADDED + 1)


# --- TP=2 in two processes ---------------------------------------------------------------------


def _tp2_worker(rank: int, port: int, hf_dir: str, ckpt_dir: str, out_dir: str) -> None:
    """Every TP=2 check in one process start (the dense model's, then the Qwen3-MoE's under
    ``out_dir/moe``); results go to ``out_dir/rank{rank}.pt``."""
    os.environ.update(RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    torch.set_num_threads(1)
    from megatron.core import dist_checkpointing

    init_model_parallel(2, 1)
    results: dict[str, Any] = {}
    model = build_gpt_model(hf_dir)
    load_hf_weights(model, hf_dir)
    ids, pos = inputs()
    logits = model(ids, pos, None)  # this rank's vocab shard
    assert logits.shape == (2, 20, PADDED // 2)
    with torch.no_grad():
        results["gathered_logits"] = model(ids, pos, None, runtime_gather_output=True)
    loss, results["logp"], results["entropy"] = rl_loss(logits, ids)
    loss.backward()
    results["grads"] = export_grads(model)
    results["export"] = export_hf_state_dict(model)
    results["grad_norm"], results["after_step"] = adam_step(model, ids, pos)

    # A TP=1 Megatron checkpoint, resharded into this TP=2 model.
    restored = build_gpt_model(hf_dir)
    restored.load_state_dict(dist_checkpointing.load(restored.sharded_state_dict(), ckpt_dir))
    with torch.no_grad():
        results["restored_logits"] = restored(ids, pos, None, runtime_gather_output=True)

    # Qwen3-MoE: experts split over TP like dense MLPs, the router whole on each rank. Inference
    # only: megatron's MoE layer refuses to train at TP > 1 without sequence parallelism.
    moe = Path(out_dir) / "moe"
    moe_model = build_gpt_model(moe / "hf").eval()
    load_hf_weights(moe_model, moe / "hf")
    moe_restored = build_gpt_model(moe / "hf").eval()
    moe_restored.load_state_dict(dist_checkpointing.load(moe_restored.sharded_state_dict(), str(moe / "ckpt")))
    with torch.no_grad():
        results["moe_logits"] = moe_model(ids, pos, None, runtime_gather_output=True)
        results["moe_restored_logits"] = moe_restored(ids, pos, None, runtime_gather_output=True)
    results["moe_export"] = export_hf_state_dict(moe_model)

    # Synthetic logits split by hand; with vocab 180, rank 1's shard is all padding.
    generator = torch.Generator().manual_seed(2)
    full = torch.randn(3, 4, PADDED, generator=generator) * 3
    for vocab in (VOCAB, 180):
        targets = torch.randint(0, vocab, (3, 4), generator=generator)
        shard = full.chunk(2, dim=-1)[rank].clone().requires_grad_()
        logp = vocab_parallel_logprobs(shard, targets, vocab_size=vocab,
                                       temperature=TEMPERATURE, chunk_size=5)
        entropy = vocab_parallel_entropy(shard, vocab_size=vocab, temperature=TEMPERATURE)
        (logp.sum() + entropy.sum()).backward()
        results[f"synthetic_{vocab}"] = (full, targets, logp.detach(), entropy.detach(), shard.grad)
    torch.save(results, Path(out_dir) / f"rank{rank}.pt")
    destroy_model_parallel()


def _moe_reference(directory: Path) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """A Qwen3-MoE saved under ``directory`` (``hf/``, and a TP=1 Megatron checkpoint in
    ``ckpt/``) with its TP=1 logits and export."""
    from megatron.core import dist_checkpointing

    reference, raw = hf_model("qwen3_moe", tie=False, seed=3)
    reference.save_pretrained(directory / "hf")
    model = build_gpt_model(raw).eval()
    load_hf_weights(model, directory / "hf")
    (directory / "ckpt").mkdir()
    dist_checkpointing.save(model.sharded_state_dict(), str(directory / "ckpt"))
    with torch.no_grad():
        logits = model(*inputs(), None)
    return logits, export_hf_state_dict(model)


def test_tensor_parallel_2_equals_tp1(tp1: None, tmp_path: Path) -> None:
    """At TP=2, against TP=1: logits, log-probs, gradients, an Adam step, the export and a
    resharded TP=1 checkpoint; for Qwen3-MoE (inference) logits, export and checkpoint."""
    from megatron.core import dist_checkpointing

    reference, raw = hf_model("qwen2", tie=False, seed=3)
    reference.save_pretrained(tmp_path / "hf")
    model = build_gpt_model(raw)
    load_hf_weights(model, tmp_path / "hf")
    (tmp_path / "ckpt").mkdir()
    dist_checkpointing.save(model.sharded_state_dict(), str(tmp_path / "ckpt"))
    ids, pos = inputs()
    logits = model(ids, pos, None)
    loss, logp, entropy = rl_loss(logits, ids)
    loss.backward()
    grads = export_grads(model)
    export = export_hf_state_dict(model)
    grad_norm, after_step = adam_step(model, ids, pos)
    moe_logits, moe_export = _moe_reference(tmp_path / "moe")

    spawn(_tp2_worker, (free_port(), str(tmp_path / "hf"), str(tmp_path / "ckpt"), str(tmp_path)))
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in range(2)]
    for result in ranks:  # both ranks compute the full per-token values
        torch.testing.assert_close(result["logp"], logp.detach(), rtol=0, atol=1e-5)
        torch.testing.assert_close(result["entropy"], entropy.detach(), rtol=0, atol=1e-5)
    tp2 = ranks[0]
    torch.testing.assert_close(tp2["gathered_logits"], logits.detach(), rtol=0, atol=1e-5)
    torch.testing.assert_close(tp2["restored_logits"], logits.detach(), rtol=0, atol=1e-5)
    assert tp2["export"].keys() == export.keys()
    for name in export:
        assert torch.equal(tp2["export"][name], export[name]), name
        torch.testing.assert_close(tp2["grads"][name], grads[name], rtol=0, atol=1e-5, msg=name)
        torch.testing.assert_close(tp2["after_step"][name], after_step[name], rtol=0, atol=1e-5,
                                   msg=name)
    assert tp2["grad_norm"] == pytest.approx(grad_norm, rel=1e-5)
    torch.testing.assert_close(tp2["moe_logits"], moe_logits, rtol=0, atol=1e-5)
    torch.testing.assert_close(tp2["moe_restored_logits"], moe_logits, rtol=0, atol=1e-5)
    assert tp2["moe_export"].keys() == moe_export.keys()
    for name in moe_export:
        assert torch.equal(tp2["moe_export"][name], moe_export[name]), name

    for vocab in (VOCAB, 180):
        full, targets, *_ = ranks[0][f"synthetic_{vocab}"]
        plain = full.clone().requires_grad_()
        ref_logp, ref_entropy = plain_logprobs(plain, targets, vocab), plain_entropy(plain, vocab)
        (ref_logp.sum() + ref_entropy.sum()).backward()
        for result in ranks:
            _, _, got_logp, got_entropy, _ = result[f"synthetic_{vocab}"]
            torch.testing.assert_close(got_logp, ref_logp.detach(), rtol=0, atol=1e-5)
            torch.testing.assert_close(got_entropy, ref_entropy.detach(), rtol=0, atol=1e-5)
        shard_grads = torch.cat([result[f"synthetic_{vocab}"][4] for result in ranks], dim=-1)
        torch.testing.assert_close(shard_grads, plain.grad, rtol=0, atol=1e-5)


# --- configuration and flags -------------------------------------------------------------------


def test_padded_vocab_does_not_depend_on_tp() -> None:
    assert {padded_vocab_size(VOCAB, tp) for tp in (1, 2, 4, 8)} == {PADDED}
    assert padded_vocab_size(151936, 8) == 151936  # already a multiple of 128
    assert padded_vocab_size(100, 3) == 384  # lcm(128, 3)


def test_model_flags_mismatch_names_the_flag() -> None:
    _, raw = hf_model("qwen2", tie=False)
    ok = SimpleNamespace(num_layers=2, hidden_size=64, num_attention_heads=4, num_query_groups=2,
                         ffn_hidden_size=96, vocab_size=VOCAB, seq_length=128, rotary_base=10000,
                         add_qkv_bias=True, untie_embeddings_and_output_weights=True,
                         normalization="RMSNorm", swiglu=True)
    assert check_model_flags(raw, ok) == raw
    assert check_model_flags(raw, {"num_layers": 2, "hidden_size": None}) == raw  # None: not given
    cases = {
        "num_layers": (3, r"--num-layers is 3 but the checkpoint has num_hidden_layers = 2"),
        "ffn_hidden_size": (128, r"--ffn-hidden-size is 128 .* intermediate_size = 96"),
        "num_query_groups": (4, r"--num-query-groups is 4 .* num_key_value_heads = 2"),
        "vocab_size": (301, r"--vocab-size is 301 .* vocab_size = 300"),
        "seq_length": (129, r"--seq-length 129 exceeds .* max_position_embeddings \(128\)"),
        "untie_embeddings_and_output_weights": (
            False, r"--untie-embeddings-and-output-weights is False .* tie_word_embeddings"),
        "add_qkv_bias": (False, r"--add-qkv-bias is False .* 'qwen2'"),
        "normalization": ("LayerNorm", r"--normalization LayerNorm"),
    }
    for name, (value, message) in cases.items():
        with pytest.raises(ConfigError, match=message):
            check_model_flags(raw, {**vars(ok), name: value})


def test_model_flags_define_a_model_without_checkpoint(tp1: None) -> None:
    flags = {"num_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "ffn_hidden_size": 96,
             "num_query_groups": 2, "vocab_size": VOCAB, "seq_length": 64, "add_qkv_bias": True,
             "rotary_base": 1e6}
    raw = check_model_flags(None, flags)
    assert raw["model_type"] == "qwen2" and raw["tie_word_embeddings"] is True
    assert raw["max_position_embeddings"] == 64 and raw["rope_theta"] == 1e6
    model = build_gpt_model(raw)
    ids, pos = inputs(seq=8)
    assert model(ids, pos, None).shape == (2, 8, PADDED)
    with pytest.raises(ConfigError, match=r"missing: --ffn-hidden-size"):
        check_model_flags(None, {**flags, "ffn_hidden_size": None})


def test_unsupported_configs_name_the_field() -> None:
    _, raw = hf_model("llama", tie=False)
    cases = {
        "model_type": ({"model_type": "mistral"}, r"'model_type' is 'mistral'"),
        "rope_scaling": ({"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e4}},
                         r"'rope_parameters.rope_type' is 'yarn'"),
        "rope_scaling_v4": ({"rope_parameters": None, "rope_scaling": {"type": "linear"}},
                            r"'rope_scaling' has type 'linear'"),
        "sliding": ({"use_sliding_window": True}, r"'use_sliding_window'"),
        "act": ({"hidden_act": "gelu"}, r"'hidden_act' is 'gelu'"),
        "bias": ({"attention_bias": True}, r"'attention_bias'"),
    }
    for changes, message in cases.values():
        with pytest.raises(ConfigError, match=message):
            transformer_config_from_hf({**raw, **changes})


def test_transformer_config_fields() -> None:
    _, raw = hf_model("qwen2", tie=False)
    config = transformer_config_from_hf({**raw, "rms_norm_eps": 1e-5}, hidden_dropout=0.1)
    assert (config.normalization, config.gated_linear_unit, config.add_bias_linear) == (
        "RMSNorm", True, False)
    assert config.add_qkv_bias and config.num_query_groups == 2 and config.kv_channels == 16
    assert config.layernorm_epsilon == 1e-5 and config.attention_dropout == 0.0
    assert config.hidden_dropout == 0.1  # overrides win
    with pytest.raises(ConfigError, match=r"--tensor-model-parallel-size 4 must divide .* "
                                          r"num_key_value_heads \(2\)"):
        transformer_config_from_hf(raw, tensor_model_parallel_size=4)
    with pytest.raises(ConfigError, match="--sequence-parallel"):
        transformer_config_from_hf(raw, sequence_parallel=True)


def test_moe_configs_route_as_transformers_and_refuse_what_they_cannot() -> None:
    _, raw = hf_model("qwen3_moe", tie=False)
    config = transformer_config_from_hf(raw)
    assert (config.num_moe_experts, config.moe_router_topk, config.moe_ffn_hidden_size) == (4, 2, 32)
    # norm_topk_prob: top-k then softmax (renormalised); without it softmax over all, then top-k
    assert not config.moe_router_pre_softmax and config.moe_router_load_balancing_type == "none"
    assert transformer_config_from_hf({**raw, "norm_topk_prob": False}).moe_router_pre_softmax
    with_aux = transformer_config_from_hf(raw, moe_aux_loss_coeff=0.01)
    assert (with_aux.moe_router_load_balancing_type, with_aux.moe_aux_loss_coeff) == ("aux_loss", 0.01)
    official = {k: v for k, v in raw.items() if k != "num_local_experts"} | {"num_experts": 4}
    assert transformer_config_from_hf(official).num_moe_experts == 4  # Qwen's own config name
    cases = {
        "sparse_step": ({"decoder_sparse_step": 2}, r"'decoder_sparse_step' / 'mlp_only_layers'"),
        "dense_layers": ({"mlp_only_layers": [0]}, r"'decoder_sparse_step' / 'mlp_only_layers'"),
        "topk": ({"num_experts_per_tok": 5}, r"'num_experts_per_tok' is 5; .* num_experts \(4\)"),
    }
    for changes, message in cases.values():
        with pytest.raises(ConfigError, match=message):
            transformer_config_from_hf({**raw, **changes})


def test_moe_flags_refuse_what_megatron_or_the_export_cannot_do() -> None:
    _, moe = hf_model("qwen3_moe", tie=False)
    _, dense = hf_model("qwen3", tie=False)
    with pytest.raises(ConfigError, match=r"--tensor-model-parallel-size 2 with a mixture-of-experts "
                                          r"checkpoint \(qwen3_moe, 4 experts\) needs --sequence-parallel"):
        check_model_flags(moe, {"tensor_model_parallel_size": 2})
    for targets in ("all-linear", "q_proj,k_proj,v_proj,gate_proj,up_proj"):
        with pytest.raises(ConfigError, match=r"LoRA on a mixture-of-experts model's expert projections"):
            check_model_flags(moe, {"lora_rank": 8, "lora_target_modules": targets})
    check_model_flags(moe, {"lora_rank": 8, "lora_target_modules": "q_proj,k_proj,v_proj,o_proj"})
    with pytest.raises(ConfigError, match=r"--expert-model-parallel-size 3 must divide the checkpoint's "
                                          r"num_experts \(4\): .* splits into 1 or 2 or 4"):
        check_model_flags(moe, {"expert_model_parallel_size": 3})
    with pytest.raises(ConfigError, match=r"--expert-model-parallel-size 2 is for mixture-of-experts"):
        check_model_flags(dense, {"expert_model_parallel_size": 2})
    with pytest.raises(ConfigError, match=r"--moe-aux-loss-coeff 0.01 is for mixture-of-experts models; "
                                          r"the checkpoint is a dense qwen3 model"):
        check_model_flags(dense, {"moe_aux_loss_coeff": 0.01})


def test_the_load_balancing_loss_reaches_the_router_when_its_coefficient_asks(tp1: None) -> None:
    """A loss that only reads the logits trains the router through the chosen experts' weights;
    with --moe-aux-loss-coeff the load-balancing loss adds its own gradient on top."""
    reference, raw = hf_model("qwen3_moe", tie=False)
    ids, pos = inputs()
    grads = {}
    for coeff in (0.0, 1.0):
        model = build_gpt_model(raw, moe_aux_loss_coeff=coeff)
        load_hf_weights(model, reference.state_dict())  # the same weights both times
        model(ids, pos, None)[..., :VOCAB].logsumexp(-1).mean().backward()
        grads[coeff] = model.decoder.layers[0].mlp.router.weight.grad.clone()
    assert grads[0.0].abs().sum() > 0
    assert not torch.allclose(grads[0.0], grads[1.0])


def test_load_errors_list_unknown_missing_and_misshaped_names(tp1: None) -> None:
    reference, raw = hf_model("qwen2", tie=False)
    model = build_gpt_model(raw)
    state = dict(reference.state_dict())
    state["model.layers.9.mlp.gate_proj.weight"] = torch.zeros(1)
    state["model.extra.weight"] = torch.zeros(1)
    del state["model.layers.1.self_attn.k_proj.bias"]
    state["model.norm.weight"] = torch.zeros(65)
    with pytest.raises(WeightMappingError) as err:
        load_hf_weights(model, state)
    message = str(err.value)
    assert "unknown names: model.extra.weight, model.layers.9.mlp.gate_proj.weight" in message
    assert "missing names: model.layers.1.self_attn.k_proj.bias" in message
    assert "model.norm.weight: (65,), expected (64,)" in message


def test_init_model_parallel_validates_sizes(tp1: None) -> None:
    init_model_parallel(1, 1)  # already initialised with these sizes: a no-op
    assert distributed.is_initialized()
    with pytest.raises(ConfigError, match="already initialised"):
        init_model_parallel(2, 1)
    with pytest.raises(ConfigError, match=r"--tensor-model-parallel-size \(2\) x "
                                          r"--pipeline-model-parallel-size \(2\) = 4 does not "
                                          r"divide the world size \(6"):
        distributed._validate_sizes(2, 2, 6)
    with pytest.raises(ConfigError, match="--pipeline-model-parallel-size must be >= 1"):
        distributed._validate_sizes(1, 0, 1)
    with pytest.raises(ConfigError, match=r"--expert-model-parallel-size \(4\) must divide the "
                                          r"data-parallel ranks \(6 processes / \(1 x 1\) = 6\)"):
        distributed._validate_sizes(1, 1, 6, ep=4)
    distributed._validate_sizes(2, 1, 4, ep=2)  # 2 data-parallel ranks share the experts


def test_fused_single_rank_path_equals_the_chunked_function():
    """Without TP, small logits take torch's fused log-softmax; it must equal the chunked
    autograd function (values and gradients), which large batches and TP ranks use."""
    from agentrl.trainer import vocab_parallel as vp

    generator = torch.Generator().manual_seed(5)
    logits = (torch.randn(3, 7, 384, generator=generator) * 4).requires_grad_()
    targets = torch.randint(0, 300, (3, 7), generator=generator)
    fused = vp.vocab_parallel_logprobs(logits, targets, vocab_size=300, temperature=0.7)
    chunked = vp._VocabParallelLogProbs.apply(logits, targets, 0.7, 5, 300, None)
    assert torch.allclose(fused, chunked, atol=1e-6)
    weights = torch.randn(3, 7, generator=generator)
    (g_fused,) = torch.autograd.grad((fused * weights).sum(), logits)
    (g_chunked,) = torch.autograd.grad((chunked * weights).sum(), logits)
    assert torch.allclose(g_fused, g_chunked, atol=1e-6)
    assert torch.all(g_fused[..., 300:] == 0)  # padded vocabulary gets no gradient
    fused_h = vp.vocab_parallel_entropy(logits, vocab_size=300, temperature=0.7)
    chunked_h = vp._VocabParallelEntropy.apply(logits, 0.7, 5, 300, None)
    assert torch.allclose(fused_h, chunked_h, atol=1e-5)


def test_bf16_models_keep_every_parameter_in_bf16(tp1: None) -> None:
    """The local spec's norms would otherwise stay fp32 next to bf16 activations: each norm then
    converts its input and output, and torch warns that no fused kernel can run."""
    import warnings

    from agentrl.trainer.critic import ValueModel

    _, raw = hf_model("qwen2", tie=True)
    model = build_gpt_model(raw, params_dtype=torch.bfloat16)
    critic = ValueModel(raw, params_dtype=torch.bfloat16, hf_checkpoint=None)
    for module in (model, critic):
        assert {p.dtype for p in module.parameters()} == {torch.bfloat16}
    ids, positions = inputs()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model(ids, positions, None).float().sum().backward()
    assert not [w for w in caught if "Mismatch dtype" in str(w.message)]


def test_transformer_impl_is_checked_and_refused_where_te_cannot_run(monkeypatch) -> None:
    from agentrl.trainer.config import TrainerConfig
    from agentrl.trainer.hf_convert import check_transformer_engine

    with pytest.raises(ConfigError, match="--transformer-impl must be one of local, transformer_engine"):
        TrainerConfig(transformer_impl="fused").validate()
    _, raw = hf_model("qwen2", tie=True)
    with pytest.raises(ConfigError, match="needs a CUDA GPU .* use --transformer-impl local"):
        build_gpt_model(raw, transformer_impl="transformer_engine")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setitem(__import__("sys").modules, "transformer_engine", None)  # not importable
    with pytest.raises(ConfigError, match=r"transformer_engine.pytorch does not import \(.*\); "
                                          r"install Transformer Engine"):
        check_transformer_engine()


def test_transformer_engine_names_the_pre_norms_inside_the_fused_linears() -> None:
    from agentrl.trainer.hf_convert import HFModelSpec
    from agentrl.trainer.hf_weights import _layer_rules

    spec = HFModelSpec.from_hf(hf_model("qwen2", tie=True)[1])
    local = {m: hf for m, hf, _ in _layer_rules(spec)}
    fused = {m: hf for m, hf, _ in _layer_rules(spec, fused_norms=True)}
    assert fused.pop("self_attention.linear_qkv.layer_norm_weight") == local.pop("input_layernorm.weight")
    assert fused.pop("mlp.linear_fc1.layer_norm_weight") == local.pop("pre_mlp_layernorm.weight")
    assert fused == local  # every other parameter keeps its name
