"""The hand-written decoder against transformers, its KV cache, loading and in-place updates."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
    Qwen3MoeConfig,
    Qwen3MoeForCausalLM,
)

from agentrl.chat.tiny_tokenizer import cache_root
from agentrl.engine.model import DecoderConfig, DecoderModel
from agentrl.errors import EngineError
from agentrl.models import TINY_MODEL_CONFIG, build_tiny_model
from tests.support.tokenizers import tiny_tokenizer

VOCAB = 320
TOL = 1e-5
DECODE_TOL = 1e-4
"""Cached decode runs other matmul shapes than the reference's one full forward; CPU BLAS picks
its blocking (and so its float summation order) by shape and thread count, which moved a logit
by slightly more than 1e-5 once under load. Still far below any change in sampling."""


def _small(kind: str, **overrides) -> tuple[torch.nn.Module, dict]:
    """A random transformers model with perturbed norms and biases (so they matter)."""
    common = dict(vocab_size=VOCAB, hidden_size=48, intermediate_size=80, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    common.update(overrides)
    torch.manual_seed(0)
    classes = {"qwen2": (Qwen2Config, Qwen2ForCausalLM), "llama": (LlamaConfig, LlamaForCausalLM),
               "qwen3": (Qwen3Config, Qwen3ForCausalLM), "qwen3_moe": (Qwen3MoeConfig, Qwen3MoeForCausalLM)}
    config_class, model_class = classes[kind]
    model = model_class(config_class(**common))
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("bias") or "norm" in name:
                param.normal_(0.0, 0.5).add_(1.0 if "norm" in name else 0.0)
    return model.eval(), model.config.to_dict()


def _reference_logits(hf: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return hf(ids).logits.float()


CASES = {
    "qwen2-tied": ("qwen2", dict(tie_word_embeddings=True)),
    "qwen2-untied-mha": ("qwen2", dict(tie_word_embeddings=False, num_key_value_heads=4)),
    "llama-untied": ("llama", dict(tie_word_embeddings=False, num_key_value_heads=1)),
    "llama-bias-tied": ("llama", dict(tie_word_embeddings=True, attention_bias=True,
                                      mlp_bias=True)),
    "llama-head-dim": ("llama", dict(head_dim=16, rope_theta=500.0)),
    "qwen3-head-dim": ("qwen3", dict(head_dim=16, tie_word_embeddings=True)),
    "qwen3-moe": ("qwen3_moe", dict(head_dim=16, num_experts=6, num_experts_per_tok=2,
                                    moe_intermediate_size=24, norm_topk_prob=True)),
    "qwen3-moe-unnormalised": ("qwen3_moe", dict(num_experts=4, num_experts_per_tok=3,
                                                 moe_intermediate_size=16, norm_topk_prob=False,
                                                 tie_word_embeddings=True)),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_forward_matches_transformers(case: str) -> None:
    kind, overrides = CASES[case]
    hf, config = _small(kind, **overrides)
    model = DecoderModel.from_state_dict(config, hf.state_dict(), device="cpu")
    ids = torch.randint(0, VOCAB, (3, 23), generator=torch.Generator().manual_seed(1))
    ref = _reference_logits(hf, ids)
    ours = model.forward(ids)
    assert ours.shape == ref.shape
    assert torch.allclose(ours, ref, atol=TOL, rtol=0), (ours - ref).abs().max()
    assert ref.std() > 0.05  # the comparison is not between two near-zero tensors


@pytest.mark.parametrize("case", ["qwen2-tied", "llama-bias-tied", "qwen3-moe"])
def test_cached_decode_matches_full_forward(case: str) -> None:
    kind, overrides = CASES[case]
    hf, config = _small(kind, **overrides)
    model = DecoderModel.from_state_dict(config, hf.state_dict(), device="cpu")
    gen = torch.Generator().manual_seed(2)
    seqs = [torch.randint(0, VOCAB, (n,), generator=gen).tolist() for n in (30, 30, 30)]
    ref = _reference_logits(hf, torch.tensor(seqs))
    prompt_lens = [5, 11, 2]
    # initial_len 4: the cache has to grow (and keep its contents) along the way
    cache = model.new_cache(num_slots=5, max_len=64, initial_len=4)
    slots = [3, 0, 4]  # not 0..n-1: exercises the gathered path
    logits = model.prefill(cache, [s[:n] for s, n in zip(seqs, prompt_lens, strict=True)], slots)
    for row, n in enumerate(prompt_lens):
        assert torch.allclose(logits[row], ref[row, n - 1], atol=DECODE_TOL, rtol=0)
    positions = list(prompt_lens)
    for _ in range(12):
        tokens = torch.tensor([seqs[row][p] for row, p in enumerate(positions)])
        logits = model.decode(cache, tokens, positions, slots=slots)
        for row, p in enumerate(positions):
            assert torch.allclose(logits[row], ref[row, p], atol=DECODE_TOL, rtol=0), (row, p)
        positions = [p + 1 for p in positions]
    assert cache.capacity >= max(positions)
    # the contiguous fast path (slots 0..n-1) after moving rows 0 and 2 into slots 0 and 1
    cache.move_slot(3, 0, positions[0])
    cache.move_slot(4, 1, positions[2])
    tokens = torch.tensor([seqs[0][positions[0]], seqs[2][positions[2]]])
    logits = model.decode(cache, tokens, [positions[0], positions[2]])
    assert torch.allclose(logits[0], ref[0, positions[0]], atol=DECODE_TOL, rtol=0)
    assert torch.allclose(logits[1], ref[2, positions[2]], atol=DECODE_TOL, rtol=0)


def test_loads_unsharded_and_sharded_directories(tmp_path: Path) -> None:
    hf, _ = _small("qwen2", tie_word_embeddings=False)
    ids = torch.randint(0, VOCAB, (1, 9), generator=torch.Generator().manual_seed(3))
    ref = _reference_logits(hf, ids)
    hf.save_pretrained(tmp_path / "single")
    hf.save_pretrained(tmp_path / "sharded", max_shard_size="40KB")
    index = json.loads((tmp_path / "sharded" / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 1
    for folder in ("single", "sharded"):
        model = DecoderModel.from_pretrained(tmp_path / folder, device="cpu")
        assert torch.allclose(model.forward(ids), ref, atol=TOL, rtol=0), folder
    shard = sorted((tmp_path / "sharded").glob("*.safetensors"))[0]
    shard.unlink()
    with pytest.raises(EngineError, match="shards that do not exist"):
        DecoderModel.from_pretrained(tmp_path / "sharded", device="cpu")


def test_missing_parameter_is_named() -> None:
    hf, config = _small("qwen2", tie_word_embeddings=True)
    state = dict(hf.state_dict())
    del state["model.layers.1.mlp.up_proj.weight"]
    with pytest.raises(EngineError, match=r"model\.layers\.1\.mlp\.up_proj\.weight"):
        DecoderModel.from_state_dict(config, state, device="cpu")


def test_inplace_update_checks_everything_first() -> None:
    hf, config = _small("qwen2", tie_word_embeddings=True)
    model = DecoderModel.from_state_dict(config, hf.state_dict(), device="cpu")
    ids = torch.randint(0, VOCAB, (1, 7), generator=torch.Generator().manual_seed(4))
    before = model.forward(ids)
    params = model.named_parameters()
    good = torch.full_like(params["model.norm.weight"], 2.0)
    bad = {
        "model.norm.weight": good,  # valid, but must not be applied
        "model.layers.0.self_attn.q_proj.wieght": torch.zeros(48, 48),
        "model.layers.0.self_attn.k_proj.weight": torch.zeros(48, 48),  # kv rows are 24
    }
    with pytest.raises(EngineError) as info:
        model.load_state_dict_inplace(bad)
    message = str(info.value)
    assert "q_proj.wieght" in message
    assert "k_proj.weight: got (48, 48), expected (24, 48)" in message
    assert torch.equal(model.forward(ids), before)
    assert not torch.equal(params["model.norm.weight"], good)

    # a valid subset is copied, through the fused q/k/v view, and changes the output
    new_k = torch.randn(24, 48, generator=torch.Generator().manual_seed(5))
    copied = model.load_state_dict_inplace(
        [("model.layers.0.self_attn.k_proj.weight", new_k),
         ("model.layers.0.self_attn.rotary_emb.inv_freq", torch.zeros(6))]
    )
    assert copied == 1
    assert torch.equal(model.named_parameters()["model.layers.0.self_attn.k_proj.weight"], new_k)
    assert not torch.allclose(model.forward(ids), before)
    # tied: lm_head.weight is accepted as the embedding
    embed = torch.randn(VOCAB, 48, generator=torch.Generator().manual_seed(6))
    model.load_state_dict_inplace({"lm_head.weight": embed})
    assert torch.equal(model.embed, embed) and model.lm_head is model.embed


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e4, "factor": 2.0}},
         "rope_parameters.rope_type"),
        ({"rope_parameters": None, "rope_scaling": {"type": "linear", "factor": 2.0}},
         "rope_scaling"),
        ({"model_type": "gpt2"}, "model_type"),
        ({"hidden_act": "gelu"}, "hidden_act"),
        ({"use_sliding_window": True}, "use_sliding_window"),
    ],
)
def test_unsupported_config_names_the_field(change: dict, field: str) -> None:
    _, config = _small("qwen2")
    config.update(change)
    with pytest.raises(EngineError, match=field.replace(".", r"\.")):
        DecoderConfig.from_hf(config)


def test_config_reading() -> None:
    _, qwen = _small("qwen2", eos_token_id=[5, 6], tie_word_embeddings=True)
    parsed = DecoderConfig.from_hf(qwen)
    assert (parsed.qkv_bias, parsed.o_bias, parsed.mlp_bias) == (True, False, False)
    assert parsed.eos_token_ids == (5, 6) and parsed.tie_word_embeddings
    _, llama = _small("llama", attention_bias=True, head_dim=16, rope_theta=123.0)
    parsed = DecoderConfig.from_hf(llama)
    assert (parsed.qkv_bias, parsed.o_bias, parsed.mlp_bias) == (True, True, False)
    assert (parsed.head_dim, parsed.rope_theta) == (16, 123.0)
    old_style = dict(llama, rope_parameters=None, rope_theta=77.0, rope_scaling=None)
    assert DecoderConfig.from_hf(old_style).rope_theta == 77.0


def test_tiny_model_is_built_once_and_deterministically(tmp_path: Path) -> None:
    tiny_tokenizer()  # make sure the default cache holds the tokenizer, then reuse it
    for root in (tmp_path / "a", tmp_path / "b"):
        shutil.copytree(cache_root() / "tiny-tokenizer-v1", root / "tiny-tokenizer-v1")
    first = build_tiny_model(tmp_path / "a")
    assert first == tmp_path / "a" / "tiny-qwen2-v1"
    stamp = (first / "model.safetensors").stat().st_mtime_ns
    assert build_tiny_model(tmp_path / "a") == first
    assert (first / "model.safetensors").stat().st_mtime_ns == stamp  # not rebuilt
    second = build_tiny_model(tmp_path / "b")
    a, b = load_file(first / "model.safetensors"), load_file(second / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)

    config = json.loads((first / "config.json").read_text())
    for key in ("hidden_size", "num_hidden_layers", "num_key_value_heads", "intermediate_size"):
        assert config[key] == TINY_MODEL_CONFIG[key]
    tokenizer = tiny_tokenizer()
    assert config["vocab_size"] == len(tokenizer) == 4096
    assert config["eos_token_id"] == tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert config["pad_token_id"] == tokenizer.convert_tokens_to_ids("<|endoftext|>")
    assert (first / "tokenizer.json").is_file()
    assert a["model.embed_tokens.weight"].dtype == torch.float32

    hf = Qwen2ForCausalLM.from_pretrained(first).eval()
    ids = torch.tensor([tokenizer.encode("def f(x):\n    return x")])
    ours = DecoderModel.from_pretrained(first, device="cpu").forward(ids)
    assert torch.allclose(ours, _reference_logits(hf, ids), atol=TOL, rtol=0)


def test_unused_cache_positions_never_poison_a_decode(monkeypatch) -> None:
    """Positions past a slot's length are masked (weight 0), and 0 x NaN is NaN: a cache grown
    into memory holding NaN bit patterns once turned whole logit rows into NaN. Here every
    freshly allocated tensor is NaN-filled; the cache must not expose any of it."""
    hf, config = _small("qwen2")
    model = DecoderModel.from_state_dict(config, hf.state_dict(), device="cpu")
    real_empty = torch.empty

    def nan_empty(*args, **kwargs):
        out = real_empty(*args, **kwargs)
        return out.fill_(float("nan")) if out.is_floating_point() else out

    monkeypatch.setattr(torch, "empty", nan_empty)
    cache = model.new_cache(num_slots=3, max_len=64, initial_len=4)
    short, long = [5, 6, 7], list(range(10, 30))
    model.prefill(cache, [short, long], [0, 1])  # the long one grows the cache past 4
    logits = model.decode(cache, torch.tensor([8, 30]), [3, 20], slots=[0, 1])
    assert torch.isfinite(logits).all()


def test_the_cache_allocates_the_slots_in_use_not_the_limit() -> None:
    """An engine allowed 64 requests that serves 3 holds 3 slots: on a real model each slot at
    a few thousand positions is hundreds of MiB."""
    hf, config = _small("qwen2")
    model = DecoderModel.from_state_dict(config, hf.state_dict(), device="cpu")
    cache = model.new_cache(num_slots=64, max_len=256, initial_len=8)
    per_slot_position = 2 * config["num_hidden_layers"] * config["num_key_value_heads"] * (
        config["hidden_size"] // config["num_attention_heads"]) * 4
    assert cache.slots == 1 and cache.nbytes == 8 * per_slot_position
    model.prefill(cache, [[1, 2, 3]] * 3, [0, 1, 2])
    assert cache.slots == 3 and cache.capacity == 8
    model.decode(cache, torch.tensor([4, 4, 4]), [3, 3, 3])
    model.prefill(cache, [list(range(20))], [3])  # a fourth, longer: both dimensions double
    assert (cache.slots, cache.capacity) == (6, 20)
    assert cache.nbytes == 6 * 20 * per_slot_position
    cache.release()
    assert cache.nbytes == 0 and (cache.slots, cache.capacity) == (0, 0)


@pytest.mark.parametrize("case", ["qwen2-tied", "llama-untied", "qwen3-moe"])
def test_extend_after_a_stored_prefix_equals_the_full_forward(case: str) -> None:
    """A prefix-cache hit: each slot holds the first positions of its sequence (copied in, as
    the prefix store does), ``extend`` runs the rest in one padded batch, and decoding goes on
    from there; every logit equals one full forward's."""
    kind, overrides = CASES[case]
    hf, config = _small(kind, **overrides)
    model = DecoderModel.from_state_dict(config, hf.state_dict(), device="cpu")
    gen = torch.Generator().manual_seed(5)
    seqs = [torch.randint(0, VOCAB, (40,), generator=gen).tolist() for _ in range(2)]
    ref = _reference_logits(hf, torch.tensor(seqs))
    source = model.new_cache(num_slots=4, max_len=64, initial_len=4)
    model.prefill(source, [seqs[0][:20], seqs[1][:7]], [0, 1])
    cache = model.new_cache(num_slots=4, max_len=64, initial_len=4)
    starts, ends = [17, 7], [30, 25]  # 17 of slot 0's 20 stored positions are reused
    for row, slot in enumerate((2, 3)):
        cache.write_slot(slot, *source.read_slot(row, starts[row]), source.read_routes(row, starts[row]))
    logits = model.extend(cache, [seqs[r][starts[r] : ends[r]] for r in range(2)], [2, 3], starts)
    for row in range(2):
        assert torch.allclose(logits[row], ref[row, ends[row] - 1], atol=DECODE_TOL, rtol=0)
    positions = list(ends)
    for _ in range(5):
        tokens = torch.tensor([seqs[row][p] for row, p in enumerate(positions)])
        logits = model.decode(cache, tokens, positions, slots=[2, 3])
        for row, p in enumerate(positions):
            assert torch.allclose(logits[row], ref[row, p], atol=DECODE_TOL, rtol=0), (row, p)
        positions = [p + 1 for p in positions]


def _hf_routes(hf: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    """The experts transformers' router picks ``[batch, seq, layers, topk]``, from its logits."""
    with torch.no_grad():
        out = hf(ids, output_router_logits=True)
    k = hf.config.num_experts_per_tok
    chosen = [torch.topk(logits.softmax(-1), k, dim=-1).indices for logits in out.router_logits]
    return torch.stack(chosen, dim=1).view(ids.shape[0], ids.shape[1], len(chosen), k)


def test_the_cache_keeps_the_experts_each_position_was_routed_to() -> None:
    """Prefill, extend after a stored prefix, and decode each record, per cached position and
    layer, the experts transformers' router chooses there (as sets: the order within a
    position's top-k is the router's score order in both)."""
    hf, config = _small("qwen3_moe", **CASES["qwen3-moe"][1])
    model = DecoderModel.from_state_dict(config, hf.state_dict(), device="cpu")
    gen = torch.Generator().manual_seed(7)
    seqs = [torch.randint(0, VOCAB, (24,), generator=gen).tolist() for _ in range(2)]
    expected = _hf_routes(hf, torch.tensor(seqs)).to(torch.int16)
    cache = model.new_cache(num_slots=2, max_len=64, initial_len=4)
    model.prefill(cache, [seqs[0][:10], seqs[1][:6]], [0, 1])
    store = model.new_cache(num_slots=2, max_len=64, initial_len=4)
    store.write_slot(1, *cache.read_slot(1, 6), cache.read_routes(1, 6))  # a prefix-cache hit
    model.extend(store, [seqs[1][6:16]], [1], [6])
    positions = [10, 16]
    for _ in range(6):
        model.decode(cache, torch.tensor([seqs[0][positions[0]]]), [positions[0]], slots=[0])
        model.decode(store, torch.tensor([seqs[1][positions[1]]]), [positions[1]], slots=[1])
        positions = [p + 1 for p in positions]
    got = [cache.read_routes(0, positions[0]), store.read_routes(1, positions[1])]
    for row in range(2):
        assert got[row] is not None and got[row].shape == (positions[row], 2, 2)
        assert torch.equal(got[row].sort(-1).values, expected[row, : positions[row]].sort(-1).values), row
    assert model.new_cache(1, 8).routes is not None
    dense, dense_config = _small("qwen2")
    assert DecoderModel.from_state_dict(dense_config, dense.state_dict()).new_cache(1, 8).routes is None
