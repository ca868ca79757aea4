"""Placement flags (engines as actors, --colocate, fault tolerance), episode routing keys, and
the trainers the loop places (both are a ``Trainer``)."""

from __future__ import annotations

import importlib
import inspect

import pytest

from agentrl.engine.base import EpisodeAffinity, episode_key
from agentrl.errors import ConfigError
from agentrl.placement.cluster import ClusterConfig
from agentrl.run.flags import parse_args
from agentrl.trainer.protocol import Trainer


def test_episode_key_drops_only_a_turn_suffix():
    assert episode_key("r3-g7-s1-t2") == "r3-g7-s1"
    assert episode_key("r3-g7-s1-t12") == "r3-g7-s1"
    assert episode_key("custom-tag") == "custom-tag"  # no -t<digits>: the rid is its own episode
    assert episode_key("a-tx") == "a-tx"
    assert episode_key(None) is None


def test_episode_affinity_sends_new_episodes_to_the_least_loaded_and_keeps_later_turns_there():
    load = {"a": 2, "b": 0, "c": 0}
    affinity: EpisodeAffinity[str] = EpisodeAffinity()
    assert affinity.pick("e1", ["a", "b", "c"], load.__getitem__) == "b"  # least loaded, first on ties
    load["b"] = 5
    assert affinity.pick("e1", ["a", "b", "c"], load.__getitem__) == "b"  # sticky despite its load
    assert affinity.pick("e2", ["a", "b", "c"], load.__getitem__) == "c"
    assert affinity.pick(None, ["a", "b"], load.__getitem__) == "a" and len(affinity) == 2  # no key: not kept
    assert affinity.pick("e1", ["a", "c"], load.__getitem__) == "c"  # b is not live: moved, remembered
    assert dict(affinity) == {"e1": "c", "e2": "c"}
    affinity.forget("c")
    assert dict(affinity) == {}


def test_episode_affinity_starts_afresh_past_its_limit():
    affinity: EpisodeAffinity[int] = EpisodeAffinity(limit=2)
    for episode in ("x", "y", "z"):
        affinity.pick(episode, [0], lambda _: 0)
    assert list(affinity) == ["z"]


def test_engine_counts():
    assert not ClusterConfig().engine_actors and ClusterConfig().num_engines == 1
    assert ClusterConfig(rollout_num_gpus=3).num_engines == 3
    colocated = ClusterConfig(colocate=True, actor_num_gpus_per_node=2)
    assert colocated.engine_actors and colocated.num_engines == 2


@pytest.mark.parametrize(("flags", "message"), [
    ({"rollout_num_gpus": -1}, "--rollout-num-gpus must be >= 0"),
    ({"rollout_num_gpus": 3, "rollout_num_gpus_per_engine": 2}, "not a multiple"),
    ({"rollout_num_gpus": 2, "use_ray": False}, "drop --no-use-ray"),
    ({"colocate": True, "rollout_num_gpus": 3}, "--rollout-num-gpus must be 1"),
    ({"use_fault_tolerance": True}, "--use-fault-tolerance restarts engine actors"),
    ({"rollout_num_gpus": 1, "rollout_health_check_interval": 0}, "--rollout-health-check-interval"),
])
def test_impossible_placements_name_the_flag(flags, message):
    with pytest.raises(ConfigError, match=message):
        ClusterConfig(**flags).validate()


def test_possible_placements_validate():
    ClusterConfig(colocate=True, use_fault_tolerance=True).validate()
    ClusterConfig(rollout_num_gpus=4, use_fault_tolerance=True).validate()
    ClusterConfig(colocate=True, rollout_num_gpus=2, actor_num_gpus_per_node=2).validate()


def test_tensor_parallelism_must_divide_the_ranks(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit):
        parse_args(["--env", "calc", "--actor-num-gpus-per-node", "3",
                    "--tensor-model-parallel-size", "2"])
    err = capsys.readouterr().err
    assert "= 3 ranks are not a multiple of --tensor-model-parallel-size 2" in err


@pytest.mark.parametrize("trainer_class", ["agentrl.trainer.actor:MegatronActor",
                                           "agentrl.placement.cluster:TrainerGroup"])
def test_both_trainers_have_the_trainer_protocols_methods(trainer_class):
    module, _, name = trainer_class.partition(":")
    cls = getattr(importlib.import_module(module), name)
    for method in ("train", "save_checkpoint", "load_checkpoint", "save_hf", "hf_state_dict",
                   "open_weight_group", "weight_metadata", "broadcast_weights"):
        expected = list(inspect.signature(getattr(Trainer, method)).parameters)
        assert list(inspect.signature(getattr(cls, method)).parameters) == expected, method
    assert issubclass(cls, Trainer)
