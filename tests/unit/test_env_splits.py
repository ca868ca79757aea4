"""Every built-in env refuses an unknown task split with an error naming it and the available
ones, in ``task_set`` and in a constructor that takes ``split``."""

from __future__ import annotations

import inspect

import pytest

import agentrl
from agentrl import SandboxedToolEnv
from agentrl.errors import UnknownSplitError

SWE_BENCH_ROW = {
    "instance_id": "demo__demo-1", "base_commit": "0" * 40, "problem_statement": "Fix it.",
    "patch": "", "test_patch": "", "FAIL_TO_PASS": "[]", "PASS_TO_PASS": "[]",
    "image": "agentrl-demo:latest",
}
# openenv-v0's splits are its server's: tests/integration/test_openenv.py checks them
BUILTIN_IDS = [spec.id for spec in agentrl.list_envs() if spec.id != "openenv-v0"]


def _make(env_id, **kwargs):
    cls = agentrl.env_spec(env_id).load()
    if env_id == "swe-bench-v0":
        kwargs["instances"] = [SWE_BENCH_ROW]
    elif env_id == "harbor-v0":
        kwargs["sandbox"] = "docker"  # its only backend; nothing runs here
    elif issubclass(cls, SandboxedToolEnv):
        kwargs["sandbox"] = "process"  # nothing runs here: any backend name resolves
    return agentrl.make_env(env_id, **kwargs)


@pytest.mark.parametrize("env_id", BUILTIN_IDS)
def test_task_set_of_an_unknown_split_names_it_and_the_available_ones(env_id):
    env = _make(env_id)
    with pytest.raises(UnknownSplitError, match=r"has no task split 'dev'; available splits: '"):
        env.task_set("dev")


@pytest.mark.parametrize(
    "env_id",
    [i for i in BUILTIN_IDS if "split" in inspect.signature(agentrl.env_spec(i).load()).parameters],
)
def test_constructor_split_is_checked_the_same_way(env_id):
    with pytest.raises(UnknownSplitError, match=r"has no task split 'dev'; available splits: '"):
        _make(env_id, split="dev")
