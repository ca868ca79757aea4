"""``RolloutConfig``: every rollout flag, typed, with its meaning (see
``/reference/rl-semantics.md`` for the RL semantics these follow)."""

from __future__ import annotations

import dataclasses

from agentrl.config import flag, option
from agentrl.errors import ConfigError

__all__ = ["RolloutConfig"]


@dataclasses.dataclass
class RolloutConfig:
    """Rollout settings; each field is the flag of the same name (``--max-turns``, ...).

    Plug-ins (custom generate, reward functions, filters) receive this object, or the full
    argument namespace it was built from, as ``args``.
    """

    # what to play
    env: str | None = option(None, "environment id (`swe-tools`, `my_module:my-env`); without it "
                             "prompts are answered in one turn and scored by --custom-rm-path")
    max_turns: int | None = option(None, "assistant turns per episode before truncation "
                                   "(default: the env's own)")
    tool_call_format: str = option("hermes", "how the model writes tool calls "
                                   "(hermes, llama3, mistral, qwen3_coder, pythonic)")
    hf_checkpoint: str | None = option(None, "Hugging Face model directory of the policy "
                                       "(default: the built-in tiny model)")
    # data
    prompt_data: str | None = option(None, "JSONL or Parquet prompts (default with --env: the "
                                     "env's own train tasks)")
    input_key: str = option("prompt", "row key of the prompt (text or chat messages)")
    label_key: str = option("label", "row key of the ground truth")
    metadata_key: str = option("metadata", "row key of a dict merged into sample.metadata")
    rollout_shuffle: bool = option(False, "shuffle prompts each epoch (seeded)")
    rollout_seed: int = option(42, "seed of shuffling and sampling")
    streaming_data: bool = option(False, "read --prompt-data lazily (large files)")
    num_data_workers: int = option(1, "threads parsing rows ahead when streaming")
    data_source_path: str | None = option(None, "a RolloutDataSource subclass to use instead")
    buffer_filter_path: str | None = option(None, "buffer_filter(args, buffer, num_samples)")
    # batch shape
    rollout_batch_size: int = option(4, "prompts (groups) per rollout")
    n_samples_per_prompt: int = option(4, "samples per prompt (one group; GRPO needs >= 2)")
    over_sampling_batch_size: int | None = option(None, "groups submitted at a time when "
                                                  "dynamic sampling filters groups out")
    dynamic_sampling_filter_path: str | None = option(
        None, "filter(args, group) -> bool keeping a group; built-in: "
        "agentrl.rollout.filters:reward_std_positive")
    dynamic_sampling_max_groups: int | None = option(
        None, "stop sampling after this many groups even if too few passed (default 8x "
        "--rollout-batch-size); the batch is then topped up with filtered-out groups")
    partial_rollout: bool = option(False, "groups unfinished when the batch is full go back to "
                                   "the buffer and resume next rollout")
    rollout_concurrency: int = option(64, "episodes played at once")
    # sampling
    rollout_max_context_len: int | None = option(None, "prompt + response tokens per sample "
                                                 "(default: the engine's context length)")
    rollout_max_response_len: int = option(256, "new tokens per assistant turn at most")
    rollout_temperature: float = option(1.0, "sampling temperature (0: greedy)")
    rollout_top_p: float = option(1.0, "nucleus sampling mass")
    rollout_top_k: int = option(-1, "top-k sampling (-1: all)")
    rollout_stop: list[str] = option([], "stop strings", nargs="*")
    rollout_stop_token_ids: list[int] = option([], "stop token ids", nargs="*", type=int)
    # plug-ins
    custom_generate_function_path: str | None = option(
        None, "async custom_generate(args, samples, evaluation=False) (file.py or module:name)")
    custom_rm_path: str | None = option(None, "reward function or CustomRewardModel class "
                                        "(file.py, file.py:name or module:name)")
    rm_model_path: str | None = option(None, "model_path given to a CustomRewardModel class")
    # evaluation
    eval_prompt_data: list[list[str]] = option(
        [], "a named eval set: NAME PATH (repeatable)", nargs=2, action="append",
        metavar=("NAME", "PATH"))
    eval_env: list[str] = option([], "an env whose test split is an eval set (repeatable)",
                                 action="append")
    n_samples_per_eval_prompt: int = option(1, "samples per eval prompt (pass@k up to this k)")
    eval_temperature: float | None = option(None, "eval sampling temperature "
                                            "(default: --rollout-temperature)")
    eval_max_prompts: int | None = option(None, "first N prompts of each eval set")

    def validate(self) -> None:
        """Raises ConfigError naming the first invalid flag and what to change."""
        positive = ["rollout_batch_size", "n_samples_per_prompt", "num_data_workers",
                    "rollout_concurrency", "rollout_max_response_len", "n_samples_per_eval_prompt"]
        for name in positive:
            if getattr(self, name) < 1:
                raise ConfigError(f"{flag(name)} must be >= 1, got {getattr(self, name)}")
        for name in ("max_turns", "over_sampling_batch_size", "rollout_max_context_len",
                     "dynamic_sampling_max_groups", "eval_max_prompts"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ConfigError(f"{flag(name)} must be >= 1, got {value}")
        if self.rollout_temperature < 0:
            raise ConfigError(f"--rollout-temperature must be >= 0, got {self.rollout_temperature}")
        if not 0 < self.rollout_top_p <= 1:
            raise ConfigError(f"--rollout-top-p must be in (0, 1], got {self.rollout_top_p}")
        if self.rollout_top_k == 0 or self.rollout_top_k < -1:
            raise ConfigError(f"--rollout-top-k must be -1 or >= 1, got {self.rollout_top_k}")
        if (self.over_sampling_batch_size is not None
                and self.over_sampling_batch_size < self.rollout_batch_size
                and self.dynamic_sampling_filter_path is None):
            raise ConfigError("--over-sampling-batch-size is smaller than --rollout-batch-size "
                              "without a --dynamic-sampling-filter-path: drop it or raise it")
        if self.env is None and self.prompt_data is None and self.data_source_path is None:
            raise ConfigError("nothing to roll out: pass --env ID (its tasks) and/or "
                              "--prompt-data FILE")
        if (self.env is None and self.custom_rm_path is None
                and self.custom_generate_function_path is None):
            raise ConfigError("no reward: without --env, pass --custom-rm-path (or a "
                              "--custom-generate-function-path that sets sample.reward)")
        names = [name for name, _ in self.eval_prompt_data]
        duplicate = {n for n in names if names.count(n) > 1}
        if duplicate:
            raise ConfigError(f"--eval-prompt-data names must be unique; repeated: {sorted(duplicate)}")

    @property
    def max_groups(self) -> int:
        """Groups sampled at most per rollout under dynamic sampling."""
        return self.dynamic_sampling_max_groups or 8 * self.rollout_batch_size
