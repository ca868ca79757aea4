"""``python -m agentrl.warm``: the oracle's demonstrations are written once as
conversations, the tiny model is trained on them through train.py, and the same recipe
reproduces the same loss curve."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from agentrl.models.defaults import EMBEDDED_DEFAULTS
from agentrl.warm import write_demonstrations
from tests.support.sandboxes import backend_skip_reason

pytestmark = pytest.mark.e2e

RECIPE = ["--env", "calc", "--env-kwarg", "compact=true", "--max-turns", "3", "--steps", "3",
          "--batch-size", "4", "--limit", "8"]


def _warm(out: Path) -> dict:
    done = subprocess.run([sys.executable, "-m", "agentrl.warm", *RECIPE, "--out", str(out)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "warm start: sft_loss" in done.stdout
    return json.loads((out / "warm.json").read_text())


def test_the_same_recipe_reproduces_the_same_loss_curve(tmp_path):
    first, second = _warm(tmp_path / "a"), _warm(tmp_path / "b")
    assert first["demonstrations"] == 8 and first["tasks_played"] == 8
    assert first["demonstrations_sha256"] == second["demonstrations_sha256"]
    assert len(first["sft_loss"]) == 3 and first["sft_loss"][-1] < first["sft_loss"][0]  # it learns
    assert second["sft_loss"] == pytest.approx(first["sft_loss"], abs=1e-4)
    model = tmp_path / "a" / "model"
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= {p.name for p in model.iterdir()}
    row = json.loads((tmp_path / "a" / "demonstrations.jsonl").read_text().splitlines()[0])
    assert [m["role"] for m in row["prompt"]] == ["system", "user", "assistant", "tool", "assistant"]
    assert row["tools"] == []  # compact: the prompt names the tool, the template lists no schema


def test_swe_tools_demonstrations_follow_the_procedure(tmp_path):
    reason = backend_skip_reason("bwrap")
    if reason is not None:
        pytest.skip(reason)
    path = tmp_path / "demos.jsonl"
    written, played = write_demonstrations("swe-tools", ["level=located", "compact=true", "sandbox=bwrap"], 5,
                                           path, limit=2)
    assert (written, played) == (2, 2)
    for line in path.read_text().splitlines():
        calls = [c["name"] + ":" + c["arguments"].get("command", "")
                 for m in json.loads(line)["prompt"] if m["role"] == "assistant" for c in m["tool_calls"]]
        assert calls == ["editor:view", "editor:str_replace", "run_tests:", "submit:"]


def test_the_shipped_swe_tools_warm_start_is_what_its_recipe_makes(tmp_path):
    """The command reproduces the shipped checkpoint, in short: the oracle's first train tasks
    give the shipped demonstrations' first rows, and the first steps of training on them give
    the first points of the shipped loss curve."""
    reason = backend_skip_reason("bwrap")
    if reason is not None:
        pytest.skip(reason)
    shipped = EMBEDDED_DEFAULTS["swe-tools"]
    recipe = shipped.warm_record()
    for name, digest in recipe["model_sha256"].items():  # the files are the ones the recipe made
        assert hashlib.sha256((shipped.path / name).read_bytes()).hexdigest() == digest, name
    assert "model.safetensors" in recipe["model_sha256"]
    demos = (shipped.path / "demonstrations.jsonl").read_bytes()
    assert hashlib.sha256(demos).hexdigest() == recipe["demonstrations_sha256"]
    rows = demos.decode("utf-8").splitlines()
    assert len(rows) == recipe["demonstrations"] == recipe["tasks_played"]
    path = tmp_path / "demos.jsonl"
    written, _ = write_demonstrations(shipped.env, [*recipe["env_kwarg"], "sandbox=bwrap"],
                                      recipe["max_turns"], path, limit=4)
    assert written == 4 and path.read_text(encoding="utf-8").splitlines() == rows[:4]

    steps = 3
    done = subprocess.run(
        [sys.executable, "-m", "agentrl.warm", "--env", shipped.env,
         "--demonstrations", str(shipped.path / "demonstrations.jsonl"), "--steps", str(steps),
         "--batch-size", str(recipe["batch_size"]), "--lr", str(recipe["lr"]),
         "--seed", str(recipe["seed"]), "--out", str(tmp_path / "warm")],
        capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    again = json.loads((tmp_path / "warm" / "warm.json").read_text())
    assert again["demonstrations_sha256"] == recipe["demonstrations_sha256"]
    assert again["sft_loss"] == pytest.approx(recipe["sft_loss"][:steps], abs=1e-3)


def test_a_bad_recipe_is_one_line_naming_the_flag(tmp_path):
    done = subprocess.run([sys.executable, "-m", "agentrl.warm", "--env", "calc", "--steps", "0",
                           "--out", str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and "--steps must be >= 1" in done.stderr and "Traceback" not in done.stderr
    done = subprocess.run([sys.executable, "-m", "agentrl.warm", "--env", "calc", "--demonstrations",
                           str(tmp_path / "none.jsonl"), "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and "--demonstrations" in done.stderr and "no such file" in done.stderr
    assert "Traceback" not in done.stderr
