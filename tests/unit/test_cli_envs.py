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


def test_list_envs_verbose_shows_the_public_and_the_private_fields(capsys):
    assert main(["list-envs", "--verbose"]) == 0
    out = capsys.readouterr().out
    calc = out[out.index("calc-v0"):]
    assert "  public (the policy may see): id, split, question" in calc
    assert "  private (the grader only): answer, expression; and any other column of a row" in calc
    swe = out[out.index("swe-tools-v0"):]
    assert "private (the grader only): fix, hidden_tests, test_ids, failing_tests" in swe
    assert main(["list-envs", "--json"]) == 0
    rows = {row["id"]: row for row in json.loads(capsys.readouterr().out)}
    assert rows["calc-v0"]["task_fields"]["public"] == ["id", "split", "question"]


def test_check_env_fails_loudly_on_an_env_that_shows_its_answer(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))
    (tmp_path / "cli_leaky_envs.py").write_text(
        "import agentrl\n"
        "from agentrl_envs.calc.env import CalcEnv\n\n\n"
        "class Leaky(CalcEnv):\n"
        "    def make_prompt(self, task):\n"
        "        return [*super().make_prompt(task), {'role': 'user', 'content': f\"(it is {task['answer']})\"}]\n\n\n"
        "agentrl.register_env('cli-leaky-v0', entry_point=Leaky)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert main(["check-env", "cli_leaky_envs:cli-leaky"]) == 1
    err = capsys.readouterr().err
    assert "'leakage' failed" in err and "answer in the first observation[2]['content']" in err


def test_check_env_says_which_checks_ran_and_which_it_skipped(tmp_path, monkeypatch, capsys):
    assert main(["check-env", "calc"]) == 0
    out = capsys.readouterr().out
    assert "calc-v0: all checks passed" in out
    assert "  passed: type, tool schemas, reset, determinism, final answer," in out
    assert "unknown split, oracle, leakage, close" in out
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))
    (tmp_path / "cli_shout_checked.py").write_text(USER_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    assert main(["check-env", "cli_shout_checked:cli-shout"]) == 0
    out = capsys.readouterr().out
    assert "every check that ran passed (4 skipped)" in out
    assert "  skipped: unknown split: the env has no task set" in out
    assert "  skipped: leakage: the env declares no task_fields" in out
    assert "leakage" not in out.split("  passed: ")[1].splitlines()[0]


DICT_SPLITS_MODULE = '''
import agentrl

SPLITS = {"train": [{"word": "a"}], "test": [{"word": "b"}]}


class LookupEnv(agentrl.ToolEnv):
    """The README's idiom: the split looked up in a dict."""

    def task_set(self, split="test", limit=None):
        return SPLITS[split][:limit]

    def sample_task(self):
        return SPLITS["train"][0]

    def make_prompt(self, task):
        return [{"role": "user", "content": task["word"]}]

    def compute_reward(self, task, final, state):
        return final["content"] == task["word"]

    def oracle_action(self, task, history):
        return task["word"]


agentrl.register_env("cli-lookup-v0", entry_point=LookupEnv)
'''


def test_an_unknown_split_of_a_dict_lookup_env_is_one_clear_error(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))
    (tmp_path / "cli_lookup_envs.py").write_text(DICT_SPLITS_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    assert main(["eval", "--env", "cli_lookup_envs:cli-lookup", "--split", "bogus"]) == 1
    err = capsys.readouterr().err
    assert "LookupEnv has no task split 'bogus'; available splits: 'train', 'test'" in err
    assert "Traceback" not in err
    assert main(["check-env", "cli_lookup_envs:cli-lookup"]) == 0  # the KeyError counts as a refusal
    assert "unknown split" in capsys.readouterr().out.split("  passed: ")[1]


def test_help_is_plain_text_without_rest_markup(capsys):
    from agentrl.config import plain_text

    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    assert "``" not in out and ":class:" not in out
    assert "The agentrl command line: list-envs, check-env ID" in out
    assert plain_text("a :class:`~agentrl.env.ToolEnv`, :func:`check_env`, ``--x``") == "a ToolEnv, check_env, --x"
