"""megatron-core on CPU: every path the trainer uses runs through agentrl's redirections.

One test per path (forward, backward, RNG tracker, Megatron DDP + optimizer with gradient
clipping, the micro-batch schedule, dist-checkpointing), plus the version pin. The model is
built with megatron's own API so a failure points at the compatibility layer, not at
``hf_convert``.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator

import pytest
import torch
import torch.nn.functional as F

from agentrl.trainer import megatron_compat
from agentrl.trainer.distributed import destroy_model_parallel, init_model_parallel
from agentrl.trainer.megatron_compat import (
    PINNED_MEGATRON_VERSION,
    CpuRNGStatesTracker,
    MegatronVersionError,
    apply_cpu_compat,
    model_parallel_manual_seed,
)

pytestmark = pytest.mark.skipif(
    torch.cuda.is_available(), reason="tests the CPU redirections; this machine has CUDA"
)

VOCAB, SEQ, BATCH = 256, 12, 2


@pytest.fixture(scope="module")
def model_parallel() -> Iterator[None]:
    init_model_parallel(1, 1, seed=1234)
    yield
    destroy_model_parallel()


def make_model(**overrides: object) -> torch.nn.Module:
    """A 2-layer Qwen2-shaped GPTModel built with megatron's API directly."""
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer import TransformerConfig

    fields: dict[str, object] = dict(
        num_layers=2, hidden_size=64, num_attention_heads=4, num_query_groups=2,
        ffn_hidden_size=96, normalization="RMSNorm", gated_linear_unit=True,
        activation_func=F.silu, add_bias_linear=False, add_qkv_bias=True,
        hidden_dropout=0.0, attention_dropout=0.0, use_cpu_initialization=True,
        params_dtype=torch.float32,
    )
    fields.update(overrides)
    return GPTModel(
        config=TransformerConfig(**fields),
        transformer_layer_spec=get_gpt_layer_local_spec(),
        vocab_size=VOCAB,
        max_sequence_length=64,
        position_embedding_type="rope",
    )


def batch(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(input ids, position ids), each [BATCH, SEQ]."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, VOCAB, (BATCH, SEQ), generator=generator)
    return ids, torch.arange(SEQ).expand(BATCH, SEQ)


def test_wrong_megatron_version_fails_loudly(monkeypatch: pytest.MonkeyPatch) -> None:
    from megatron.core import package_info

    monkeypatch.setattr(package_info, "__version__", "0.17.0")
    with pytest.raises(MegatronVersionError, match=r"megatron-core 0\.17\.0 is installed") as err:
        apply_cpu_compat()
    assert PINNED_MEGATRON_VERSION in str(err.value)
    with pytest.raises(MegatronVersionError):
        megatron_compat.check_megatron_version("0.16.0")
    megatron_compat.check_megatron_version(PINNED_MEGATRON_VERSION)


def test_redirections_are_idempotent_and_scoped_to_megatron_modules() -> None:
    assert apply_cpu_compat() is True
    assert apply_cpu_compat() is True  # idempotent
    for name in megatron_compat._REDIRECTED_MODULES:
        view = importlib.import_module(name).torch
        assert view.zeros(2, device="cuda").device.type == "cpu", name
        assert view.cuda.current_device() == torch.device("cpu"), name
        assert view.Tensor is torch.Tensor, name  # everything else is the real torch
    # torch itself is untouched: code outside those modules still sees no CUDA.
    with pytest.raises((AssertionError, RuntimeError)):
        torch.cuda.current_device()


def test_rng_tracker_forks_on_cpu(model_parallel: None) -> None:
    from megatron.core.tensor_parallel import get_cuda_rng_tracker

    tracker = get_cuda_rng_tracker()
    assert isinstance(tracker, CpuRNGStatesTracker)
    outer = torch.get_rng_state()
    model_parallel_manual_seed(7)
    outer = torch.get_rng_state()
    with tracker.fork():
        first = torch.rand(4)
    with tracker.fork():
        second = torch.rand(4)
    assert not torch.equal(first, second)  # the tracked state advances
    assert torch.equal(torch.get_rng_state(), outer)  # the outer state does not
    model_parallel_manual_seed(7)
    with tracker.fork():
        assert torch.equal(torch.rand(4), first)  # reseeding reproduces
    with pytest.raises(Exception, match="not tracked"):
        with tracker.fork("no-such-state"):
            pass
    model_parallel_manual_seed(1234)


def test_forward_and_backward(model_parallel: None) -> None:
    model = make_model()
    ids, pos = batch(0)
    logits = model(ids, pos, None)  # attention_mask=None: megatron's default causal mask
    assert logits.shape == (BATCH, SEQ, VOCAB)
    # Causal: changing the last token leaves earlier positions' logits unchanged.
    ids2 = ids.clone()
    ids2[:, -1] = (ids2[:, -1] + 1) % VOCAB
    with torch.no_grad():
        torch.testing.assert_close(model(ids2, pos, None)[:, :-1], logits[:, :-1].detach())
    F.cross_entropy(logits.reshape(-1, VOCAB), ids.roll(-1, 1).reshape(-1)).backward()
    for name, param in model.named_parameters():
        assert param.grad is not None and torch.isfinite(param.grad).all(), name
        assert param.grad.abs().sum() > 0, name


def test_dropout_forks_the_tracker(model_parallel: None) -> None:
    model = make_model(attention_dropout=0.5, hidden_dropout=0.1).train()
    ids, pos = batch(1)
    first = model(ids, pos, None)
    second = model(ids, pos, None)
    assert not torch.allclose(first, second)  # dropout masks differ between forwards
    assert torch.isfinite(first).all()


def test_activation_recompute_reproduces_dropout(model_parallel: None) -> None:
    dropout = dict(attention_dropout=0.3, hidden_dropout=0.2)
    plain = make_model(**dropout).train()
    recomputed = make_model(**dropout, recompute_granularity="full", recompute_method="uniform",
                            recompute_num_layers=1).train()
    recomputed.load_state_dict(plain.state_dict())
    ids, pos = batch(4)
    for model in (plain, recomputed):
        model_parallel_manual_seed(99)  # same dropout masks in both forwards
        F.cross_entropy(model(ids, pos, None).reshape(-1, VOCAB), ids.reshape(-1)).backward()
    # The recompute in the backward must draw the forward's dropout masks again.
    for (name, a), b in zip(plain.named_parameters(), recomputed.parameters(), strict=True):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-5, atol=1e-7, msg=name)
    model_parallel_manual_seed(1234)


def _ddp_and_optimizer(model: torch.nn.Module, **optimizer_fields: object) -> tuple:
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

    ddp = DistributedDataParallel(model.config, DistributedDataParallelConfig(), model)
    optimizer = get_megatron_optimizer(OptimizerConfig(**optimizer_fields), [ddp])
    return ddp, optimizer


def test_megatron_ddp_optimizer_clips_by_total_norm(model_parallel: None) -> None:
    model = make_model()
    ddp, optimizer = _ddp_and_optimizer(
        model, optimizer="sgd", lr=1.0, sgd_momentum=0.0, weight_decay=0.0, clip_grad=0.01
    )
    ids, pos = batch(2)
    ddp.zero_grad_buffer()
    optimizer.zero_grad()
    logits = ddp(ids, pos, None)
    F.cross_entropy(logits.reshape(-1, VOCAB), ids.roll(-1, 1).reshape(-1)).backward()
    params = list(model.parameters())
    before = [p.detach().clone() for p in params]
    grads = [p.main_grad.detach().clone() for p in params]  # DDP accumulates into main_grad
    norm = torch.sqrt(sum((g.double() ** 2).sum() for g in grads)).item()
    ok, grad_norm, _ = optimizer.step()
    assert ok and grad_norm == pytest.approx(norm, rel=1e-5)
    assert norm > 0.01  # so clipping is active
    scale = 0.01 / (norm + 1e-6)
    for p, b, g in zip(params, before, grads, strict=True):
        torch.testing.assert_close(p.detach(), b - scale * g, rtol=1e-5, atol=1e-7)


def test_adam_step_runs(model_parallel: None) -> None:
    model = make_model()
    ddp, optimizer = _ddp_and_optimizer(model, optimizer="adam", lr=1e-3, clip_grad=1.0)
    ids, pos = batch(3)
    before = [p.detach().clone() for p in model.parameters()]
    ddp.zero_grad_buffer()
    optimizer.zero_grad()
    F.cross_entropy(ddp(ids, pos, None).reshape(-1, VOCAB), ids.reshape(-1)).backward()
    ok, grad_norm, _ = optimizer.step()
    assert ok and grad_norm > 0
    assert all(not torch.equal(p, b) for p, b in zip(model.parameters(), before, strict=True))


def test_forward_backward_func_with_micro_batches(model_parallel: None) -> None:
    from megatron.core.distributed import finalize_model_grads
    from megatron.core.pipeline_parallel import get_forward_backward_func

    model = make_model()
    ddp, _ = _ddp_and_optimizer(model, optimizer="adam", lr=1e-3)
    model.config.no_sync_func = ddp.no_sync
    model.config.finalize_model_grads_func = finalize_model_grads
    micro_batches = [batch(10 + i) for i in range(3)]

    def forward_step(data: Iterator, module: torch.nn.Module) -> tuple:
        ids, pos = next(data)
        per_token_ce = module(ids, pos, None, labels=ids.roll(-1, 1))  # [b, s]

        def loss_func(output: torch.Tensor) -> tuple:
            total = output.sum()
            # 3-tuple: megatron divides by the token count and the micro-batch count.
            return total, torch.tensor(output.numel()), {"ce_sum": total.detach().clone()}

        return per_token_ce, loss_func

    forward_backward = get_forward_backward_func()
    common = dict(forward_step_func=forward_step, model=[ddp], num_microbatches=3,
                  seq_length=SEQ, micro_batch_size=BATCH)
    ddp.zero_grad_buffer()
    losses = forward_backward(data_iterator=iter(micro_batches), forward_only=False, **common)
    got = {n: p.main_grad.detach().clone() for n, p in model.named_parameters()}

    # The same gradient by hand: mean over tokens per micro-batch, mean over micro-batches.
    # (DDP's hooks accumulate every backward into main_grad, so that is where it lands.)
    ddp.zero_grad_buffer()
    for ids, pos in micro_batches:
        logits = model(ids, pos, None)
        ce = F.cross_entropy(logits.reshape(-1, VOCAB), ids.roll(-1, 1).reshape(-1))
        (ce / len(micro_batches)).backward()
    for name, param in model.named_parameters():
        assert got[name].abs().sum() > 0, name
        torch.testing.assert_close(got[name], param.main_grad, rtol=1e-4, atol=1e-6, msg=name)

    eval_losses = forward_backward(data_iterator=iter(micro_batches), forward_only=True, **common)
    assert len(losses) == len(eval_losses) == 3
    for train, evaluated in zip(losses, eval_losses, strict=True):
        torch.testing.assert_close(train["ce_sum"], evaluated["ce_sum"])


def test_dist_checkpointing_save_and_load(model_parallel: None, tmp_path) -> None:
    from megatron.core import dist_checkpointing

    source, target = make_model(), make_model()
    with torch.no_grad():  # make the two models differ
        for p in target.parameters():
            p.add_(1.0)
    dist_checkpointing.save(source.sharded_state_dict(), str(tmp_path))
    target.load_state_dict(dist_checkpointing.load(target.sharded_state_dict(), str(tmp_path)))
    for (name, a), b in zip(source.named_parameters(), target.parameters(), strict=True):
        assert torch.equal(a, b), name


def test_bf16_trains_on_cpu_with_fp32_master_weights() -> None:
    """--bf16 on CPU: bf16 parameters, fp32 masters in megatron's mixed-precision optimizer,
    and a step close to the fp32 trainer's (bf16 rounding apart)."""
    from agentrl.models import build_tiny_model
    from agentrl.trainer.actor import MegatronActor
    from agentrl.trainer.config import TrainerConfig
    from tests.support.trainer_samples import uneven_samples

    samples = uneven_samples(6)
    results = {}
    for bf16 in (False, True):
        actor = MegatronActor(TrainerConfig(lr=1e-3, bf16=bf16), hf_checkpoint=build_tiny_model(),
                              rollout_temperature=1.0, total_steps=2)
        before = actor.logprobs(samples)
        metrics = actor.train(samples)
        results[bf16] = before, metrics, actor.logprobs(samples)
        dtypes = {p.dtype for p in actor.model.parameters()}
        assert dtypes == {torch.bfloat16 if bf16 else torch.float32}
        if bf16:
            masters = [m for inner in getattr(actor.optimizer, "chained_optimizers", [actor.optimizer])
                       for group in inner.fp32_from_float16_groups for m in group]
            assert masters and {m.dtype for m in masters} == {torch.float32}
        destroy_model_parallel()
    (fp32_before, fp32_metrics, fp32_after), (bf16_before, bf16_metrics, bf16_after) = results.values()
    assert bf16_metrics["grad_norm"] == pytest.approx(fp32_metrics["grad_norm"], rel=0.02)
    assert (bf16_before - fp32_before).abs().max() < 0.1  # bf16 rounding, not another model
    assert (bf16_after - bf16_before).abs().max() > 1e-3  # the step changed the bf16 weights
    assert (bf16_after - fp32_after).abs().max() < 0.1
