"""``RolloutConfig``: every rollout flag, typed, with its meaning (``docs/rl-semantics.md``
says what the RL flags do).

Imported on first use: the vLLM client's log-prob mode, only for ``--rollout-backend vllm`` (the
config stays light for every command's start-up checks).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from agentrl.chat.templates import load_chat_template
from agentrl.config import flag, option, parse_pairs
from agentrl.engine.vllm import logprobs_mode_for
from agentrl.errors import ConfigError

__all__ = ["RolloutConfig"]


EMBEDDED_SGLANG_ARGS = frozenset({"context-length", "disable-radix-cache"})
"""``--sglang-*`` settings the embedded engine honours."""
COMPAT_SGLANG_ARGS = frozenset({"context-length", "max-running-requests", "random-seed"})
"""``--sglang-*`` settings agentrl's SGLang-compatible server takes."""
BACKENDS = ("embedded", "sglang", "sglang-compat", "vllm")
OVERLONG_PROMPTS = ("skip", "cut")
"""The choices of ``--overlong-prompts`` (see :mod:`agentrl.rollout.overlong`)."""


SERVER_FLAG_PREFIXES = ("sglang", "vllm")
"""``--sglang-X`` / ``--vllm-X``: settings passed on to the servers of that backend."""


def collect_server_args(tokens: list[str], prefix: str) -> tuple[dict[str, str | None], list[str]]:
    """Splits ``--<prefix>-X VALUE`` / ``--<prefix>-X=VALUE`` / bare ``--<prefix>-X`` out of
    command-line tokens that argparse did not recognise; returns them (``{"X": VALUE}``, ``None``
    for a bare switch) and the other tokens."""
    lead = f"--{prefix}-"
    found: dict[str, str | None] = {}
    rest: list[str] = []
    i = 0
    while i < len(tokens):
        token = tokens[i]
        if token.startswith(lead) and len(token) > len(lead):
            name, sep, inline = token[len(lead):].partition("=")
            value: str | None = inline
            if not sep:
                following = tokens[i + 1] if i + 1 < len(tokens) else None
                if following is not None and not following.startswith("--"):
                    value, i = following, i + 1
                else:
                    value = None  # a switch such as --sglang-enable-torch-compile
            found[name] = value
        else:
            rest.append(token)
        i += 1
    return found, rest


@dataclasses.dataclass
class RolloutConfig:
    """Rollout settings; each field is the flag of the same name (``--max-turns``, ...).

    Plug-ins (custom generate, reward functions, filters) receive this object, or the full
    argument namespace it was built from, as ``args``.
    """

    # what to play
    env: str | None = option(None, "environment id (`swe-tools`, `my_module:my-env`); without it "
                             "prompts are answered in one turn and scored by --custom-rm-path")
    env_kwarg: list[str] = option([], "an env constructor argument, KEY=VALUE with VALUE read "
                                  "as JSON when it parses (`--env-kwarg compact=true`); "
                                  "repeatable", action="append", metavar="KEY=VALUE")
    max_turns: int | None = option(None, "assistant turns per episode before truncation "
                                   "(default: the env's own)")
    tool_call_format: str = option("hermes", "how the model writes tool calls "
                                   "(hermes, llama3, mistral, qwen3_coder, pythonic)")
    hf_checkpoint: str | None = option(None, "the policy: a Hugging Face model directory, a "
                                       "named model (`smollm2-135m-instruct`, fetched and "
                                       "converted on first use; `agentrl models list`) or a "
                                       "Llama/Qwen2 FILE.gguf (imported once) (default: the "
                                       "embedded default: swe-tools' shipped warm start for "
                                       "--env swe-tools, else the random built-in tiny model; "
                                       "see docs/getting-started.md)")
    chat_template: str | None = option(None, "the chat template to render conversations with "
                                       "instead of the model's own: a built-in name "
                                       "(chatml-hermes) or a Jinja FILE (see "
                                       "docs/guides/real-model.md)", metavar="FILE|NAME")
    # data
    prompt_data: str | None = option(None, "JSONL or Parquet prompts (default with --env: the "
                                     "env's own train tasks)")
    input_key: str = option("prompt", "row key of the prompt (text or chat messages)")
    label_key: str = option("label", "row key of the ground truth")
    metadata_key: str = option("metadata", "row key of a dict merged into sample.metadata")
    tool_key: str | None = option(None, "row key of a list of OpenAI-style tool schemas shown "
                                  "to the model with that row's prompt")
    rollout_shuffle: bool = option(False, "shuffle prompts each epoch (seeded)")
    rollout_seed: int = option(42, "seed of shuffling and sampling")
    rollout_max_prompts: int | None = option(None, "train on the first N prompts only (of "
                                             "--prompt-data, or the env's train tasks in their "
                                             "fixed order; an env without tasks: its first N "
                                             "seeds), played again each epoch: a fixed set to "
                                             "watch a model learn")
    streaming_data: bool = option(False, "read --prompt-data lazily (large files)")
    shuffle_buffer_size: int = option(10000, "rows held by the approximate shuffle of "
                                      "--streaming-data with --rollout-shuffle")
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
    overlong_prompts: str = option("skip", "a prompt that leaves no room in "
                                   "--rollout-max-context-len for a response: skip (its group is "
                                   "not trained on; the row is reported with file and line) or "
                                   "cut (the tail of its longest user message, leaving room for "
                                   "one --rollout-max-response-len turn)",
                                   choices=OVERLONG_PROMPTS)
    rollout_backend: str = option("embedded", "what serves the policy: embedded (agentrl's torch "
                                  "engine), sglang (SGLang servers: python -m sglang.launch_server, "
                                  "GPU), sglang-compat (agentrl's SGLang-compatible server over the "
                                  "embedded engine: the SGLang path on CPU), vllm (vLLM servers: "
                                  "python -m vllm.entrypoints.openai.api_server, GPU or CPU)",
                                  choices=BACKENDS)
    rollout_engine_urls: list[str] = option([], "already running SGLang or vLLM servers to use "
                                            "instead of launching them (--rollout-backend sglang* "
                                            "or vllm)", nargs="*")
    rollout_router_url: str | None = option(None, "an already running sglang-router in front of "
                                            "--rollout-engine-urls")
    router_policy: str = option("cache_aware", "the sglang-router started for several SGLang "
                                "engines: cache_aware, round_robin, random, power_of_two; none: no "
                                "router (the client keeps each episode on one engine)",
                                choices=("cache_aware", "round_robin", "random", "power_of_two", "none"))
    sglang_args: dict[str, str | None] = dataclasses.field(default_factory=dict, metadata={"cli": False})
    """``--sglang-X [VALUE]`` flags, ``{"X": VALUE}``: SGLang server arguments (``--X VALUE``),
    collected by :func:`collect_server_args`. The embedded engine honours ``context-length`` and
    ``disable-radix-cache`` (no reuse of earlier turns' keys and values)."""
    vllm_args: dict[str, str | None] = dataclasses.field(default_factory=dict, metadata={"cli": False})
    """``--vllm-X [VALUE]`` flags, ``{"X": VALUE}``: vLLM server arguments (``--X VALUE``) for
    ``--rollout-backend vllm``, over agentrl's defaults
    (:func:`~agentrl.placement.servers.vllm_defaults`)."""
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
    # black-box agents (agentrl.rollout.agents), through the OpenAI-compatible gateway
    agent_function_path: str | None = option(
        None, "async run(task, endpoint) -> reward | dict | None playing each episode through "
        "the gateway (file.py:run or module:name)")
    agent_command: str | None = option(None, "a program playing each episode through the "
                                       "gateway (OPENAI_BASE_URL, OPENAI_API_KEY, OPENAI_MODEL "
                                       "set; the task as JSON on stdin)")
    agent_on_host: bool = option(False, "run --agent-command on the host, as your user, in the "
                                 "current directory: it can read every file you can (the run's "
                                 "data, checkpoints, keys) and reach any network; by default it "
                                 "runs in a bubblewrap sandbox with its own workspace")
    agent_timeout: float = option(600.0, "seconds a black-box agent may take per episode")
    gateway_segments: str = option("last", "what a black-box agent's episode trains on when it "
                                   "rewrote its history: last (the segment that ended it) or all "
                                   "(every segment, each a sample of the group with the "
                                   "episode's reward)", choices=("last", "all"))
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
        positive = ["rollout_batch_size", "n_samples_per_prompt", "num_data_workers", "shuffle_buffer_size",
                    "rollout_concurrency", "rollout_max_response_len", "n_samples_per_eval_prompt"]
        for name in positive:
            if getattr(self, name) < 1:
                raise ConfigError(f"{flag(name)} must be >= 1, got {getattr(self, name)}")
        for name in ("max_turns", "over_sampling_batch_size", "rollout_max_context_len",
                     "dynamic_sampling_max_groups", "eval_max_prompts", "rollout_max_prompts"):
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
        if self.rollout_max_prompts is not None and self.streaming_data:
            raise ConfigError("--rollout-max-prompts keeps its first N prompts in memory, "
                              "--streaming-data reads the file lazily: drop one of them")
        if self.chat_template is not None:
            load_chat_template(self.chat_template)  # a bad name or file: the flag is named
        if self.env is None and self.prompt_data is None and self.data_source_path is None:
            raise ConfigError("nothing to roll out: pass --env ID (its tasks) and/or "
                              "--prompt-data FILE")
        plays = [name for name in ("custom_generate_function_path", "agent_function_path",
                                   "agent_command") if getattr(self, name)]
        if len(plays) > 1:
            raise ConfigError(f"{flag(plays[0])} and {flag(plays[1])} both say who plays the "
                              "episodes: keep one")
        if self.agent_on_host and not self.agent_command:
            raise ConfigError("--agent-on-host says where --agent-command runs, and no "
                              "--agent-command is given: drop it or add the command")
        if self.agent_timeout <= 0:
            raise ConfigError(f"--agent-timeout must be > 0, got {self.agent_timeout}")
        if self.gateway_segments not in ("last", "all"):
            raise ConfigError(f"--gateway-segments must be last or all, got {self.gateway_segments!r}")
        self._check_server_args()
        allowed = {"embedded": EMBEDDED_SGLANG_ARGS, "sglang-compat": COMPAT_SGLANG_ARGS}.get(self.rollout_backend)
        unsupported = sorted(set(self.sglang_args) - allowed) if allowed is not None else []
        if unsupported:
            raise ConfigError(
                f"--sglang-{unsupported[0]}: an SGLang server setting that --rollout-backend "
                f"{self.rollout_backend} has no counterpart for; drop it (--rollout-backend sglang "
                f"takes every --sglang-* flag; this one only --sglang-{', --sglang-'.join(sorted(allowed))})")
        if self.overlong_prompts not in OVERLONG_PROMPTS:
            raise ConfigError(f"--overlong-prompts must be one of {', '.join(OVERLONG_PROMPTS)}, "
                              f"got {self.overlong_prompts!r}")
        if (self.overlong_prompts == "cut" and self.rollout_max_context_len is not None
                and self.rollout_max_response_len >= self.rollout_max_context_len):
            raise ConfigError(
                f"--overlong-prompts cut leaves room for one --rollout-max-response-len "
                f"({self.rollout_max_response_len}) turn, which --rollout-max-context-len "
                f"({self.rollout_max_context_len}) cannot hold: lower the first or raise the second")
        if self.rollout_backend not in BACKENDS:
            raise ConfigError(f"--rollout-backend must be one of {', '.join(BACKENDS)}, got "
                              f"{self.rollout_backend!r}")
        if (self.rollout_engine_urls or self.rollout_router_url) and self.rollout_backend == "embedded":
            raise ConfigError("--rollout-engine-urls / --rollout-router-url name inference servers: "
                              "add --rollout-backend sglang (or sglang-compat, or vllm)")
        if self.rollout_router_url and self.rollout_backend == "vllm":
            raise ConfigError("--rollout-router-url is an sglang-router; vLLM servers are routed by "
                              "agentrl (each episode on one server): drop it")
        if self.rollout_router_url and not self.rollout_engine_urls:
            raise ConfigError("--rollout-router-url needs --rollout-engine-urls too (aborts and "
                              "weight updates go to every server directly)")
        if "context-length" in self.sglang_args:
            value = self.sglang_args["context-length"]
            if value is None or not value.isdigit() or int(value) < 1:
                raise ConfigError(f"--sglang-context-length must be a positive integer, got {value!r}")
        parse_pairs(self.env_kwarg, "--env-kwarg")
        names = [name for name, _ in self.eval_prompt_data]
        duplicate = {n for n in names if names.count(n) > 1}
        if duplicate:
            raise ConfigError(f"--eval-prompt-data names must be unique; repeated: {sorted(duplicate)}")

    def _check_server_args(self) -> None:
        if self.vllm_args and self.rollout_backend != "vllm":
            name = next(iter(self.vllm_args))
            raise ConfigError(f"--vllm-{name} is passed on to vLLM servers: add --rollout-backend "
                              "vllm, or drop it")
        if self.sglang_args and self.rollout_backend == "vllm":
            name = next(iter(self.sglang_args))
            raise ConfigError(f"--sglang-{name} is an SGLang server setting; --rollout-backend vllm "
                              "takes --vllm-* flags (vLLM's own names: --vllm-max-model-len, "
                              "--vllm-max-num-seqs, ...)")
        if "max-model-len" in self.vllm_args:
            value = self.vllm_args["max-model-len"]
            if value is None or not value.isdigit() or int(value) < 1:
                raise ConfigError(f"--vllm-max-model-len must be a positive integer, got {value!r}")
        if self.rollout_backend == "vllm" and "logprobs-mode" not in self.vllm_args:
            if logprobs_mode_for(self.rollout_temperature, self.rollout_top_p, self.rollout_top_k) is None:
                raise ConfigError(
                    f"--rollout-temperature {self.rollout_temperature} with --rollout-top-p / "
                    "--rollout-top-k truncation: vLLM reports log-probabilities either before the "
                    "temperature or after the truncation, never the untruncated tempered ones the "
                    "trainer compares with. Drop the truncation, use temperature 1, or pass "
                    "--vllm-logprobs-mode yourself")

    @property
    def has_agent(self) -> bool:
        """A black-box agent plays the episodes (``--agent-function-path`` / ``--agent-command``)."""
        return bool(self.agent_function_path or self.agent_command)

    @property
    def engine_context_len(self) -> int | None:
        """The engine's context length from ``--sglang-context-length`` (``--vllm-max-model-len``
        with vLLM; None: the model's)."""
        value = (self.vllm_args.get("max-model-len") if self.rollout_backend == "vllm"
                 else self.sglang_args.get("context-length"))
        return int(value) if value is not None else None

    @property
    def engine_prefix_cache(self) -> bool:
        """Whether the embedded engine reuses earlier turns' keys and values (SGLang's radix
        cache; off with ``--sglang-disable-radix-cache``)."""
        return "disable-radix-cache" not in self.sglang_args

    @property
    def env_kwargs(self) -> dict[str, Any]:
        """``--env-kwarg`` pairs as the env's constructor keyword arguments."""
        return parse_pairs(self.env_kwarg, "--env-kwarg")
