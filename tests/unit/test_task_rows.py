"""Rows become tasks at load, by one rule (agentrl.env.TaskFields): each built-in env declares
the fields it reads; a row without them is skipped with its line and why, a file without any
usable row is refused when the run starts, --input-key / --label-key fill the env's prompt and
label fields, and no data source loops over rows it cannot serve."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import agentrl
from agentrl.env import TaskFields, ToolEnv, registry
from agentrl.errors import DataError
from agentrl.rollout.data import RolloutDataSource

pytestmark = pytest.mark.unit

CALC_ROWS = [{"question": "What is 1 + 1?", "answer": 2}, {"question": "What is 2 + 2?", "answer": 4}]


def source(path: Path, **flags: Any) -> RolloutDataSource:
    return RolloutDataSource(argparse.Namespace(prompt_data=str(path), n_samples_per_prompt=1, **flags))


def write(path: Path, rows: list[dict[str, Any]]) -> Path:
    if path.suffix == ".parquet":
        pq.write_table(pa.Table.from_pylist(rows), path)
    else:
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_task_from_maps_the_input_and_label_columns_and_names_what_is_missing():
    fields = TaskFields({"question": "the question", "answer": "the answer"}, prompt="question",
                        label="answer")
    assert fields.task_from({"text": "q?", "label": 3}, "text", "label") == {
        "text": "q?", "label": 3, "question": "q?", "answer": 3}
    reason = fields.task_from({"text": "q?", "label": 3}, "prompt", "label")
    assert reason == ("no 'question' (the question); the row has ['label', 'text']; --input-key "
                      "NAME reads 'question' from the column NAME")
    assert "no 'answer' (the answer)" in fields.task_from({"question": "q", "answer": None}, "p", "l")


# openenv-v0 reads no prompt-file rows: its tasks are its server's (the task API)
@pytest.mark.parametrize("env_id", [s.id for s in agentrl.list_envs() if s.id != "openenv-v0"])
def test_every_built_in_env_declares_its_rows_and_its_example_is_a_task(env_id):
    env = agentrl.make_env(env_id)
    fields = type(env).task_fields
    assert fields is not None and fields.fields
    if not fields.example:  # swe-bench: an instance needs its Docker image
        assert env_id == "swe-bench-v0"
        return
    task = fields.task_from(fields.example, "prompt", "label")
    assert isinstance(task, dict), task
    prompt = env.make_prompt(task)  # what the env reads of a row is in the declared fields
    assert prompt and prompt[-1]["role"] == "user"


@pytest.mark.parametrize("suffix", [".jsonl", ".parquet"])
def test_a_file_no_row_of_which_is_a_task_is_refused_at_start_up(tmp_path, suffix):
    path = write(tmp_path / f"rows{suffix}", [{"text": "What is 1 + 1?", "label": 2}] * 3)
    with pytest.raises(DataError) as info:
        source(path, env="calc")
    message = str(info.value)
    assert f"--prompt-data {str(path)!r} has no usable row" in message
    assert "line 1: not a task of --env calc: no 'question'" in message and "['label', 'text']" in message
    with pytest.raises(DataError, match="no 'prompt' field"):  # without --env: the same file, refused too
        source(path)


@pytest.mark.parametrize("suffix", [".jsonl", ".parquet"])
def test_input_and_label_keys_map_a_files_columns_onto_the_env_fields(tmp_path, suffix):
    path = write(tmp_path / f"rows{suffix}", [{"text": "What is 6 * 7?", "gold": 42}])
    data = source(path, env="calc", input_key="text", label_key="gold")
    [[sample]] = data.get_samples(1)
    assert sample.metadata["task"]["question"] == "What is 6 * 7?" and sample.label == 42
    assert sample.prompt[-1]["content"] == "What is 6 * 7?"  # calc's own prompt, from the mapped field


def test_a_mixed_file_skips_exactly_its_bad_lines(tmp_path):
    rows = [CALC_ROWS[0], {"question": "no answer"}, CALC_ROWS[1], {"answer": 3}]
    data = source(write(tmp_path / "rows.jsonl", rows), env="calc")
    assert [(r.line, r.reason.split(":")[0]) for r in data.skipped_rows] == [
        (2, "not a task of --env calc"), (4, "not a task of --env calc")]
    assert [g[0].label for g in data.get_samples(4)] == [2, 4, 2, 4]


class NoDeclaredFields(ToolEnv):
    """A user's env that declares nothing: its make_prompt fails on every row of the file."""

    def sample_task(self):
        return {"q": "x"}

    def make_prompt(self, task):
        return [{"role": "user", "content": task["q"]}]

    def compute_reward(self, task, final, state):
        return 0.0


def test_rows_an_undeclared_env_cannot_read_stop_the_run_instead_of_looping(tmp_path, monkeypatch):
    registry.load_builtin_envs()  # before the copy, or the built-ins vanish with it afterwards
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))  # this test's env leaves with it
    agentrl.register_env("no-fields-v0", NoDeclaredFields)
    path = write(tmp_path / "rows.jsonl", [{"text": "a"}, {"text": "b"}])
    data = source(path, env="no-fields")
    with pytest.raises(DataError) as info:
        data.get_samples(1)
    assert "a whole pass over it served none" in str(info.value) and "line 1" in str(info.value)
