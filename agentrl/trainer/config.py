"""``TrainerConfig``: every training flag, typed, with its meaning (names as in the brief and the
reference system; the RL semantics are in ``reference/rl-semantics.md``)."""

from __future__ import annotations

import dataclasses

from agentrl.algorithms import AGGREGATIONS, ESTIMATORS, KL_KINDS
from agentrl.config import flag, option
from agentrl.errors import ConfigError

__all__ = ["TrainerConfig", "steps_per_rollout"]


@dataclasses.dataclass
class TrainerConfig:
    """Trainer settings; each field is the flag of the same name (``--global-batch-size``, ...)."""

    # model shape: define a model from scratch, or checked against --hf-checkpoint's config
    num_layers: int | None = option(None, "decoder layers")
    hidden_size: int | None = option(None, "residual width")
    ffn_hidden_size: int | None = option(None, "MLP width")
    num_attention_heads: int | None = option(None, "query heads")
    num_query_groups: int | None = option(None, "key/value heads (grouped-query attention)")
    seq_length: int | None = option(None, "longest sequence the model handles")
    # parallelism and memory
    tensor_model_parallel_size: int = option(1, "tensor-parallel ranks")
    pipeline_model_parallel_size: int = option(1, "pipeline stages")
    sequence_parallel: bool = option(False, "sequence parallelism (GPU + Transformer Engine)")
    recompute_activations: bool = option(False, "recompute activations in the backward pass")
    # batch
    global_batch_size: int | None = option(None, "samples per optimizer step (default: the whole "
                                           "rollout, one step per rollout)")
    num_steps_per_rollout: int | None = option(None, "optimizer steps per rollout")
    micro_batch_size: int = option(1, "samples per forward/backward (gradient accumulation)")
    use_dynamic_batch_size: bool = option(False, "pack micro-batches by --max-tokens-per-gpu")
    max_tokens_per_gpu: int | None = option(None, "padded tokens per micro-batch when dynamic")
    # optimizer
    lr: float = option(1e-6, "learning rate")
    min_lr: float = option(0.0, "floor of the decayed learning rate")
    lr_decay_style: str = option("constant", "constant | linear | cosine")
    lr_warmup_iters: int = option(0, "optimizer steps of linear warm-up")
    lr_decay_iters: int | None = option(None, "steps to decay over (default: all steps)")
    weight_decay: float = option(0.0, "AdamW weight decay")
    adam_beta1: float = option(0.9, "AdamW beta1")
    adam_beta2: float = option(0.98, "AdamW beta2")
    adam_eps: float = option(1e-8, "AdamW epsilon")
    clip_grad: float = option(1.0, "gradient-norm clip (0: off)")
    seed: int = option(1234, "trainer random seed")
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
    kl_loss_coef: float = option(0.0, "its coefficient")
    kl_loss_type: str = option("k1", "k1 | k2 | k3 | low_var_kl")
    kl_coef: float = option(0.0, "KL penalty in the reward (ppo, reinforce_plus_plus)")
    gamma: float = option(1.0, "discount (ppo, reinforce_plus_plus)")
    lambd: float = option(1.0, "GAE lambda (ppo)")
    value_clip: float = option(0.2, "PPO value clip")
    critic_lr: float | None = option(None, "PPO critic learning rate (default: --lr)")
    use_tis: bool = option(False, "truncated importance sampling against rollout log-probs")
    tis_clip_low: float = option(0.0, "TIS weight floor")
    tis_clip: float = option(2.0, "TIS weight cap")
    loss_aggregation: str = option("token_mean", "token_mean | seq_mean_token_mean | "
                                   "seq_mean_token_sum")
    # checkpoints
    save: str | None = option(None, "checkpoint folder (Megatron distributed checkpoint; default "
                              "<output-dir>/checkpoints)")
    load: str | None = option(None, "checkpoint folder to resume from")
    save_interval: int | None = option(None, "save every N rollouts (the last rollout is always "
                                       "saved)")
    save_hf: str | None = option(None, "folder for Hugging Face exports (with each checkpoint)")

    def validate(self) -> None:
        """Raises ConfigError naming the first invalid flag and what to change."""
        checks = {
            "advantage_estimator": ESTIMATORS, "kl_loss_type": KL_KINDS,
            "loss_aggregation": AGGREGATIONS, "lr_decay_style": ("constant", "linear", "cosine"),
            "loss_type": ("policy_loss", "sft_loss"),
        }  # fmt: skip
        for name, choices in checks.items():
            if getattr(self, name) not in choices:
                raise ConfigError(f"{flag(name)} must be one of {', '.join(choices)}; "
                                  f"got {getattr(self, name)!r}")
        for name in ("tensor_model_parallel_size", "pipeline_model_parallel_size",
                     "micro_batch_size"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{flag(name)} must be >= 1, got {getattr(self, name)}")
        if self.eps_clip_c is not None and self.eps_clip_c <= 1:
            raise ConfigError(f"--eps-clip-c must be > 1, got {self.eps_clip_c}")
        if self.use_dynamic_batch_size and not self.max_tokens_per_gpu:
            raise ConfigError("--use-dynamic-batch-size needs --max-tokens-per-gpu N")
        if self.use_kl_loss and self.kl_loss_coef <= 0:
            raise ConfigError("--use-kl-loss needs --kl-loss-coef > 0")
        if self.kl_coef and self.advantage_estimator in ("grpo", "gspo"):
            raise ConfigError("--kl-coef (KL in the reward) is for ppo / reinforce_plus_plus; "
                              "with grpo/gspo use --use-kl-loss --kl-loss-coef")
        if self.save_interval is not None and self.save_interval < 1:
            raise ConfigError(f"--save-interval must be >= 1, got {self.save_interval}")


def steps_per_rollout(config: TrainerConfig, rollout_batch_size: int, n_samples_per_prompt: int) -> int:
    """Checks ``rollout_batch_size x n_samples_per_prompt = global_batch_size x steps``.

    Give any two of (``--global-batch-size``, ``--num-steps-per-rollout``); with neither, one
    step takes the whole rollout. Fills in the missing one on ``config``.

    Raises:
        ConfigError: The equation does not hold; says which flag to change.
    """
    samples = rollout_batch_size * n_samples_per_prompt
    gbs, steps = config.global_batch_size, config.num_steps_per_rollout
    if gbs is None and steps is None:
        gbs, steps = samples, 1
    elif gbs is None:
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
    config.global_batch_size, config.num_steps_per_rollout = gbs, steps
    return steps
