"""The flag checks that read more than one config, and those of the files the flags name.

Each config checks its own flags (``validate()``); what only makes sense together is checked
here, in one place: :func:`validate_together`. :func:`check_files` then reads what ``--load``
and ``--hf-checkpoint`` point at, so a damaged file is refused before anything heavy starts.
Both raise :class:`~agentrl.errors.ConfigError` naming the flags and the fix;
:func:`~agentrl.run.flags.parse_args` calls them once.
"""

from __future__ import annotations

import dataclasses
import inspect
from pathlib import Path
from typing import TYPE_CHECKING

from agentrl.config import flag
from agentrl.env.registry import env_spec
from agentrl.env.sandboxed import SandboxedToolEnv
from agentrl.errors import ConfigError, PluginError
from agentrl.models.hf_config import check_safetensors_headers, read_config
from agentrl.models.tiny import TINY_MODEL_CONFIG
from agentrl.plugins import load_plugin
from agentrl.rollout.agents import FunctionAgent
from agentrl.rollout.custom import load_custom_generate
from agentrl.run.checkpoints import check_resumable, latest_checkpoint
from agentrl.run.run_folder import RUN_FILES
from agentrl.trainer.config import batch_shape, resolve_off_policy_correction
from agentrl.trainer.hf_spec import SUPPORTED_MODEL_TYPES, read_hf_config
from agentrl.trainer.model_flags import check_model_flags

if TYPE_CHECKING:
    from agentrl.rollout.config import RolloutConfig
    from agentrl.run.config import Args

__all__ = ["GROUP_RELATIVE_ESTIMATORS", "check_files", "check_plugins", "validate_together"]

GROUP_RELATIVE_ESTIMATORS = ("grpo", "gspo", "reinforce_plus_plus_baseline")
"""Estimators whose advantage is the reward minus its group's mean: a group of one sample
always gets advantage 0."""



def validate_together(args: Args) -> Args:
    """Checks the flags that only make sense together, and solves what they determine.

    Returns:
        ``args`` with the trainer's ``--global-batch-size`` and ``--num-steps-per-rollout``
        solved from ``--rollout-batch-size x --n-samples-per-prompt``, and its
        ``--off-policy-correction auto`` solved from how stale a rollout can be: a new ``Args``
        holding a new ``TrainerConfig`` (configs are frozen; nothing is written).

    Raises:
        ConfigError: Naming the flags and what to change.
    """
    _check_placement(args)
    _check_weight_sync(args)
    _check_algorithm(args)
    _check_output_dir(args)
    _check_eval(args)
    _check_async(args)
    rollout = args.rollout
    trainer = resolve_off_policy_correction(
        args.trainer, staleness_can_be_positive=_staleness_can_be_positive(args))
    if rollout.has_agent and rollout.gateway_segments == "all":
        # every segment of an episode is a sample: a rollout's sample count varies, so each of
        # the --num-steps-per-rollout steps takes an equal share of whatever it produced
        if trainer.global_batch_size is not None:
            raise ConfigError("--global-batch-size: with --gateway-segments all a rollout has as "
                              "many samples as its episodes have segments; drop it (each of "
                              "--num-steps-per-rollout steps takes an equal share)")
        steps = trainer.num_steps_per_rollout or 1
        return dataclasses.replace(args, trainer=dataclasses.replace(trainer, num_steps_per_rollout=steps))
    shape = batch_shape(trainer, rollout.rollout_batch_size * rollout.n_samples_per_prompt)
    return dataclasses.replace(args, trainer=dataclasses.replace(trainer, **shape._asdict()))


def _staleness_can_be_positive(args: Args) -> bool:
    """Whether a rollout can be sampled by weights older than the trainer's: the engines get
    new weights only every ``--update-weights-interval`` rollouts, or (asynchronous training)
    run ahead of the trainer."""
    run = args.run
    return run.update_weights_interval > 1 or (run.async_training and run.max_staleness > 0)


def _check_async(args: Args) -> None:
    if not args.run.async_training:
        return
    cluster = args.cluster
    if cluster.colocate:
        raise ConfigError("--async-training overlaps rollouts and training, but --colocate puts "
                          "the engines and the trainer on the same devices (the engines free "
                          "their memory while the trainer runs): drop --colocate and give the "
                          "engines their own --rollout-num-gpus N")
    if args.trainer.loss_type == "sft_loss":
        raise ConfigError("--async-training overlaps sampling and training; --loss-type sft_loss "
                          "trains on demonstrations, which are not sampled: drop one of them")
    if _has_cuda() and not cluster.engine_actors and not args.rollout.rollout_engine_urls:
        raise ConfigError("--async-training: without --rollout-num-gpus the embedded engine "
                          "runs in this process, on the trainer's first GPU; give the engines "
                          "their own devices with --rollout-num-gpus N")


def check_files(args: Args) -> None:
    """Reads what the flags point at, so that a mistake is reported before Ray, Megatron or an
    engine starts: ``--hf-checkpoint``'s config (against the model flags such as
    ``--num-layers``) and its weight files' headers, ``--load``'s checkpoint (silently: the run
    reports skipped ones when it loads), and every plug-in (imported, its form checked).

    Raises:
        ConfigError: A missing or unreadable model config or weight file, a model flag the
            checkpoint contradicts, or no complete checkpoint; names the flag and the file.
        PluginError: A plug-in that cannot be imported or has the wrong form; names the flag.
    """
    rollout = args.rollout
    checkpoint = rollout.hf_checkpoint
    if checkpoint is not None:
        try:
            raw = read_config(checkpoint, ConfigError)
        except ConfigError as exc:
            raise ConfigError(f"--hf-checkpoint {checkpoint}: {exc}") from exc
        model_type = raw.get("model_type")
        if model_type not in SUPPORTED_MODEL_TYPES:  # every run trains it: no backend helps
            raise ConfigError(
                f"--hf-checkpoint {checkpoint} is a {model_type!r} model; train.py trains "
                f"{', '.join(SUPPORTED_MODEL_TYPES)} models (the Megatron trainer and the embedded "
                "engine both run those): pick a model of those families (agentrl models list "
                "names one that works here)")
        try:
            check_safetensors_headers(checkpoint, ConfigError)
        except ConfigError as exc:
            raise ConfigError(f"--hf-checkpoint {checkpoint}: {exc}") from exc
        check_model_flags(read_hf_config(checkpoint), args.trainer)  # the trainer's own check, early
    else:  # the built-in tiny model: its config is known without building it
        check_model_flags({"model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"],
                           **TINY_MODEL_CONFIG}, args.trainer)
    if args.trainer.load:
        check_resumable(latest_checkpoint(args.trainer.load, report=None),
                        async_training=args.run.async_training)
    check_plugins(rollout)


def check_plugins(rollout: RolloutConfig) -> None:
    """Imports the plug-ins the rollout flags name and checks their form (the run loads them
    again from the import cache when it needs them).

    Raises:
        PluginError: Naming the flag, the file or module, and what is wrong.
    """
    if rollout.custom_generate_function_path:
        load_custom_generate(rollout.custom_generate_function_path)
    if rollout.agent_function_path:
        FunctionAgent(rollout.agent_function_path)
    for name, preferred in (("dynamic_sampling_filter_path", ()), ("buffer_filter_path", ()),
                            ("custom_rm_path", ("CustomRewardModel",))):
        spec = getattr(rollout, name)
        if spec and not callable(load_plugin(spec, flag=flag(name), preferred=preferred)):
            raise PluginError(f"{flag(name)} {spec!r} is not callable")


def _check_eval(args: Args) -> None:
    rollout, run = args.rollout, args.run
    has_sets = bool(rollout.eval_prompt_data or rollout.eval_env)
    if run.eval_interval is not None and not has_sets:
        raise ConfigError(f"--eval-interval {run.eval_interval} evaluates nothing: add an eval set "
                          "(--eval-env ID or --eval-prompt-data NAME PATH), or drop it")
    if has_sets and run.eval_interval is None:
        raise ConfigError("--eval-env / --eval-prompt-data need --eval-interval N (evaluate every N "
                          "rollouts, and after the last)")


def _check_placement(args: Args) -> None:
    _check_sandbox_placement(args)
    rollout, trainer, cluster = args.rollout, args.trainer, args.cluster
    tensor_parallel = trainer.tensor_model_parallel_size
    if cluster.world_size % tensor_parallel:
        raise ConfigError(
            f"--actor-num-nodes x --actor-num-gpus-per-node = {cluster.world_size} ranks are not "
            f"a multiple of --tensor-model-parallel-size {tensor_parallel}")
    experts = trainer.expert_model_parallel_size
    if (cluster.world_size // tensor_parallel) % experts:
        raise ConfigError(
            f"--expert-model-parallel-size {experts} must divide the trainer's data-parallel ranks "
            f"(--actor-num-nodes x --actor-num-gpus-per-node = {cluster.world_size}, over "
            f"--tensor-model-parallel-size {tensor_parallel}: {cluster.world_size // tensor_parallel}); "
            "each of those ranks holds 1/N of the experts and trains its own samples")
    backend = rollout.rollout_backend
    if trainer.routing_replay and backend != "embedded":
        raise ConfigError(
            f"--routing-replay with --rollout-backend {backend}: it replays the experts the engine "
            "reports for each token, and only the embedded engine reports them (agentrl's SGLang "
            "and vLLM clients do not read a server's routes; vLLM on CPU cannot return them: its "
            "routed-experts output needs the V2 model runner, which needs Triton's CPU "
            "backend); use --rollout-backend embedded, or drop --routing-replay")
    if backend == "embedded":
        if cluster.rollout_num_gpus_per_engine != 1:
            raise ConfigError(
                f"--rollout-num-gpus-per-engine {cluster.rollout_num_gpus_per_engine}: the "
                "embedded engine serves one device per engine; tensor-parallel engines need "
                "--rollout-backend sglang or vllm")
        return
    if not (cluster.engine_actors or rollout.rollout_engine_urls):
        raise ConfigError(f"--rollout-backend {backend} launches servers as Ray actors: add "
                          "--rollout-num-gpus N (or --colocate), or name running servers with "
                          "--rollout-engine-urls")
    if not cluster.use_ray and not rollout.rollout_engine_urls:
        raise ConfigError(f"--rollout-backend {backend} places servers with Ray: drop "
                          "--no-use-ray")
    if cluster.use_fault_tolerance and rollout.rollout_engine_urls:
        raise ConfigError("--use-fault-tolerance restarts servers this run started; "
                          "--rollout-engine-urls servers are someone else's: drop one of them")
    if backend == "sglang-compat" and cluster.rollout_num_gpus_per_engine != 1:
        raise ConfigError("--rollout-backend sglang-compat serves one device per engine: "
                          "--rollout-num-gpus-per-engine must be 1")
    if backend == "vllm" and cluster.colocate and not _has_cuda():
        raise ConfigError("--colocate with --rollout-backend vllm releases the servers' memory "
                          "while the trainer runs (vLLM's sleep mode), which frees nothing on a "
                          "machine without GPUs: drop --colocate and give the servers their own "
                          "--rollout-num-gpus")
    if backend == "vllm" and cluster.colocate and "enable-sleep-mode" not in rollout.vllm_args:
        raise ConfigError("--colocate with --rollout-backend vllm needs --vllm-enable-sleep-mode "
                          "(the servers release their memory while the trainer runs)")
    if backend == "vllm" and cluster.rollout_num_gpus_per_engine != 1 and not _has_cuda():
        raise ConfigError("--rollout-num-gpus-per-engine above 1 makes tensor-parallel vLLM "
                          "servers, which need GPUs")


def _check_sandbox_placement(args: Args) -> None:
    """``--sandbox-placement ray`` needs Ray, a cluster to find sandbox nodes in, and envs whose
    sandboxes work from another machine."""
    cluster, rollout = args.cluster, args.rollout
    if cluster.sandbox_placement != "ray":
        return
    if not cluster.use_ray:
        raise ConfigError("--sandbox-placement ray runs the sandboxes on Ray nodes: drop "
                          "--no-use-ray (or use --sandbox-placement local)")
    if not cluster.ray_address:
        raise ConfigError("--sandbox-placement ray runs the sandboxes on the nodes of a Ray cluster "
                          "that offer a `sandbox` resource, and the Ray this run would start "
                          "offers none: start the cluster with `ray start`, the sandbox nodes with "
                          "`ray start --address HEAD --resources '{\"sandbox\": 16}'`, and pass "
                          "--ray-address HEAD")
    for env_id in dict.fromkeys([*([rollout.env] if rollout.env else []), *rollout.eval_env]):
        env_class = env_spec(env_id).load()
        if not (inspect.isclass(env_class) and issubclass(env_class, SandboxedToolEnv)):
            continue
        in_sandbox = [server.label for server in env_class.mcp_servers if server.sandbox]
        if in_sandbox:
            raise ConfigError(
                f"--sandbox-placement ray: env {env_id} runs MCP servers inside its sandboxes "
                f"({', '.join(in_sandbox)}), which talk to this process over pipes that do not "
                "reach another node: use --sandbox-placement local")
        if env_class.local_sandboxes_only:
            raise ConfigError(f"--sandbox-placement ray: env {env_id} needs its sandboxes on this "
                              f"machine ({env_class.local_sandboxes_only}): use "
                              "--sandbox-placement local")


def _has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def _check_weight_sync(args: Args) -> None:
    backend, sync = args.rollout.rollout_backend, args.run.weight_sync
    if args.cluster.use_fault_tolerance and backend != "embedded" and sync not in ("auto", "disk"):
        raise ConfigError(f"--use-fault-tolerance with --rollout-backend {backend} restarts a "
                          "server from the latest weights on disk: use --weight-sync disk (or "
                          f"auto), not {sync}")
    if sync == "broadcast" and backend in ("embedded", "vllm"):
        raise ConfigError("--weight-sync broadcast is for SGLang servers: use it with "
                          "--rollout-backend sglang (or sglang-compat); vLLM servers load each "
                          "version from disk (--weight-sync disk, the default)")
    if sync == "adapter" and (backend != "vllm" or not args.trainer.lora_rank):
        raise ConfigError("--weight-sync adapter sends only LoRA adapters to vLLM servers: it needs "
                          "--rollout-backend vllm and --lora-rank R (other engines take the merged "
                          "weights: drop --weight-sync)")
    if sync == "adapter" and args.trainer.lora_rank > 512:
        raise ConfigError(f"--weight-sync adapter: --lora-rank {args.trainer.lora_rank} is above the "
                          "largest rank vLLM serves (512)")
    if sync == "adapter" and args.rollout.rollout_engine_urls:
        raise ConfigError("--weight-sync adapter starts the vLLM servers with --enable-lora: it does "
                          "not work with --rollout-engine-urls (servers started elsewhere)")
    if sync == "tensor" and backend == "vllm":
        raise ConfigError("--weight-sync tensor: vLLM servers take tensors only through vLLM's "
                          "NCCL or CUDA-IPC transfer, which agentrl does not drive; use "
                          "--weight-sync disk (the default for vLLM)")


def _check_algorithm(args: Args) -> None:
    trainer, n, rollout = args.trainer, args.rollout.n_samples_per_prompt, args.rollout
    if (trainer.loss_type != "sft_loss" and rollout.env is None and rollout.custom_rm_path is None
            and rollout.custom_generate_function_path is None and not rollout.has_agent):
        # a supervised warm start on conversations needs none: it learns the demonstrations
        raise ConfigError("no reward: without --env, pass --custom-rm-path (or a "
                          "--custom-generate-function-path that sets sample.reward)")
    if (trainer.loss_type == "policy_loss" and n < 2
            and trainer.advantage_estimator in GROUP_RELATIVE_ESTIMATORS):
        raise ConfigError(
            f"--advantage-estimator {trainer.advantage_estimator} compares each sample's reward "
            f"with its group's mean, and --n-samples-per-prompt {n} makes groups of one: every "
            "advantage is 0 and nothing is learned. Raise --n-samples-per-prompt to 2 or more, "
            "or use --advantage-estimator reinforce_plus_plus or ppo")


def _check_output_dir(args: Args) -> None:
    if args.trainer.load:  # a continuation: its lines go after the earlier ones
        return
    output_dir = Path(args.run.output_dir)
    written = [name for name in RUN_FILES if (output_dir / name).is_file()]
    if written:
        own = (output_dir / "checkpoints").is_dir() or not args.trainer.save
        resume = output_dir if own else args.trainer.save  # --load of a run's folder: its checkpoints
        raise ConfigError(
            f"--output-dir {output_dir}: an earlier run wrote {', '.join(written)} there, and "
            f"this one would append to it. Pass --load {resume} to continue that run, choose "
            "another --output-dir, or leave it out (each run then gets a folder of its own "
            "under runs/)")
