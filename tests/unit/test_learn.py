"""``python -m agentrl.learn``'s held-out figure and its refusals (the recipe itself runs in
tests/e2e/test_learning.py)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from agentrl.errors import ConfigError
from agentrl.learn import _record_for, heldout_figure, main


def test_the_heldout_figure_is_pass_at_1_with_its_standard_error(tmp_path: Path):
    summary = {"sets": {"calc": {"n_samples": 200, "success_rate": 0.25, "tool_calls": 190,
                                 "tool_errors": {"parse_error": 3}, "wall_s": 12.5}}}
    (tmp_path / "eval.json").write_text(json.dumps(summary))
    figure = heldout_figure(tmp_path / "eval.json")
    assert figure["pass@1"] == 0.25 and figure["tasks"] == 200
    assert figure["stderr"] == pytest.approx(math.sqrt(0.25 * 0.75 / 200))  # 0.0306
    assert figure["tool_errors"] == {"parse_error": 3}


@pytest.mark.parametrize(("flags", "message"), [
    (["--warm-steps", "0"], "--warm-steps must be >= 1"),
    (["--n-samples-per-prompt", "1"], "--n-samples-per-prompt must be >= 2: GRPO compares"),
])
def test_bad_flags_are_refused_before_anything_runs(tmp_path: Path, flags, message):
    with pytest.raises(ConfigError, match=message):
        main(["--env", "calc", "--out", str(tmp_path / "out"), *flags])
    assert not (tmp_path / "out").exists()


def test_another_recipe_in_the_same_folder_is_refused_naming_the_flags(tmp_path: Path):
    recipe = {"env": "calc", "warm_steps": 60, "seed": 0}
    (tmp_path / "learn.json").write_text(json.dumps({"recipe": recipe, "done": ["warm start"]}))
    with pytest.raises(ConfigError, match=r"other flags \(--warm-steps 60 -> 4\): its phases would "
                       r"not be this recipe's; give another --out"):
        _record_for(tmp_path / "learn.json", {**recipe, "warm_steps": 4})
    same = _record_for(tmp_path / "learn.json", recipe)
    assert same["done"] == ["warm start"] and same["heldout"] == {}  # goes on after the warm start
    (tmp_path / "learn.json").write_text("{")
    with pytest.raises(ConfigError, match=r"cannot be read .* give another --out"):
        _record_for(tmp_path / "learn.json", recipe)
