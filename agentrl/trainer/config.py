"""``TrainerConfig``: every training flag, typed, with its meaning.

The config is frozen: what the flags determine together with other configs (the batch shape,
from ``--rollout-batch-size`` x ``--n-samples-per-prompt``; ``--off-policy-correction auto``,
from how stale a rollout can be) is solved while the flags are parsed (:func:`batch_shape` and
:func:`resolve_off_policy_correction`, used by
:func:`agentrl.run.validation.validate_together`), and a new config carries the
result; nothing writes a field afterwards.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

from agentrl.algorithms.names import AGGREGATIONS, ESTIMATORS, KL_KINDS, default_aggregation
from agentrl.config import flag, option
from agentrl.errors import ConfigError

__all__ = ["CORRECTIONS", "LORA_TARGETS", "TRANSFORMER_IMPLS", "BatchShape", "TrainerConfig", "batch_shape",
           "lora_targets", "resolve_off_policy_correction"]

CORRECTIONS = ("auto", "tis", "mis", "none")
"""``--off-policy-correction`` values."""

LORA_TARGETS: dict[str, str] = {
    "q_proj": "self_attention.linear_qkv",
    "k_proj": "self_attention.linear_qkv",
    "v_proj": "self_attention.linear_qkv",
    "o_proj": "self_attention.linear_proj",
    "gate_proj": "mlp.linear_fc1",
    "up_proj": "mlp.linear_fc1",
    "down_proj": "mlp.linear_fc2",
}
"""``--lora-target-modules`` names (Hugging Face projections) -> the Megatron layer, within a
decoder layer, that computes each (agentrl/trainer/lora.py)."""


def lora_targets(names: str) -> tuple[str, ...]:
    """The Megatron layers that ``--lora-target-modules`` names.

    Args:
        names: Comma-separated Hugging Face projection names (:data:`LORA_TARGETS`), or
            ``all-linear``.

    Raises:
        ConfigError: No name, an unknown one, or part of a fused group; names the flag.
    """
    given = [n.strip() for n in names.split(",") if n.strip()]
    if not given:
        raise ConfigError("--lora-target-modules is empty: name projections (" + ",".join(LORA_TARGETS)
                          + ") or all-linear")
    if "all-linear" in given:
        given = list(LORA_TARGETS)
    unknown = [n for n in given if n not in LORA_TARGETS]
    if unknown:
        raise ConfigError(f"--lora-target-modules: unknown {', '.join(unknown)}; choose from "
                          f"{', '.join(LORA_TARGETS)} or all-linear")
    for group in (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj")):
        named = [n for n in group if n in given]
        if named and len(named) < len(group):
            layer = LORA_TARGETS[group[0]].split(".")[-1]
            raise ConfigError(f"--lora-target-modules: {', '.join(group)} are one fused layer in the "
                              f"Megatron model ({layer}); list all of them or none (got {', '.join(named)})")
    return tuple(dict.fromkeys(LORA_TARGETS[n] for n in given))


TRANSFORMER_IMPLS = ("local", "transformer_engine")
"""``--transformer-impl`` values (Megatron-LM's flag and names)."""


@dataclasses.dataclass(frozen=True)
class TrainerConfig:
    """Trainer settings; each field is the flag of the same name (``--global-batch-size``, ...)."""

    # model shape: checked against --hf-checkpoint's config (see agentrl.trainer.model_flags);
    # None means "not given"
    num_layers: int | None = option(None, "decoder layers")
    hidden_size: int | None = option(None, "residual width")
    ffn_hidden_size: int | None = option(None, "MLP width")
    num_attention_heads: int | None = option(None, "query heads")
    num_query_groups: int | None = option(None, "key/value heads (grouped-query attention)")
    kv_channels: int | None = option(None, "width of one attention head")
    vocab_size: int | None = option(None, "vocabulary size (before Megatron's padding)")
    max_position_embeddings: int | None = option(None, "context length of the position encoding")
    seq_length: int | None = option(None, "longest sequence the model handles")
    rotary_base: float | None = option(None, "rotary embedding base (rope_theta)")
    norm_epsilon: float | None = option(None, "RMSNorm epsilon")
    untie_embeddings_and_output_weights: bool | None = option(
        None, "separate input embedding and output layer weights")
    add_qkv_bias: bool | None = option(None, "biases on the query/key/value projections (Qwen2)")
    qk_layernorm: bool | None = option(None, "RMSNorm on queries and keys (Qwen3)")
    normalization: str | None = option(None, "the normalization layer (only RMSNorm is supported)")
    swiglu: bool | None = option(None, "a SwiGLU MLP (the only one supported)")
    # parallelism and memory
    tensor_model_parallel_size: int = option(1, "tensor-parallel ranks")
    expert_model_parallel_size: int = option(1, "expert-parallel ranks: each holds 1/N of every "
                                             "mixture-of-experts layer's experts; N data-parallel "
                                             "ranks share them (megatron's flag)")
    pipeline_model_parallel_size: int = option(1, "pipeline stages")
    sequence_parallel: bool = option(False, "sequence parallelism (GPU + Transformer Engine)")
    recompute_activations: bool | None = option(
        None, "recompute activations in the backward pass (default: only for the micro-batches "
        "whose activations would take more than half the free memory; --no-recompute-"
        "activations never; agentrl/trainer/activation_memory.py)")
    bf16: bool | None = option(None, "train in bfloat16: parameters and activations in bf16, "
                               "float32 master weights in the optimizer (default: on with CUDA; "
                               "off on CPU, where float32 keeps the trainer's log-probs equal to "
                               "the embedded engine's; docs/benchmarks.md has both speeds)")
    transformer_impl: str = option("local", "layer implementation: local (megatron's local spec "
                                   "with torch's fused attention; runs anywhere) | "
                                   "transformer_engine (Transformer Engine's fused layers; needs "
                                   "CUDA and the transformer_engine package)")
    # mixture of experts (Qwen3-MoE checkpoints)
    moe_aux_loss_coeff: float = option(0.0, "load-balancing loss coefficient of a mixture-of-"
                                       "experts model (megatron's aux_loss; 0: off, the usual "
                                       "choice when RL fine-tunes a trained router)")
    routing_replay: bool = option(False, "mixture-of-experts models: the trainer's forward uses "
                                  "the experts each token was routed to at rollout instead of "
                                  "routing again (the engine must report them: the embedded "
                                  "engine does; agentrl/trainer/routing_replay.py)")
    # batch
    global_batch_size: int | None = option(None, "samples per optimizer step (default: the whole "
                                           "rollout, one step per rollout)")
    num_steps_per_rollout: int | None = option(None, "optimizer steps per rollout")
    micro_batch_size: int = option(1, "samples per forward/backward (gradient accumulation)")
    use_dynamic_batch_size: bool = option(False, "micro-batches by a token budget: whole samples "
                                          "up to --max-tokens-per-gpu real tokens each, instead "
                                          "of --micro-batch-size samples (either way a "
                                          "micro-batch's samples run packed, concatenated "
                                          "without padding, unless --sequence-parallel)")
    max_tokens_per_gpu: int | None = option(None, "real tokens per packed micro-batch with "
                                            "--use-dynamic-batch-size (padded tokens under "
                                            "--sequence-parallel, which does not pack)")
    # optimizer
    lr: float = option(1e-6, "learning rate")
    min_lr: float = option(0.0, "floor of the decayed learning rate")
    lr_decay_style: str = option("constant", "constant | linear | cosine")
    lr_warmup_iters: int = option(0, "optimizer steps of linear warm-up")
    lr_decay_iters: int | None = option(None, "optimizer steps to decay over (default: all the "
                                        "run's; a --load with a larger --num-rollout extends it)")
    weight_decay: float = option(0.0, "AdamW weight decay")
    adam_beta1: float = option(0.9, "AdamW beta1")
    adam_beta2: float = option(0.98, "AdamW beta2")
    adam_eps: float = option(1e-8, "AdamW epsilon")
    clip_grad: float = option(1.0, "gradient-norm clip (0: off)")
    seed: int = option(1234, "trainer random seed")
    # low-rank adapters (agentrl/trainer/lora.py)
    lora_rank: int = option(0, "train LoRA adapters of this rank instead of every weight (0: off)")
    lora_alpha: float = option(16.0, "LoRA scale numerator: the update is (alpha / rank) * B A")
    lora_dropout: float = option(0.0, "dropout on the adapters' input while training")
    lora_target_modules: str = option("all-linear", "comma-separated projections to adapt "
                                      "(q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj; "
                                      "q/k/v and gate/up together) or all-linear")
    lora_lr: float | None = option(None, "learning rate of the adapters (default: --lr)")
    # algorithm
    loss_type: str = option("policy_loss", "policy_loss (RL) | sft_loss (supervised warm start "
                            "on demonstrations: assistant tokens only)")
    advantage_estimator: str = option("grpo", "grpo | gspo | ppo | reinforce_plus_plus | "
                                      "reinforce_plus_plus_baseline")
    disable_grpo_std_normalization: bool = option(False, "GRPO: r - mean, no division by std")
    eps_clip: float = option(0.2, "PPO clip range (low side)")
    eps_clip_high: float | None = option(None, "PPO clip range high side (default: --eps-clip)")
    eps_clip_c: float | None = option(None, "dual-clip constant c > 1 for negative advantages")
    entropy_coef: float = option(0.0, "entropy bonus coefficient")
    use_kl_loss: bool = option(False, "add a KL(policy || reference) loss")
    kl_loss_coef: float = option(0.0, "its coefficient (with --use-kl-loss)")
    kl_loss_type: str = option("k1", "k1 | k2 | k3 | low_var_kl")
    kl_coef: float = option(0.0, "KL penalty in the reward (ppo, reinforce_plus_plus)")
    gamma: float = option(1.0, "discount (ppo, reinforce_plus_plus)")
    lambd: float = option(1.0, "GAE lambda (ppo)")
    value_clip: float = option(0.2, "PPO value clip")
    critic_lr: float | None = option(None, "PPO critic learning rate (default: --lr)")
    off_policy_correction: str = option(
        "auto", "how the loss corrects for rollout log-probs that differ from the trainer's "
        "(engine numerics, stale weights), by the ratio rho = exp(old - rollout) per token: "
        "tis (truncated importance sampling: the loss is weighted by rho clamped to "
        "[--tis-clip-low, --tis-clip]) | mis (masked importance sampling: tokens whose rho is "
        "outside those bounds are dropped from the loss, numerator and denominator; the others "
        "are weighted by rho) | none | auto (tis when the rollout's weights can be older than "
        "the trainer's: --update-weights-interval > 1 or asynchronous training; none otherwise)")
    use_tis: bool = option(False, "the same as --off-policy-correction tis (kept for old "
                           "command lines)")
    tis_clip_low: float = option(0.0, "lower bound of the importance ratio (tis: its floor; "
                                 "mis: below it a token is dropped)")
    tis_clip: float = option(2.0, "upper bound of the importance ratio (tis: its cap; mis: "
                             "above it a token is dropped)")
    loss_aggregation: str | None = option(
        None, "token_mean (every token weighs the same) | seq_mean_token_mean (every sequence "
        "weighs the same) | seq_mean_token_sum; unset: seq_mean_token_mean with "
        "--advantage-estimator gspo (GSPO's loss averages per sequence, so a long sequence "
        "counts as much as a short one), token_mean otherwise")
    # checkpoints
    save: str | None = option(None, "checkpoint folder (Megatron distributed checkpoint; default "
                              "<output-dir>/checkpoints)")
    load: str | None = option(None, "checkpoint folder to resume from: a --save folder (its "
                              "newest complete checkpoint) or one rollout_<n> folder in it")
    save_interval: int | None = option(None, "save every N rollouts (the last rollout is always "
                                       "saved)")
    save_hf: str | None = option(None, "folder for Hugging Face exports (with each checkpoint)")

    def __post_init__(self) -> None:
        if self.loss_aggregation is None:
            # Part of construction: the unset default depends on the estimator. Frozen, so the
            # one way to set it is object.__setattr__, before anyone can read the config.
            gspo = self.advantage_estimator == "gspo" and self.loss_type == "policy_loss"
            object.__setattr__(self, "loss_aggregation",
                               default_aggregation("sequence" if gspo else "token"))

    def validate(self) -> None:
        """Raises ConfigError naming the first invalid flag and what to change."""
        checks = {
            "advantage_estimator": ESTIMATORS, "kl_loss_type": KL_KINDS,
            "loss_aggregation": AGGREGATIONS, "lr_decay_style": ("constant", "linear", "cosine"),
            "loss_type": ("policy_loss", "sft_loss"), "off_policy_correction": CORRECTIONS,
            "transformer_impl": TRANSFORMER_IMPLS,
        }
        for name, choices in checks.items():
            if getattr(self, name) not in choices:
                raise ConfigError(f"{flag(name)} must be one of {', '.join(choices)}; "
                                  f"got {getattr(self, name)!r}")
        self._check_ranges()
        if self.eps_clip_c is not None and self.eps_clip_c <= 1:
            raise ConfigError(f"--eps-clip-c must be > 1, got {self.eps_clip_c}")
        if self.use_tis and self.off_policy_correction not in ("auto", "tis"):
            raise ConfigError(f"--use-tis means --off-policy-correction tis, which contradicts "
                              f"--off-policy-correction {self.off_policy_correction}: drop "
                              "--use-tis")
        if self.tis_clip_low > self.tis_clip:
            raise ConfigError(f"--tis-clip-low {self.tis_clip_low} is above --tis-clip "
                              f"{self.tis_clip}: the floor must not exceed the cap")
        if self.lora_rank:
            lora_targets(self.lora_target_modules)
            if self.sequence_parallel:
                raise ConfigError("--lora-rank does not work with --sequence-parallel; drop one")
        elif self.lora_lr is not None:
            raise ConfigError("--lora-lr has no effect without --lora-rank R (R >= 1)")
        if self.expert_model_parallel_size > 1 and self.sequence_parallel:
            raise ConfigError("--expert-model-parallel-size > 1 with --sequence-parallel: expert "
                              "parallelism keeps packed micro-batches in step, and sequence "
                              "parallelism does not pack; drop one")
        if self.expert_model_parallel_size > 1 and self.advantage_estimator == "ppo":
            raise ConfigError("--expert-model-parallel-size > 1 with --advantage-estimator ppo: the "
                              "critic's steps are not kept in step across expert-parallel ranks; "
                              "use grpo, gspo or reinforce_plus_plus, or drop the flag")
        if self.routing_replay and (self.recompute_activations or self.sequence_parallel):
            raise ConfigError("--routing-replay replays a packed forward once: it does not work with "
                              "--recompute-activations or --sequence-parallel; drop one")
        if self.use_dynamic_batch_size and not self.max_tokens_per_gpu:
            raise ConfigError("--use-dynamic-batch-size needs --max-tokens-per-gpu N")
        if self.use_kl_loss and self.kl_loss_coef <= 0:
            raise ConfigError("--use-kl-loss needs --kl-loss-coef > 0")
        if not self.use_kl_loss and self.kl_loss_coef != 0.0:
            raise ConfigError(f"--kl-loss-coef {self.kl_loss_coef} has no effect without "
                              "--use-kl-loss: add --use-kl-loss, or drop --kl-loss-coef")
        if self.kl_coef and self.advantage_estimator in ("grpo", "gspo"):
            raise ConfigError("--kl-coef (KL in the reward) is for ppo / reinforce_plus_plus; "
                              "with grpo/gspo use --use-kl-loss --kl-loss-coef")

    def _check_ranges(self) -> None:
        """Numeric flags outside the values that mean something (they would otherwise fail
        deep in the trainer: a division by zero, an index error, torch's own message)."""
        at_least_one = ("tensor_model_parallel_size", "pipeline_model_parallel_size",
                        "expert_model_parallel_size",
                        "micro_batch_size", "global_batch_size", "num_steps_per_rollout",
                        "max_tokens_per_gpu", "lr_decay_iters", "save_interval", "num_layers",
                        "hidden_size", "ffn_hidden_size", "num_attention_heads",
                        "num_query_groups", "kv_channels", "vocab_size",
                        "max_position_embeddings", "seq_length")
        for name in at_least_one:
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ConfigError(f"{flag(name)} must be >= 1, got {value}")
        positive = ("lr", "critic_lr", "adam_eps", "value_clip", "rotary_base", "norm_epsilon",
                    "lora_alpha", "lora_lr")
        for name in positive:
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise ConfigError(f"{flag(name)} must be > 0, got {value}")
        non_negative = ("lora_rank", "min_lr", "lr_warmup_iters", "weight_decay", "clip_grad", "eps_clip_high",
                        "kl_loss_coef", "kl_coef", "tis_clip_low", "tis_clip")
        for name in non_negative:
            value = getattr(self, name)
            if value is not None and not value >= 0:
                raise ConfigError(f"{flag(name)} must be >= 0, got {value}")
        unit = {"eps_clip": "[0, 1)", "adam_beta1": "[0, 1)", "adam_beta2": "[0, 1)", "lora_dropout": "[0, 1)",
                "gamma": "[0, 1]", "lambd": "[0, 1]"}
        for name, interval in unit.items():
            value = getattr(self, name)
            inside = 0 <= value <= 1 if interval.endswith("]") else 0 <= value < 1
            if not inside:
                raise ConfigError(f"{flag(name)} must be in {interval}, got {value}")


class BatchShape(NamedTuple):
    """How a rollout's samples split into optimizer steps."""

    global_batch_size: int
    """Samples per optimizer step."""
    num_steps_per_rollout: int
    """Optimizer steps per rollout."""


def batch_shape(config: TrainerConfig, samples_per_rollout: int) -> BatchShape:
    """Solves ``samples_per_rollout = global_batch_size x num_steps_per_rollout``.

    Give any two of (``--global-batch-size``, ``--num-steps-per-rollout``); with neither, one
    step takes the whole rollout. ``config`` is only read (its batch flags are >= 1 once it has
    validated itself).

    Args:
        config: The trainer's flags.
        samples_per_rollout: ``--rollout-batch-size x --n-samples-per-prompt``.

    Returns:
        Both values, the given ones unchanged.

    Raises:
        ConfigError: The equation does not hold, or a step does not split into micro-batches;
            says which flag to change.
    """
    samples = samples_per_rollout
    gbs, steps = config.global_batch_size, config.num_steps_per_rollout
    if gbs is None and steps is None:
        gbs, steps = samples, 1
    elif gbs is None:
        assert steps is not None
        if samples % steps:
            raise ConfigError(
                f"--rollout-batch-size x --n-samples-per-prompt = {samples} samples do not split "
                f"into --num-steps-per-rollout {steps} equal steps: change one of them")
        gbs = samples // steps
    elif steps is None:
        if samples % gbs:
            raise ConfigError(
                f"--rollout-batch-size x --n-samples-per-prompt = {samples} samples is not a "
                f"multiple of --global-batch-size {gbs}: set --global-batch-size to a divisor of "
                f"{samples}")
        steps = samples // gbs
    elif gbs * steps != samples:
        raise ConfigError(
            f"--rollout-batch-size x --n-samples-per-prompt = {samples} but --global-batch-size x "
            f"--num-steps-per-rollout = {gbs} x {steps} = {gbs * steps}: drop "
            "--num-steps-per-rollout or fix --global-batch-size")
    if not config.use_dynamic_batch_size and gbs % config.micro_batch_size:
        raise ConfigError(f"--global-batch-size {gbs} is not a multiple of --micro-batch-size "
                          f"{config.micro_batch_size}")
    return BatchShape(gbs, steps)


def resolve_off_policy_correction(config: TrainerConfig, *, staleness_can_be_positive: bool
                                  ) -> TrainerConfig:
    """Solves ``--off-policy-correction auto`` (and ``--use-tis``) into tis, mis or none.

    ``--use-tis`` means tis. Otherwise auto means tis when the samples of a step can come from
    older weights than the trainer's (staleness > 0): their log-probs then differ from the
    trainer's by more than the engine's numerics, and an uncorrected loss follows the wrong
    policy's gradient. With fresh samples the ratio is 1 up to numerics, and auto means none.

    Args:
        config: The trainer's flags (only read).
        staleness_can_be_positive: Whether a rollout can be sampled by weights older than the
            trainer's (see ``agentrl.run.validation``).

    Returns:
        ``config`` when its correction is already explicit, else a new config whose
        ``off_policy_correction`` is ``tis``, ``mis`` or ``none``, never ``auto``.
    """
    if config.off_policy_correction != "auto":
        return config
    resolved = "tis" if config.use_tis or staleness_can_be_positive else "none"
    return dataclasses.replace(config, off_policy_correction=resolved)
