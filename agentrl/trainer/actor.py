"""``MegatronActor``: the policy (and, for PPO, its critic) trained with megatron-core, one
instance per rank.

A rollout's samples come in; the actor computes the old, reference and (per step) current
log-probs of every trained token through the vocab-parallel log-softmax at the rollout's
temperature, the advantages by explicit group id, and takes ``--num-steps-per-rollout`` optimizer
steps of ``--global-batch-size`` samples, each as ``--micro-batch-size`` (or token-budget)
micro-batches with gradient accumulation. Megatron's ``GPTModel`` (local layer spec), its
``DistributedDataParallel`` and optimizer, and its learning-rate scheduler do the work; the
same code runs on CPU (gloo, the compatibility layer) and GPU (nccl).

Every rank of a model-parallel group calls every method with the same samples (a Ray actor
group does it in issue 7; tests spawn processes). Loss aggregation is explicit
(``--loss-aggregation``): the denominator is the whole optimizer step's token (or sample) count,
so summing micro-batch losses gives exactly the full-batch loss whatever the micro-batching.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import pickle
import socket
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from agentrl.algorithms import (
    aggregate,
    compute_advantages,
    kl_estimate,
    mis_weights,
    ratio_within_bounds,
    tis_weights,
    total_loss,
    value_loss,
)
from agentrl.engine.weight_group import WeightGroup
from agentrl.errors import ConfigError
from agentrl.records.sample import Sample
from agentrl.trainer.activation_memory import activation_bytes, too_large_to_keep
from agentrl.trainer.batch import TrainBatch, build_batch, micro_batches
from agentrl.trainer.config import TrainerConfig, lora_targets, resolve_off_policy_correction
from agentrl.trainer.critic import ValueModel
from agentrl.trainer.distributed import init_model_parallel
from agentrl.trainer.hf_convert import (
    build_gpt_model,
    check_transformer_engine,
    hf_spec_of,
    read_hf_config,
    unwrap_model,
)
from agentrl.trainer.hf_weights import (
    export_hf_state_dict,
    load_hf_weights,
    save_hf_checkpoint,
    save_peft_adapter,
)
from agentrl.trainer.lora import LoraConfig, add_lora
from agentrl.trainer.model_flags import check_model_flags
from agentrl.trainer.replica_metrics import importance_ratio_metrics, sum_over_data_parallel
from agentrl.trainer.routing_replay import replay_targets, replaying
from agentrl.trainer.schedule import decay_steps, global_rank, load_schedule
from agentrl.trainer.trained_positions import packed_trained_logprobs, trained_token_logprobs

log = logging.getLogger(__name__)

__all__ = ["MegatronActor"]

LOGPROB_CHUNK = 4096
"""Tokens per chunk of fp32 shard logits in the log-prob and entropy computations."""


class MegatronActor:
    """The policy (and, with a KL term, a frozen reference copy) on this rank.

    Args:
        config: Trainer flags (validated here). ``--off-policy-correction auto`` is solved by
            :func:`~agentrl.run.validation.validate_together` from the run's flags;
            a config built without them keeps ``auto`` and gets what it means for fresh samples
            (none; tis with ``--use-tis``).
        hf_checkpoint: Hugging Face directory of the initial weights; ``None`` builds a
            random-init model from the model flags (``model_overrides`` must then give
            ``vocab_size``).
        rollout_temperature: The engine's sampling temperature: logits are divided by it before
            the log-softmax, so trainer and engine log-probs are the same quantity.
        total_steps: Optimizer steps of the whole run, for the learning-rate decay (which
            spans them unless ``--lr-decay-iters`` is given); :meth:`load_checkpoint` stretches
            a resumed schedule to it. ``None``: unknown (a resumed schedule keeps its span).
        pad_id: Token id used for padding.
        model_overrides: Extra model-flag values (e.g. ``vocab_size``) merged over ``config``.

    Raises:
        ConfigError: A flag cannot work here (pipeline parallelism, sequence parallelism on
            CPU) or contradicts the checkpoint; the message names the flag.
    """

    def __init__(
        self, config: TrainerConfig, *, hf_checkpoint: str | Path | None,
        rollout_temperature: float = 1.0, total_steps: int | None = None, pad_id: int = 0,
        model_overrides: Mapping[str, Any] | None = None,
    ) -> None:
        config.validate()
        if config.pipeline_model_parallel_size > 1:
            raise ConfigError("--pipeline-model-parallel-size > 1 is not supported by the "
                              "Megatron actor yet: use tensor parallelism (and data parallelism)")
        cuda = torch.cuda.is_available()
        if config.sequence_parallel and not cuda:
            raise ConfigError("--sequence-parallel needs CUDA GPUs (with Transformer Engine); "
                              "drop it on this machine")
        # train.py's config comes solved; one built directly (tests, benchmarks) is solved the same
        # way, for an actor handed each rollout right after its weights sampled it
        self.config = config = resolve_off_policy_correction(config, staleness_can_be_positive=False)
        if config.transformer_impl == "transformer_engine":
            check_transformer_engine()  # before anything loads: says why it cannot run here
        self.temperature = max(float(rollout_temperature), 1e-6)
        self.pad_id = pad_id
        self.total_steps = total_steps
        self.device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
        init_model_parallel(config.tensor_model_parallel_size, 1, ep=config.expert_model_parallel_size,
                            seed=config.seed)
        torch.manual_seed(config.seed)
        from megatron.core import parallel_state

        self.dp_rank = parallel_state.get_data_parallel_rank()
        self.dp_size = parallel_state.get_data_parallel_world_size()
        self.ep_size = parallel_state.get_expert_model_parallel_world_size()

        flags = {**dataclasses.asdict(config), **dict(model_overrides or {})}
        source = read_hf_config(hf_checkpoint) if hf_checkpoint is not None else None
        self.hf_config = check_model_flags(source, flags)
        self.hf_checkpoint = Path(hf_checkpoint) if hf_checkpoint is not None else None
        bf16 = cuda if config.bf16 is None else config.bf16
        self.params_dtype = torch.bfloat16 if bf16 else torch.float32
        overrides: dict[str, Any] = {}
        if config.sequence_parallel:
            overrides["sequence_parallel"] = True
        if config.recompute_activations:
            overrides.update(recompute_granularity="full", recompute_method="uniform",
                             recompute_num_layers=1)
        if config.moe_aux_loss_coeff:
            overrides["moe_aux_loss_coeff"] = config.moe_aux_loss_coeff
        if config.routing_replay:
            overrides["moe_enable_routing_replay"] = True
        self.replayed_rows = [0, 0]
        """Rows trained or scored with replayed routes, and all rows (``--routing-replay``)."""
        self.recomputed_micro_batches = 0
        """Micro-batches whose activations were recomputed because they would not fit."""
        self._recompute_noted = False
        self.model = self._build(overrides)
        self.vocab_size = hf_spec_of(self.model).vocab_size
        self.ref_model = None
        if config.use_kl_loss or config.kl_coef:
            # the base model, replaying the rollout's routes as the policy does
            self.ref_model = self._build({k: v for k, v in overrides.items() if k == "moe_enable_routing_replay"})
            self.ref_model.load_state_dict(self.model.state_dict())
            self.ref_model.eval().requires_grad_(False)
        self.lora: LoraConfig | None = None
        if config.lora_rank:
            # after the reference copy: the reference is the base model, without adapters
            self.lora = LoraConfig(config.lora_rank, config.lora_alpha, config.lora_dropout,
                                   lora_targets(config.lora_target_modules), seed=config.seed)
            add_lora(unwrap_model(self.model), self.lora)
        policy_lr = (config.lora_lr or config.lr) if self.lora is not None else config.lr
        self.ddp, self.optimizer, self.scheduler = self._optimizer_for(self.model, policy_lr, total_steps)
        self.critic = None
        if config.advantage_estimator == "ppo":
            self.critic = ValueModel(self.hf_config, params_dtype=self.params_dtype,
                                     hf_checkpoint=self.hf_checkpoint,
                                     transformer_impl=config.transformer_impl,
                                     **overrides).to(self.device)
            self.critic_ddp, self.critic_optimizer, self.critic_scheduler = self._optimizer_for(
                self.critic, config.critic_lr or config.lr, total_steps)
        self.step = 0

    # -- model -----------------------------------------------------------------------------

    def _build(self, overrides: dict[str, Any]) -> Any:
        model = build_gpt_model(self.hf_config, params_dtype=self.params_dtype,
                                transformer_impl=self.config.transformer_impl, **overrides)
        model.to(self.device)
        if self.hf_checkpoint is not None:
            load_hf_weights(model, self.hf_checkpoint)
        return model

    def _optimizer_for(self, module: Any, lr: float, total_steps: int | None
                       ) -> tuple[Any, Any, Any]:
        """Megatron DDP, optimizer and learning-rate scheduler for ``module``."""
        from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
        from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
        from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler

        c = self.config
        cuda = self.device.type == "cuda"
        ddp = DistributedDataParallel(
            module.config,
            DistributedDataParallelConfig(grad_reduce_in_fp32=True, use_distributed_optimizer=cuda),
            module,
        )
        optimizer_config = OptimizerConfig(
            optimizer="adam", lr=lr, min_lr=min(c.min_lr, lr), weight_decay=c.weight_decay,
            adam_beta1=c.adam_beta1, adam_beta2=c.adam_beta2, adam_eps=c.adam_eps,
            clip_grad=c.clip_grad, bf16=self.params_dtype == torch.bfloat16,
            params_dtype=self.params_dtype,
            use_distributed_optimizer=cuda,
        )
        optimizer = get_megatron_optimizer(optimizer_config, [ddp])
        steps = max(1, total_steps or 1)
        decay = c.lr_decay_iters or steps
        scheduler = OptimizerParamScheduler(
            optimizer, init_lr=0.0 if c.lr_warmup_iters else lr, max_lr=lr,
            min_lr=min(c.min_lr, lr), lr_warmup_steps=c.lr_warmup_iters,
            lr_decay_steps=decay_steps(c, total_steps), lr_decay_style=c.lr_decay_style,
            start_wd=c.weight_decay, end_wd=c.weight_decay, wd_incr_steps=max(decay, 1),
            wd_incr_style="constant",
        )
        return ddp, optimizer, scheduler

    def _trained(self, model: Any, batch: TrainBatch, *, temperature: float, entropy: bool = False,
                 entropy_grad: bool = True) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``[b, L - 1]`` log-probs (and entropies) of the next token where ``batch.mask`` trains
        one, 0 elsewhere; the LM head runs at those positions only
        (:mod:`agentrl.trainer.trained_positions`). Causal attention: right padding never
        attends. Targets were checked once per batch (:meth:`_as_batch`)."""
        if not self.config.sequence_parallel:
            # packed: a micro-batch's rows concatenated without padding (trained_positions.py)
            lengths = [max(len(s.tokens), 1) for s in batch.samples]
            tokens, mask, rows = batch.tokens, batch.mask, len(lengths)
            if self.ep_size > 1:  # every expert-parallel rank packs as many tokens
                tokens, mask, lengths = _padded_to(int(_ep_max(torch.tensor(sum(lengths), device=self.device))),
                                                   tokens, mask, lengths, self.pad_id)
            with replaying(model, self._replay_targets(batch.samples, lengths[:rows], sum(lengths[rows:]))):
                logp, ent = packed_trained_logprobs(
                    model, tokens, lengths, mask,
                    device=self.device, vocab_size=self.vocab_size, temperature=temperature,
                    chunk_size=LOGPROB_CHUNK, entropy=entropy, entropy_grad=entropy_grad,
                    # Transformer Engine's attention reads Megatron's packed-sequence parameters
                    layout="thd" if self.config.transformer_impl == "transformer_engine" else "sbhd")
            width = batch.mask.shape[1]
            return logp[:rows, :width], ent[:rows, :width] if ent is not None else None
        return trained_token_logprobs(
            model, batch.tokens.to(self.device), batch.mask, vocab_size=self.vocab_size,
            temperature=temperature, chunk_size=LOGPROB_CHUNK, entropy=entropy,
            entropy_grad=entropy_grad, every_position=self.config.sequence_parallel)

    @contextlib.contextmanager
    def _recomputing_if_large(self, model: Any, tokens: int) -> Iterator[None]:
        """Within the block (a micro-batch's forward and backward), ``model`` recomputes its
        activations in the backward pass when ``--recompute-activations`` is left to its default
        and the micro-batch's would take more than half the free memory
        (:mod:`agentrl.trainer.activation_memory`). Recomputing changes no result. Never with
        ``--routing-replay``, whose replayed routes the recomputation would not see."""
        c = self.config
        spec = hf_spec_of(unwrap_model(self.model))
        if (c.recompute_activations is not None or c.routing_replay
                or not too_large_to_keep(tokens, spec.num_layers, spec.hidden_size, self.params_dtype,
                                         self.device)):
            yield
            return
        if not self._recompute_noted:
            self._recompute_noted = True
            log.warning("a micro-batch of %d tokens would keep about %.1f GiB of activations, more than "
                        "half the free memory: recomputing them in the backward pass for such micro-"
                        "batches (same result, a second forward; --recompute-activations always, "
                        "--no-recompute-activations never)", tokens,
                        activation_bytes(tokens, spec.num_layers, spec.hidden_size, self.params_dtype) / 2**30)
        config = unwrap_model(model).config
        config.recompute_granularity, config.recompute_method, config.recompute_num_layers = "full", "uniform", 1
        try:
            yield
        finally:
            config.recompute_granularity = config.recompute_method = config.recompute_num_layers = None
            self.recomputed_micro_batches += 1

    def _replay_targets(self, samples: Sequence[Sample], lengths: Sequence[int], padding: int = 0
                        ) -> torch.Tensor | None:
        """The routes to replay for a packed micro-batch (``--routing-replay``), or ``None``;
        ``padding`` tokens after the samples' (expert parallelism's) get the filler."""
        if not self.config.routing_replay:
            return None
        spec = hf_spec_of(unwrap_model(self.model))
        targets = replay_targets(samples, lengths, spec.num_layers, spec.moe_topk)
        if targets is not None and padding:
            filler = torch.arange(spec.moe_topk).expand(padding, spec.num_layers, spec.moe_topk)
            targets = torch.cat([targets, filler])
        self.replayed_rows[0] += len(samples) if targets is not None else 0
        self.replayed_rows[1] += len(samples)
        return targets

    @torch.no_grad()
    def logprobs(self, samples_or_batch: Sequence[Sample] | TrainBatch, *, reference: bool = False
                 ) -> torch.Tensor:
        """Per-token log-probs ``[B, L - 1]`` (shifted layout, see :mod:`agentrl.trainer.batch`)
        under the policy, or the reference model; 0 where nothing is predicted.

        Raises:
            ConfigError: ``reference=True`` without a reference model (no KL term configured).
        """
        batch = self._as_batch(samples_or_batch)
        model = self.ref_model if reference else self.model
        if model is None:
            raise ConfigError("no reference model: it exists with --use-kl-loss or --kl-coef")
        model.eval()
        out = torch.zeros(batch.mask.shape, device=self.device)  # to the host once, at the end
        for rows in self._micro(batch):
            part = batch.select(rows)
            logp, _ = self._trained(model, part, temperature=self.temperature)
            out[rows, : logp.shape[1]] = logp
        return out.cpu()

    @torch.no_grad()
    def values(self, samples_or_batch: Sequence[Sample] | TrainBatch) -> torch.Tensor:
        """The critic's values ``[B, L - 1]`` in the shifted layout, 0 where nothing is trained.

        Raises:
            ConfigError: There is no critic (``--advantage-estimator`` is not ``ppo``).
        """
        if self.critic is None:
            raise ConfigError("no critic: it exists with --advantage-estimator ppo")
        batch = self._as_batch(samples_or_batch)
        self.critic.eval()
        out = torch.zeros(batch.mask.shape, device=self.device)  # to the host once, at the end
        for rows in self._micro(batch):
            part = batch.select(rows)
            values = self.critic(part.tokens.to(self.device))[:, :-1].float()
            out[rows, : values.shape[1]] = values * part.mask.to(values.device)
        return out.cpu()

    # -- training --------------------------------------------------------------------------

    def train(self, samples: Sequence[Sample]) -> dict[str, float]:
        """One rollout's training: advantages, then ``--num-steps-per-rollout`` steps.

        Args:
            samples: The rollout's samples (every group complete), in any order.

        Returns:
            Metrics averaged over the steps: ``loss``, ``pg_loss``, ``kl_loss``, ``entropy``,
            ``clip_fraction``, ``ppo_kl``, ``grad_norm``, ``lr``, ``advantage_abs_mean``,
            ``train_tokens_per_s``, ``logprob_abs_diff`` and ``logprob_k3_kl`` (the trainer's
            log-probs against the rollout's: the mean absolute difference, and the k3 estimate
            of KL(rollout policy || trainer) on the rollout's tokens). With an
            ``--off-policy-correction`` (not none), over the trained tokens at the pre-step
            policy: ``is_ratio_mean`` / ``is_ratio_min`` / ``is_ratio_max`` of
            ``exp(old - rollout)``, the share outside ``[--tis-clip-low, --tis-clip]``
            (``is_clipped_fraction`` for tis, ``is_masked_fraction`` for mis) and
            ``logprob_drift`` (mean ``|old - rollout|``). With ``--routing-replay``:
            ``routing_replayed``, the share of the rows' forwards that replayed the rollout's
            routes (a micro-batch with a sample without recorded routes routes again).
        """
        c = self.config
        batch = self._as_batch(samples)
        started = time.perf_counter()
        self.replayed_rows = [0, 0]
        steps = c.num_steps_per_rollout or 1
        step_size = c.global_batch_size or len(batch.samples)
        if c.global_batch_size is None:  # a varying sample count: equal shares, in order
            if len(batch.samples) < steps:
                raise ConfigError(f"the rollout has {len(batch.samples)} samples, fewer than "
                                  f"--num-steps-per-rollout {steps}")
            bounds = [len(batch.samples) * i // steps for i in range(steps + 1)]
            step_rows = [list(range(bounds[i], bounds[i + 1])) for i in range(steps)]
        elif step_size * steps != len(batch.samples):
            raise ConfigError(
                f"the rollout has {len(batch.samples)} samples but --global-batch-size x "
                f"--num-steps-per-rollout = {step_size} x {steps}: check the batch equation")
        else:
            step_rows = [list(range(i * step_size, (i + 1) * step_size)) for i in range(steps)]
        if c.loss_type == "sft_loss":
            history = [self._sft_step(batch, rows) for rows in step_rows]
            metrics = {k: sum(h[k] for h in history) / len(history) for k in history[0]}
            elapsed = time.perf_counter() - started
            metrics["train_tokens_per_s"] = float(batch.lengths.sum()) * steps / max(elapsed, 1e-9)
            return metrics
        correction = c.off_policy_correction
        old = self.logprobs(batch) if steps > 1 or correction != "none" or c.kl_coef else None
        keep, off_policy = None, {}
        if correction != "none":
            assert old is not None
            off_policy = self._importance_ratio_metrics(batch, step_rows, old)
            if correction == "mis":  # from the pre-step policy, as the ratio is
                keep = ratio_within_bounds(old, batch.rollout_logprobs, batch.mask,
                                           low=c.tis_clip_low, high=c.tis_clip)
        ref = self.logprobs(batch, reference=True) if self.ref_model is not None else None
        kl = kl_estimate(old, ref, "k1") * batch.mask if c.kl_coef and old is not None else None
        values = self.values(batch) if self.critic is not None else None
        estimate = compute_advantages(
            c.advantage_estimator, batch.rewards, batch.groups, batch.mask, values=values,
            kl=kl, kl_coef=c.kl_coef, gamma=c.gamma, lam=c.lambd,
            std_normalize=not c.disable_grpo_std_normalization,
        )
        advantages = estimate.advantages
        history: list[dict[str, float]] = []
        for rows in step_rows:
            metrics = self._step(batch, rows, advantages, old, ref, keep)
            if self.critic is not None:
                assert values is not None and estimate.returns is not None
                metrics.update(self._critic_step(batch, rows, values, estimate.returns))
            history.append(metrics)
        metrics = {k: sum(h[k] for h in history) / len(history) for k in history[0]}
        elapsed = time.perf_counter() - started
        metrics["train_tokens_per_s"] = float(batch.lengths.sum().item()) * steps / max(elapsed, 1e-9)
        metrics["advantage_abs_mean"] = float((advantages.abs() * batch.mask).sum() /
                                              batch.mask.sum().clamp(min=1))
        if c.routing_replay:  # rows whose forwards replayed the rollout's routes
            metrics["routing_replayed"] = self.replayed_rows[0] / max(self.replayed_rows[1], 1)
        return {**metrics, **off_policy}

    def _importance_ratio_metrics(self, batch: TrainBatch, step_rows: list[list[int]],
                                  old: torch.Tensor) -> dict[str, float]:
        """:meth:`train`'s ``is_*`` and ``logprob_drift`` metrics. Every replica holds the whole
        batch's ``old``; each counts only the rows it trains, so the reduce counts a token once."""
        c = self.config
        mine = [rows[i] for rows in step_rows
                for micro in self._my_micro_batches(batch.select(rows))
                if not isinstance(micro, _IdleMicroBatch) for i in micro]
        return importance_ratio_metrics(
            old[mine], batch.rollout_logprobs[mine], batch.mask[mine],
            correction=c.off_policy_correction, low=c.tis_clip_low, high=c.tis_clip,
            device=self.device)

    def _step(self, batch: TrainBatch, rows: list[int], advantages: torch.Tensor,
              old: torch.Tensor | None, ref: torch.Tensor | None, keep: torch.Tensor | None
              ) -> dict[str, float]:
        """One optimizer step over ``rows`` of ``batch``; ``keep`` (mis) drops tokens from the
        loss, its numerator and its denominator."""
        c = self.config
        step_batch = batch.select(rows)
        mask = step_batch.mask
        trained = mask if keep is None else mask * keep[rows, : mask.shape[1]]
        denominator = self._denominator(trained)
        self.model.train()
        self.ddp.zero_grad_buffer()
        self.optimizer.zero_grad()
        # on the device until the step ends: one transfer to the host per step (sum_over_data_parallel)
        sums: dict[str, torch.Tensor] = {}
        logprob_diff = torch.zeros((), device=self.device)
        mismatch_k3 = torch.zeros((), device=self.device)
        for micro in self._my_micro_batches(step_batch):
            part = self._part(step_batch, micro)
            width = part.mask.shape[1]
            index = [rows[i] for i in micro]
            with self._recomputing_if_large(self.model, _tokens_of(part)):
                logp, entropy = self._trained(self.model, part, temperature=self.temperature, entropy=True,
                                              entropy_grad=bool(c.entropy_coef))  # else only a metric
                m = part.mask.to(logp.device)
                old_logp = (old[index, :width] if old is not None else logp.detach()).to(logp.device)
                weights = None
                if c.off_policy_correction != "none":
                    weigh = tis_weights if c.off_policy_correction == "tis" else mis_weights
                    weights = weigh(old_logp, part.rollout_logprobs.to(logp.device), m,
                                    low=c.tis_clip_low, high=c.tis_clip)
                loss_mask = m if keep is None else m * keep[index, :width].to(logp.device)
                loss, parts = total_loss(
                    logp, old_logp, advantages[index, :width].to(logp.device), loss_mask,
                    entropy=entropy, entropy_coef=c.entropy_coef,
                    ref_logp=ref[index, :width].to(logp.device) if ref is not None and c.use_kl_loss else None,
                    kl_loss_coef=c.kl_loss_coef if c.use_kl_loss else 0.0, kl_loss_type=c.kl_loss_type,
                    eps_clip=c.eps_clip, eps_clip_high=c.eps_clip_high, eps_clip_c=c.eps_clip_c,
                    ratio="sequence" if c.advantage_estimator == "gspo" else "token",
                    tis_weights=weights, aggregation=c.loss_aggregation, denominator=denominator,
                )
                (loss * self.dp_size).backward()  # data-parallel gradients are averaged, not summed
            for key, value in parts.items():
                sums[key] = sums[key] + value.detach() if key in sums else value.detach()
            rollout_logp = part.rollout_logprobs.to(logp.device)
            logprob_diff = logprob_diff + ((logp.detach() - rollout_logp).abs() * m).sum()
            # KL(rollout policy || trainer), estimated on the rollout's own tokens
            # (in float64: k3 ~ gap^2 / 2, which float32 rounds to 0 for float32-sized gaps)
            mismatch_k3 = mismatch_k3 + (kl_estimate(rollout_logp.double(), logp.detach().double(), "k3")
                                         * m).sum().float()
        sums["logprob_abs_diff"] = logprob_diff
        sums["logprob_k3_kl"] = mismatch_k3
        totals = sum_over_data_parallel(sums, self.device)
        totals["grad_norm"] = _apply_step(self.ddp, self.optimizer, self.scheduler)
        self.step += 1
        tokens = max(float(mask.sum()), 1.0)
        totals["lr"] = float(self.optimizer.param_groups[0]["lr"])
        totals["logprob_abs_diff"] /= tokens
        totals["logprob_k3_kl"] /= tokens
        return totals

    def _sft_step(self, batch: TrainBatch, rows: list[int]) -> dict[str, float]:
        """One supervised step: the negative log-likelihood of the mask-1 (assistant) tokens, at
        temperature 1, aggregated as ``--loss-aggregation`` says."""
        c = self.config
        step_batch = batch.select(rows)
        denominator = self._denominator(step_batch.mask)
        self.model.train()
        self.ddp.zero_grad_buffer()
        self.optimizer.zero_grad()
        total = torch.zeros((), device=self.device)  # on the device until the step ends
        for micro in self._my_micro_batches(step_batch):
            part = self._part(step_batch, micro)
            with self._recomputing_if_large(self.model, _tokens_of(part)):
                logp, _ = self._trained(self.model, part, temperature=1.0)
                loss = -aggregate(logp, part.mask.to(logp.device), c.loss_aggregation,
                                  denominator=denominator)
                (loss * self.dp_size).backward()
            total = total + loss.detach()
        total = sum_over_data_parallel({"sft_loss": total}, self.device)["sft_loss"]
        grad_norm = _apply_step(self.ddp, self.optimizer, self.scheduler)
        self.step += 1
        return {"sft_loss": total, "grad_norm": grad_norm,
                "lr": float(self.optimizer.param_groups[0]["lr"])}

    def _critic_step(self, batch: TrainBatch, rows: list[int], old_values: torch.Tensor,
                     returns: torch.Tensor) -> dict[str, float]:
        """One critic step over ``rows``: the clipped value loss against the GAE returns."""
        c = self.config
        assert self.critic is not None
        step_batch = batch.select(rows)
        denominator = self._denominator(step_batch.mask)
        self.critic.train()
        self.critic_ddp.zero_grad_buffer()
        self.critic_optimizer.zero_grad()
        sums: dict[str, torch.Tensor] = {}  # on the device until the step ends
        for micro in self._my_micro_batches(step_batch):
            part = step_batch.select(micro)
            width = part.mask.shape[1]
            index = [rows[i] for i in micro]
            predicted = self.critic(part.tokens.to(self.device))[:, :-1].float()
            m = part.mask.to(predicted.device)
            loss, parts = value_loss(
                predicted, old_values[index, :width].to(predicted.device),
                returns[index, :width].to(predicted.device), m, value_clip=c.value_clip,
                aggregation=c.loss_aggregation, denominator=denominator,
            )
            (loss * self.dp_size).backward()
            for key, value in parts.items():
                sums[key] = sums[key] + value.detach() if key in sums else value.detach()
        totals = sum_over_data_parallel(sums, self.device)
        totals["critic_grad_norm"] = _apply_step(self.critic_ddp, self.critic_optimizer,
                                               self.critic_scheduler)
        return totals

    def _denominator(self, mask: torch.Tensor) -> float:
        if self.config.loss_aggregation == "token_mean":
            return max(float(mask.sum()), 1.0)
        return max(float((mask.sum(dim=1) > 0).sum()), 1.0)

    def _my_micro_batches(self, batch: TrainBatch) -> list[list[int]]:
        """This data-parallel replica's share of a step's micro-batches (round robin). Losses
        are divided by the whole step's denominator, so the replicas' parts add up to the step's
        loss; each backward is scaled by the replica count because Megatron's DDP averages
        gradients over replicas. A mixture of experts' load-balancing loss is averaged over
        the micro-batches the same way (megatron adds its gradient at a scale the training loop
        sets)."""
        mine = self._micro(batch)[self.dp_rank :: self.dp_size]
        if self.config.moe_aux_loss_coeff:
            self._set_aux_loss_scale(1.0 / max(len(mine), 1))
        if self.ep_size > 1:  # as many as every expert-parallel rank runs (see _IdleMicroBatch)
            most = int(_ep_max(torch.tensor(len(mine), device=self.device)))
            mine = mine + [_IdleMicroBatch(mine[0][:1] if mine else [0])] * (most - len(mine))
        return mine

    def _set_aux_loss_scale(self, scale: float) -> None:
        from megatron.core.transformer.moe.moe_utils import MoEAuxLossAutoScaler

        MoEAuxLossAutoScaler.set_loss_scale(torch.tensor(scale, device=self.device))

    def _part(self, step_batch: TrainBatch, micro: list[int]) -> TrainBatch:
        """A micro-batch's rows; an idle one's (:class:`_IdleMicroBatch`) with nothing trained,
        and with no load-balancing loss either."""
        part = step_batch.select(micro)
        if not isinstance(micro, _IdleMicroBatch):
            return part
        if self.config.moe_aux_loss_coeff:
            self._set_aux_loss_scale(0.0)  # the last micro-batch: nothing runs after it
        return dataclasses.replace(part, mask=torch.zeros_like(part.mask))

    def _micro(self, batch: TrainBatch) -> list[list[int]]:
        lengths = batch.lengths.tolist()
        if self.config.use_dynamic_batch_size:  # packed unless sequence parallel (see _trained)
            return micro_batches(lengths, max_tokens=self.config.max_tokens_per_gpu,
                                 packed=not self.config.sequence_parallel)
        return micro_batches(lengths, micro_batch_size=self.config.micro_batch_size)

    def _as_batch(self, samples_or_batch: Sequence[Sample] | TrainBatch) -> TrainBatch:
        if isinstance(samples_or_batch, TrainBatch):
            return samples_or_batch
        batch = build_batch(list(samples_or_batch), pad_id=self.pad_id)
        # the targets' range, once per batch on the host (the log-prob functions skip the check,
        # which would read the device twice per micro-batch)
        low, high = int(batch.tokens.min()), int(batch.tokens.max())
        if low < 0 or high >= self.vocab_size:
            raise ValueError(f"token ids must lie in [0, {self.vocab_size}) (the model's vocabulary); "
                             f"the batch has [{low}, {high}]")
        return batch

    # -- weights and checkpoints -------------------------------------------------------------

    def hf_state_dict(self) -> dict[str, torch.Tensor]:
        """The policy's weights under Hugging Face names (gathered over tensor parallelism; a
        collective: every TP rank calls it), as ``Engine.update_weights(state_dict=...)`` takes."""
        return export_hf_state_dict(self.model)

    def hf_state_dict_ref(self) -> None:
        """``None``: a trainer in this process has no object store to leave the weights in
        (:meth:`hf_state_dict` gives them)."""
        return None

    def rank0_address(self) -> tuple[str, int]:
        """Loopback and a free port on it: rank 0 is this process (a weight-broadcast group's
        rendezvous)."""
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            return "127.0.0.1", int(sock.getsockname()[1])

    def open_weight_group(self, master_address: str, master_port: int, world_size: int,
                          group_name: str, backend: str) -> None:
        """Global rank 0 joins a weight-broadcast group with inference servers as its rank 0 and
        hosts its rendezvous (see :class:`~agentrl.engine.weight_group.WeightGroup`);
        blocks until every server has joined. Other ranks do nothing."""
        if global_rank() == 0:
            self.weight_group = WeightGroup(master_address, master_port, 0, world_size, group_name, backend)

    def weight_metadata(self) -> dict[str, list[Any]]:
        """Names, dtypes and shapes of :meth:`hf_state_dict` (a collective, like it)."""
        return WeightGroup.metadata(self.hf_state_dict())

    def broadcast_weights(self) -> None:
        """Gathers the HF-named weights (a collective over tensor parallelism) and global rank 0
        broadcasts them over the weight group, in :meth:`weight_metadata`'s order."""
        state = self.hf_state_dict()
        if global_rank() == 0:
            self.weight_group.send(state.values())

    def save_hf(self, out_dir: str | Path, tokenizer_dir: str | Path | None = None) -> Path:
        """Writes a Hugging Face directory (collective over all ranks; rank 0 writes). With LoRA
        the weights have the adapters merged in; :meth:`save_adapter` writes the adapters alone."""
        tokenizer_dir = tokenizer_dir or self.hf_checkpoint
        return save_hf_checkpoint(self.model, self.hf_config, out_dir, tokenizer_dir=tokenizer_dir)

    def save_adapter(self, out_dir: str | Path, base_model: str | None = None) -> Path:
        """Writes the LoRA adapters alone in PEFT's format (collective; rank 0 writes).

        Args:
            out_dir: Destination folder (created).
            base_model: What ``adapter_config.json`` names as the base model (PEFT's
                ``base_model_name_or_path``); default: the folder this run started from.

        Raises:
            ConfigError: The policy has no adapters (``--lora-rank`` is 0).
        """
        if self.lora is None:
            raise ConfigError("there are no LoRA adapters to write: train with --lora-rank R")
        if base_model is None and self.hf_checkpoint is not None:
            base_model = str(self.hf_checkpoint)
        return save_peft_adapter(self.model, self.lora, out_dir, base_model=base_model)

    def save_checkpoint(self, directory: str | Path, extra: Mapping[str, Any] | None = None) -> None:
        """Saves model, optimizer, scheduler, step and RNG states (Megatron distributed checkpoint;
        reshardable: a TP=1 checkpoint loads at TP=2). ``extra`` is kept with it (JSON-able)."""
        from megatron.core import dist_checkpointing

        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        model_state = self.model.sharded_state_dict()
        state = {
            "model": model_state,
            "optimizer": self.optimizer.sharded_state_dict(model_state),
            "scheduler": self.scheduler.state_dict(),
            "step": self.step,
            "rng": torch.get_rng_state(),
            "extra": dict(extra or {}),
            "expert_model_parallel_size": self.ep_size,
        }
        if self.critic is not None:
            critic_state = self.critic.sharded_state_dict(prefix="critic.")
            state["critic"] = critic_state
            state["critic_optimizer"] = self.critic_optimizer.sharded_state_dict(critic_state)
            state["critic_scheduler"] = self.critic_scheduler.state_dict()
        dist_checkpointing.save(state, str(directory))

    def _check_expert_parallel_of(self, directory: str | Path) -> None:
        """Refuses a checkpoint saved at another ``--expert-model-parallel-size``: megatron keeps
        the experts' optimizer state in an optimizer of its own when the experts are split
        (a chained optimizer), so the state's layout differs and cannot be resharded."""
        from megatron.core import dist_checkpointing

        try:
            saved = dist_checkpointing.load_common_state_dict(str(directory)).get("expert_model_parallel_size", 1)
        except Exception:  # noqa: BLE001 (an unreadable checkpoint is reported by the load itself)
            return
        if int(saved) != self.ep_size and hf_spec_of(unwrap_model(self.model)).is_moe:
            raise ConfigError(
                f"checkpoint {directory} was saved with --expert-model-parallel-size {saved}; this run "
                f"has {self.ep_size}: the experts' optimizer state is laid out per expert-parallel "
                f"size, so resume with --expert-model-parallel-size {saved}, or start a new run from "
                f"its weights (agentrl export RUN --hf DIR, then --hf-checkpoint DIR)")

    def load_checkpoint(self, directory: str | Path) -> dict[str, Any]:
        """Restores what :meth:`save_checkpoint` saved; returns its ``extra``. The learning-rate
        schedules continue from the checkpoint's step with this run's decay span (see
        :func:`~agentrl.trainer.schedule.load_schedule`).

        Raises:
            ConfigError: The checkpoint cannot be read (a missing folder, a truncated or
                damaged file, or one saved for another model); names the folder. Or every
                optimizer step left would train at lr 0; names the flags.
        """
        from megatron.core import dist_checkpointing
        from megatron.core.dist_checkpointing.core import CheckpointingException
        from torch.distributed.checkpoint.api import CheckpointException

        self._check_expert_parallel_of(directory)
        model_state = self.model.sharded_state_dict()
        template = {
            "model": model_state,
            "optimizer": self.optimizer.sharded_state_dict(model_state, is_loading=True),
        }
        if self.critic is not None:
            critic_state = self.critic.sharded_state_dict(prefix="critic.")
            template["critic"] = critic_state
            template["critic_optimizer"] = self.critic_optimizer.sharded_state_dict(
                critic_state, is_loading=True)
        # What a damaged checkpoint raises, by file: torch's CheckpointException (a
        # BaseException) for *.distcp and .metadata, RuntimeError for common.pt, ValueError for
        # metadata.json, CheckpointingException for a missing folder, EOFError / AssertionError
        # / UnpicklingError for other truncations.
        damaged = (CheckpointException, CheckpointingException, EOFError, AssertionError,
                   OSError, RuntimeError, ValueError, KeyError, pickle.UnpicklingError)
        try:
            state = dist_checkpointing.load(template, str(directory))
        except damaged as exc:
            cause: BaseException = exc
            if isinstance(exc, CheckpointException) and exc.failures:  # a rank's own error
                cause = next(iter(exc.failures.values()))[0]
            first_line = (str(cause).strip().splitlines() or [""])[0][:300]
            raise ConfigError(
                f"checkpoint {directory} cannot be loaded ({type(cause).__name__}: {first_line}): "
                "it is damaged or was saved for another model; --load an earlier checkpoint"
            ) from exc
        if self.critic is not None:
            # its keys carry the prefix that keeps them apart from the policy's in the checkpoint
            self.critic.load_state_dict({k.removeprefix("critic."): v
                                         for k, v in state["critic"].items()})
            self.critic_optimizer.load_state_dict(state["critic_optimizer"])
            load_schedule(self.critic_scheduler, state["critic_scheduler"], "critic",
                          "--critic-lr" if self.config.critic_lr else "--lr", self.config,
                          self.total_steps)
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        load_schedule(self.scheduler, state["scheduler"], "policy",
                      "--lora-lr" if self.lora is not None and self.config.lora_lr else "--lr", self.config,
                      self.total_steps)
        self.step = int(state["step"])
        torch.set_rng_state(state["rng"])
        return dict(state.get("extra", {}))


def _tokens_of(part: TrainBatch) -> int:
    """A micro-batch's tokens, from its samples (host data: no tensor is read for it)."""
    return sum(max(len(s.tokens), 1) for s in part.samples)


class _IdleMicroBatch(list):
    """A micro-batch an expert-parallel rank runs only to keep in step with the others: each
    MoE layer all-gathers every rank's tokens, so all ranks run as many micro-batches, each of
    as many tokens. It repeats one of the rank's rows with nothing trained (see
    ``MegatronActor._part``)."""


def _ep_max(value: torch.Tensor) -> torch.Tensor:
    """The largest ``value`` over this process's expert-parallel group."""
    from megatron.core import parallel_state

    value = value.clone()
    dist.all_reduce(value, op=dist.ReduceOp.MAX, group=parallel_state.get_expert_model_parallel_group())
    return value


def _padded_to(total: int, tokens: torch.Tensor, mask: torch.Tensor, lengths: list[int], pad_id: int
               ) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
    """A packed micro-batch grown to ``total`` tokens by one more row of padding (nothing
    trained on it, attending only to itself), when it has fewer."""
    extra = total - sum(lengths)
    if extra <= 0:
        return tokens, mask, lengths
    width = max(tokens.shape[1], extra)
    grown = torch.full((tokens.shape[0] + 1, width), pad_id, dtype=tokens.dtype)
    grown[:-1, : tokens.shape[1]] = tokens
    grown_mask = torch.zeros((mask.shape[0] + 1, width - 1), dtype=mask.dtype)
    grown_mask[:-1, : mask.shape[1]] = mask
    return grown, grown_mask, [*lengths, extra]


def _apply_step(ddp: Any, optimizer: Any, scheduler: Any) -> float:
    """Reduces gradients over data-parallel ranks, steps the optimizer and the learning-rate
    schedule; returns the gradient norm (before clipping).

    Raises:
        RuntimeError: The optimizer skipped the step (non-finite gradients).
    """
    from megatron.core.distributed import finalize_model_grads

    finalize_model_grads([ddp])
    success, grad_norm, _ = optimizer.step()
    if not success:
        raise RuntimeError("the optimizer step was skipped (non-finite gradients)")
    scheduler.step(increment=1)
    return float(grad_norm) if grad_norm is not None else math.nan
