"""The embedded default: without ``--hf-checkpoint``, ``--env swe-tools`` plays the shipped warm
start at the settings it was trained at, and every flag the user gives still wins."""

from __future__ import annotations

from pathlib import Path

import pytest

from agentrl.cli import main as agentrl_main
from agentrl.cli import parse as parse_cli
from agentrl.models.defaults import EMBEDDED_DEFAULTS
from agentrl.run.evaluate import parse_eval_config
from agentrl.run.flags import build_parser, parse_args

pytestmark = pytest.mark.unit

SWE = EMBEDDED_DEFAULTS["swe-tools"]


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # the default --output-dir is relative


def test_swe_tools_without_a_checkpoint_plays_the_shipped_warm_start_at_its_settings():
    args = parse_args(["--env", "swe-tools", "--max-turns", "5"])
    assert args.embedded is SWE
    assert args.rollout.hf_checkpoint == str(SWE.path)
    assert args.rollout.env_kwargs == {"level": "located", "compact": True}
    assert args.run.num_rollout == SWE.flags["num_rollout"]
    assert args.rollout.rollout_batch_size == SWE.flags["rollout_batch_size"]
    assert args.trainer.lr == SWE.flags["lr"]
    assert args.rollout.rollout_max_prompts == SWE.flags["rollout_max_prompts"]
    assert args.rollout.rollout_temperature == SWE.flags["rollout_temperature"]
    # held-out success before and after: an evaluation at the start and at the end
    assert args.run.eval_interval == args.run.num_rollout and args.rollout.eval_max_prompts == 8


def test_the_command_line_wins_over_the_embedded_default():
    args = parse_args(["--env", "swe-tools", "--num-rollout", "2", "--lr", "3e-5",
                       "--env-kwarg", "level=standard", "--env-kwarg", "sandbox=bwrap"])
    assert args.rollout.hf_checkpoint == str(SWE.path)
    assert args.run.num_rollout == 2 and args.trainer.lr == 3e-5 != SWE.flags["lr"]
    assert args.rollout.env_kwargs == {"level": "standard", "compact": True, "sandbox": "bwrap"}
    assert args.rollout.max_turns == SWE.flags["max_turns"]  # not given: the default's


def test_the_versioned_env_id_gets_it_too():
    assert parse_args(["--env=swe-tools-v0"]).embedded is SWE


def test_every_flag_of_the_default_is_a_train_py_flag():
    dests = {action.dest for action in build_parser()._actions}
    assert set(SWE.flags) <= dests


def test_a_checkpoint_of_ones_own_turns_the_whole_default_off():
    defaults = parse_args(["--env", "calc"])
    args = parse_args(["--env", "swe-tools", "--hf-checkpoint", str(SWE.path)])
    assert args.embedded is None and args.rollout.env_kwargs == {}
    assert args.run.num_rollout == defaults.run.num_rollout and args.trainer.lr == defaults.trainer.lr


@pytest.mark.parametrize("own", [["--prompt-data", "tasks.jsonl"], ["--loss-type", "sft_loss"],
                                 ["--custom-generate-function-path", "examples/custom_generate.py"],
                                 ["--agent-function-path=examples/mini_swe_agent.py:run"]])
def test_tasks_a_loop_or_a_supervised_run_of_ones_own_turn_it_off(own, tmp_path):
    (tmp_path / "tasks.jsonl").write_text('{"prompt": "hi"}\n')
    from agentrl.models.defaults import apply_embedded_default

    assert apply_embedded_default(build_parser(), ["--env", "swe-tools", *own]) is None


def test_a_malformed_command_line_is_left_to_the_real_parser(capsys):
    with pytest.raises(SystemExit) as exc:
        parse_args(["--env"])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and "train.py: error: argument --env: expected one argument" in err


def test_an_env_without_a_shipped_warm_start_keeps_the_random_tiny_model():
    args = parse_args(["--env", "calc"])
    assert args.embedded is None and args.rollout.hf_checkpoint is None


def test_agentrl_eval_applies_it_only_when_the_model_plays():
    args, applied = parse_cli(["eval", "--env", "swe-tools", "--policy", "model"])
    rollout, _ = parse_eval_config(args)
    assert applied is SWE and rollout.hf_checkpoint == str(SWE.path)
    assert rollout.env_kwargs == {"level": "located", "compact": True} and rollout.max_turns == 5
    assert rollout.eval_max_prompts is None  # the demo's small held-out check is not eval's default
    args, applied = parse_cli(["eval", "--env", "swe-tools"])  # the oracle plays
    rollout, _ = parse_eval_config(args)
    assert applied is None and rollout.hf_checkpoint is None and rollout.env_kwargs == {}


def test_the_announcement_says_what_is_played_at_which_settings(capsys):
    assert agentrl_main(["eval", "--env", "swe-tools", "--policy", "model", "--env-kwarg", "bad"]) == 1
    out, err = capsys.readouterr()
    assert "embedded default for --env swe-tools" not in out and "--env-kwarg expects KEY=VALUE" in err
    assert "level=located compact=true (as it was trained)" in SWE.announcement(
        {"level": "located", "compact": True})
    changed = SWE.announcement({"level": "standard", "compact": True})
    assert "level=standard compact=true (trained at level=located compact=true)" in changed


def test_the_shipped_checkpoint_is_complete_and_was_trained_at_the_settings_it_is_played_at():
    files = {p.name for p in SWE.path.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "warm.json",
            "demonstrations.jsonl"} <= files
    recipe = SWE.warm_record()
    assert recipe["env"] == SWE.env
    # played at the settings it was trained at; the recipe may also widen the task set it drew
    # its demonstrations from (per_module: more tasks of the same generator, same split by id)
    assert set(SWE.env_kwarg) <= set(recipe["env_kwarg"])
    assert {pair.split("=")[0] for pair in set(recipe["env_kwarg"]) - set(SWE.env_kwarg)} <= {"per_module"}
    assert recipe["max_turns"] == SWE.flags["max_turns"]
    assert f"--steps {recipe['steps']}" in SWE.recipe
    assert recipe["sft_loss"][-1] < recipe["sft_loss"][0] / 10
