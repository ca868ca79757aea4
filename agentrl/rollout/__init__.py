"""Rollout: playing episodes with the policy engine and turning them into ``Sample`` records.

The stages, in data-flow order:

* :mod:`~agentrl.rollout.data` - prompts as groups of samples (``RolloutDataSource``): JSONL/
  Parquet files or an env's task set; :mod:`~agentrl.rollout.buffer` - the source that serves
  buffered groups first (``RolloutDataSourceWithBuffer``) and ``load_data_source``, which picks
  a run's source.
* the turns come from an engine (:mod:`agentrl.engine`, the layer below: the engine contract,
  the embedded torch engine, the SGLang and vLLM clients).
* :mod:`~agentrl.rollout.episode` / :mod:`~agentrl.records.trajectory` - the one episode loop
  (its turns from the engine, a scripted policy, or a custom generate function),
  token-in/token-out: prompt ids, sampled ids (loss mask 1), env deltas (loss mask 0).
* :mod:`~agentrl.rollout.custom` - ``--custom-generate-function-path`` and its helpers.
* :mod:`~agentrl.rollout.rewards` / :mod:`~agentrl.rollout.filters` - custom reward models and
  dynamic-sampling filters.
* :mod:`~agentrl.rollout.runner` - groups, dynamic sampling and partial rollout.
* :mod:`~agentrl.rollout.build` - the env factory, engine and context of a run, from its config.

Evaluation (eval sets, pass@k) plays through the same runner: :mod:`agentrl.eval`.

Imports neither Ray, Megatron, SGLang nor vLLM; torch and transformers load only with the names
that need them (the engine, the episode runner).
"""

from __future__ import annotations

import importlib
from typing import Any

from agentrl.engine.base import Engine, GenerateOutput, SamplingParams
from agentrl.records.sample import Sample, Status, Turn
from agentrl.rollout.config import RolloutConfig

_LAZY = {
    "EmbeddedEngine": "agentrl.engine.embedded",
    "Episode": "agentrl.rollout.episode",
    "EngineTurns": "agentrl.rollout.episode",
    "ScriptedTurns": "agentrl.rollout.episode",
    "TurnSource": "agentrl.rollout.episode",
    "RolloutContext": "agentrl.rollout.episode",
    "RolloutBatch": "agentrl.rollout.runner",
    "RolloutRunner": "agentrl.rollout.runner",
    "AsyncRollout": "agentrl.rollout.pipeline",
    "SampleLedger": "agentrl.rollout.ledger",
    "RolloutDataSource": "agentrl.rollout.data",
    "RolloutDataSourceWithBuffer": "agentrl.rollout.buffer",
    "load_data_source": "agentrl.rollout.buffer",
    "generate_single": "agentrl.rollout.custom",
    "extract_tool_call": "agentrl.rollout.custom",
    "execute_tool": "agentrl.rollout.custom",
    "aexecute_tool": "agentrl.rollout.custom",
    "compute_reward": "agentrl.rollout.custom",
    "acompute_reward": "agentrl.rollout.custom",
    "env_factory": "agentrl.rollout.build",
    "load_policy_engine": "agentrl.rollout.build",
}

__all__ = ["Engine", "GenerateOutput", "RolloutConfig", "Sample", "SamplingParams", "Status",
           "Turn", *sorted(_LAZY)]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'agentrl.rollout' has no attribute {name!r}")
