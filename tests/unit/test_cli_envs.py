"""``agentrl list-envs`` and ``agentrl check-env`` through ``agentrl.cli.main``."""

from __future__ import annotations

import json

import pytest

from agentrl.cli import main
from agentrl.env import registry

USER_MODULE = '''
import agentrl


class ShoutEnv(agentrl.ToolEnv):
    """Repeat the task's word in capitals."""

    def sample_task(self):
        return {"word": "hi"}

    def make_prompt(self, task):
        return [{"role": "user", "content": task["word"]}]

    def compute_reward(self, task, final, state):
        return final["content"] == task["word"].upper()


agentrl.register_env("cli-shout-v0", entry_point=ShoutEnv)
'''


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))
    (tmp_path / "cli_user_envs.py").write_text(USER_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    return "cli_user_envs"


def test_list_envs_imports_user_modules(user_module, capsys):
    assert main(["list-envs", "--module", user_module, "--json"]) == 0
    rows = {row["id"]: row for row in json.loads(capsys.readouterr().out)}
    assert rows["cli-shout-v0"]["description"] == "Repeat the task's word in capitals."
    assert "calc-v0" in rows


def test_list_envs_unknown_module_is_a_clear_error(capsys):
    assert main(["list-envs", "--module", "no_such_module_xyz"]) == 1
    assert "cannot import module 'no_such_module_xyz' (from --module)" in capsys.readouterr().err


def test_check_env_unknown_kwarg_is_a_clear_error(capsys):
    assert main(["check-env", "calc", "--env-kwarg", "frob=1"]) == 1
    err = capsys.readouterr().err
    assert "env 'calc-v0' (CalcEnv) got unknown argument(s) 'frob'; it accepts: compact," in err


def test_check_env_unknown_split_is_a_clear_error(capsys):
    assert main(["check-env", "calc", "--env-kwarg", "split=dev"]) == 1
    assert "CalcEnv has no task split 'dev'; available splits: 'train', 'test'" in (
        capsys.readouterr().err
    )
