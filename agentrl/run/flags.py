"""``train.py``'s flags: :func:`parse_args` builds every subsystem's config (the ``Args`` of
:mod:`agentrl.run.config`) from the command line and checks them, alone and together."""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Sequence

from agentrl.config import (
    FlagParser,
    add_arguments,
    from_namespace,
    unknown_flags_message,
)
from agentrl.errors import ConfigError, PluginError
from agentrl.models.catalog import resolve_checkpoint
from agentrl.models.defaults import apply_embedded_default
from agentrl.placement.cluster import ClusterConfig
from agentrl.rollout.config import RolloutConfig, collect_server_args
from agentrl.run.config import Args, RunConfig
from agentrl.run.run_folder import choose_run_folder
from agentrl.run.validation import check_files, validate_together
from agentrl.trainer.config import TrainerConfig

__all__ = ["build_parser", "parse_args"]


def build_parser() -> argparse.ArgumentParser:
    """``train.py``'s parser: one flag per config field (``--sglang-*`` and ``--vllm-*`` flags
    are collected apart, by :func:`parse_args`)."""
    # allow_abbrev=False: a prefix such as --num-roll must not quietly mean --num-rollout
    parser = FlagParser(prog="train.py", allow_abbrev=False,
                                     description="agentrl: RL for tool-using agents")
    for cls, title in ((RolloutConfig, "rollout"), (TrainerConfig, "trainer"), (RunConfig, "run"),
                       (ClusterConfig, "cluster")):
        add_arguments(parser, cls, title)
    return parser


def parse_args(argv: Sequence[str] | None = None) -> Args:
    """Parses and validates the flags: each config on its own, then the checks that read
    several (:func:`~agentrl.run.validation.validate_together`, which also solves the
    batch equation), then the files they name. An error names the flag and exits with status 2.
    """
    parser = build_parser()
    embedded = apply_embedded_default(parser, argv)  # only defaults: the command line wins
    namespace, unknown = parser.parse_known_args(argv)
    namespace.sglang_args, unknown = collect_server_args(unknown, "sglang")
    namespace.vllm_args, unknown = collect_server_args(unknown, "vllm")
    if unknown:
        parser.error(unknown_flags_message(parser, unknown))
    try:
        args = Args(rollout=from_namespace(RolloutConfig, namespace),
                    trainer=from_namespace(TrainerConfig, namespace),
                    run=from_namespace(RunConfig, namespace),
                    cluster=from_namespace(ClusterConfig, namespace), namespace=namespace,
                    embedded=embedded)
        args = _with_run_folder(args)
        args = _with_model_folder(args)
        args = validate_together(args)
        check_files(args)
    except (ConfigError, PluginError) as exc:
        parser.error(str(exc))
    return args


def _with_model_folder(args: Args) -> Args:
    """``args`` with ``--hf-checkpoint`` a folder: a named model or a GGUF file is fetched or
    converted on first use (:func:`agentrl.models.catalog.resolve_checkpoint`)."""
    given = args.rollout.hf_checkpoint
    if given is None:
        return args
    folder = resolve_checkpoint(given)
    args.namespace.hf_checkpoint = folder
    return dataclasses.replace(args, rollout=dataclasses.replace(args.rollout, hf_checkpoint=folder))


def _with_run_folder(args: Args) -> Args:
    """``args`` with the run's folder chosen (``--output-dir``, and ``--load`` of a run's folder
    read as its checkpoints), also in the namespace plug-ins see."""
    folder = choose_run_folder(args.run.output_dir, args.trainer.load)
    args.namespace.output_dir, args.namespace.load = folder.path, folder.load
    return dataclasses.replace(args, run=dataclasses.replace(args.run, output_dir=folder.path),
                               trainer=dataclasses.replace(args.trainer, load=folder.load),
                               fresh_output_dir=folder.fresh)
