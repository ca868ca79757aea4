"""Data sources: rows -> groups, epochs and seeded shuffles, malformed rows, streaming, prefetch
workers, exact resume, env task sets and seed streams, the buffer and its filters."""

from __future__ import annotations

import argparse
import gc
import json
import logging
import threading
import tracemalloc
from pathlib import Path
from typing import Any

import pytest

import agentrl
from agentrl.env import registry
from agentrl.errors import ConfigError, DataError, PluginError
from agentrl.rollout import Sample
from agentrl.rollout.buffer import RolloutDataSourceWithBuffer, load_data_source
from agentrl.rollout.data import RolloutDataSource, SkippedRow


def make_args(**kw: Any) -> argparse.Namespace:
    return argparse.Namespace(**kw)


def write_jsonl(path: Path, rows: list[Any]) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def text_rows(n: int) -> list[dict[str, Any]]:
    return [{"prompt": f"question {i}", "label": str(i)} for i in range(n)]


def prompts(groups: list[list[Sample]]) -> list[Any]:
    return [g[0].prompt for g in groups]


def dicts(groups: list[list[Sample]]) -> list[list[dict[str, Any]]]:
    return [[s.to_dict() for s in g] for g in groups]


# -- rows -> groups -------------------------------------------------------------------------------


def test_text_prompts_become_groups_of_fresh_samples(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", [
        {"prompt": "2+2?", "label": "4", "metadata": {"level": 1}},
        {"prompt": "3+3?", "label": "6"},
    ])
    source = RolloutDataSource(make_args(prompt_data=str(path), n_samples_per_prompt=3))
    assert len(source) == 2
    first, second = source.get_samples(2)
    assert [s.index for s in first] == [0, 1, 2]
    assert {s.group_id for s in first} == {0} and {s.group_id for s in second} == {1}
    assert [s.prompt for s in first] == ["2+2?"] * 3 and first[0].label == "4"
    assert first[0].metadata == {
        "level": 1,
        "task": {"prompt": "2+2?", "label": "4", "metadata": {"level": 1}},
        "source": {"file": str(path), "line": 1},
    }
    assert second[0].metadata["source"] == {"file": str(path), "line": 2}
    assert "level" not in second[0].metadata
    # separate objects all the way down
    first[0].metadata["task"]["prompt"] = "changed"
    first[0].metadata["level"] = 99
    assert first[1].metadata["task"]["prompt"] == "2+2?" and first[1].metadata["level"] == 1


def test_chat_prompts_are_deep_copied_per_sample(tmp_path):
    chat = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    path = write_jsonl(tmp_path / "d.jsonl", [{"prompt": chat}])
    (group,) = RolloutDataSource(make_args(prompt_data=str(path), n_samples_per_prompt=2)).get_samples(1)
    assert group[0].prompt == chat and group[0].label is None
    group[0].prompt.append({"role": "assistant", "content": "x"})
    group[0].prompt[0]["content"] = "mutated"
    assert group[1].prompt == chat


def test_custom_keys_and_tool_key(tmp_path):
    tools = [{"type": "function", "function": {"name": "f", "parameters": {}}}]
    path = write_jsonl(tmp_path / "d.jsonl", [
        {"question": "q0", "answer": 7, "extra": {"id": "a"}, "tools": tools},
        {"question": "q1", "answer": 8, "extra": json.dumps({"id": "b"}), "tools": json.dumps(tools)},
    ])
    args = make_args(prompt_data=str(path), input_key="question", label_key="answer",
                     metadata_key="extra", tool_key="tools")
    g0, g1 = RolloutDataSource(args).get_samples(2)
    assert (g0[0].prompt, g0[0].label, g0[0].metadata["id"]) == ("q0", 7, "a")
    assert g0[0].metadata["tools"] == tools
    # Parquet-style JSON strings are decoded
    assert (g1[0].label, g1[0].metadata["id"], g1[0].metadata["tools"]) == (8, "b", tools)


def test_parquet_round_trip_streaming_and_not(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [{"prompt": [{"role": "user", "content": f"q{i}"}], "label": str(i)} for i in range(7)]
    path = tmp_path / "d.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path, row_group_size=3)
    for streaming in (False, True):
        source = RolloutDataSource(make_args(prompt_data=str(path), streaming_data=streaming))
        groups = source.get_samples(7)
        assert [g[0].prompt for g in groups] == [r["prompt"] for r in rows]
        assert [g[0].label for g in groups] == [str(i) for i in range(7)]
        assert groups[4][0].metadata["source"] == {"file": str(path), "line": 5}
    # resume inside the second row group (row groups before it are skipped, not read)
    args = make_args(prompt_data=str(path), streaming_data=True)
    a = RolloutDataSource(args)
    a.get_samples(4)
    b = RolloutDataSource(args)
    b.load_state_dict(a.state_dict())
    assert dicts(b.get_samples(5)) == dicts(a.get_samples(5))


def test_group_ids_keep_increasing_across_epochs(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", text_rows(3))
    source = RolloutDataSource(make_args(prompt_data=str(path), n_samples_per_prompt=2))
    groups = source.get_samples(7)
    assert [g[0].group_id for g in groups] == list(range(7))
    assert prompts(groups) == [f"question {i}" for i in (0, 1, 2, 0, 1, 2, 0)]
    assert source.epoch == 2
    assert source.get_samples(0) == []
    with pytest.raises(ValueError, match="num_samples"):
        source.get_samples(-1)


# -- shuffling ------------------------------------------------------------------------------------


def test_seeded_shuffle_is_reproducible_and_differs_per_epoch(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", text_rows(20))
    args = make_args(prompt_data=str(path), rollout_shuffle=True, rollout_seed=7)
    run1 = prompts(RolloutDataSource(args).get_samples(40))
    run2 = prompts(RolloutDataSource(args).get_samples(40))
    assert run1 == run2
    epoch0, epoch1 = run1[:20], run1[20:]
    everything = sorted(f"question {i}" for i in range(20))
    assert sorted(epoch0) == everything and sorted(epoch1) == everything  # permutations
    assert epoch0 != epoch1 and epoch0 != [f"question {i}" for i in range(20)]
    other_seed = prompts(RolloutDataSource(make_args(
        prompt_data=str(path), rollout_shuffle=True, rollout_seed=8)).get_samples(20))
    assert other_seed != epoch0


def test_streaming_shuffle_buffer_is_a_seeded_permutation(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", text_rows(50))
    args = make_args(prompt_data=str(path), rollout_shuffle=True, streaming_data=True,
                     shuffle_buffer_size=8)
    run1 = prompts(RolloutDataSource(args).get_samples(100))
    assert run1 == prompts(RolloutDataSource(args).get_samples(100))
    assert sorted(run1[:50]) == sorted(f"question {i}" for i in range(50))
    assert run1[:50] != [f"question {i}" for i in range(50)] and run1[:50] != run1[50:]


# -- malformed rows -------------------------------------------------------------------------------


def test_malformed_rows_are_reported_with_file_and_line(tmp_path, caplog):
    path = write_jsonl(tmp_path / "d.jsonl", [
        {"prompt": "ok 1"},
        {"prompt": "ok 2"},
        '{"prompt": "broken',
        "[1, 2]",
        {"question": "wrong key"},
        {"prompt": 5},
        {"prompt": [{"content": "no role"}]},
        {"prompt": [{"role": "user"}]},
        {"prompt": "   "},
        {"prompt": "bad metadata", "metadata": [1]},
        {"prompt": "ok 3"},
    ])
    with caplog.at_level(logging.WARNING, logger="agentrl.rollout.data"):
        source = RolloutDataSource(make_args(prompt_data=str(path)))
    assert len(source) == 3 and source.num_skipped_rows == 8
    assert [r.line for r in source.skipped_rows] == [3, 4, 5, 6, 7, 8, 9, 10]
    assert all(isinstance(r, SkippedRow) and r.file == str(path) for r in source.skipped_rows)
    reasons = {r.line: r.reason for r in source.skipped_rows}
    assert "not valid JSON" in reasons[3]
    assert "must be a JSON object, got list" in reasons[4]
    assert "no 'prompt' field" in reasons[5] and "--input-key" in reasons[5]
    assert "string or a list of chat messages, got int" in reasons[6]
    assert "prompt[0] has no 'role'" in reasons[7]
    assert "prompt[0] has no 'content'" in reasons[8]
    assert "empty string" in reasons[9]
    assert "'metadata' must be an object" in reasons[10]
    logged = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(logged) == 8 and logged[0].startswith(f"skipping {path}:3: not valid JSON")
    assert prompts(source.get_samples(3)) == ["ok 1", "ok 2", "ok 3"]


def test_file_without_a_usable_row_is_an_error(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", ["not json", {"q": 1}])
    for streaming in (False, True):
        with pytest.raises(DataError, match=r"no usable row: line 1: not valid JSON.*line 2: no 'prompt'"):
            RolloutDataSource(make_args(prompt_data=str(path), streaming_data=streaming))
    empty = tmp_path / "e.jsonl"
    empty.write_text("\n")
    with pytest.raises(DataError, match="the file is empty"):
        RolloutDataSource(make_args(prompt_data=str(empty)))


def test_bad_source_arguments(tmp_path):
    with pytest.raises(DataError, match="--prompt-data FILE.*or --env"):
        RolloutDataSource(make_args())
    with pytest.raises(DataError, match="no such file"):
        RolloutDataSource(make_args(prompt_data=str(tmp_path / "missing.jsonl")))
    csv = tmp_path / "d.csv"
    csv.write_text("prompt\nx\n")
    with pytest.raises(DataError, match="unsupported format '.csv'"):
        RolloutDataSource(make_args(prompt_data=str(csv)))
    path = write_jsonl(tmp_path / "d.jsonl", text_rows(1))
    with pytest.raises(ConfigError, match="--n-samples-per-prompt"):
        RolloutDataSource(make_args(prompt_data=str(path), n_samples_per_prompt=0))


def test_streaming_reports_malformed_rows_once(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", [{"prompt": "a"}, "oops", {"prompt": "b"}])
    source = RolloutDataSource(make_args(prompt_data=str(path), streaming_data=True, n_samples_per_prompt=1))
    assert source.skipped_rows == []  # nothing read ahead at start-up beyond the first row
    assert prompts(source.get_samples(6)) == ["a", "b"] * 3
    assert [(r.line, r.reason[:14]) for r in source.skipped_rows] == [(2, "not valid JSON")]


# -- streaming and workers ------------------------------------------------------------------------


def test_streaming_matches_in_memory_and_workers_keep_order(tmp_path):
    rows: list[Any] = text_rows(300)
    rows[17] = "bad line"
    path = write_jsonl(tmp_path / "d.jsonl", rows)
    expected = prompts(RolloutDataSource(make_args(prompt_data=str(path))).get_samples(299 * 2))
    for workers in (1, 4):
        source = RolloutDataSource(make_args(prompt_data=str(path), streaming_data=True,
                                             num_data_workers=workers))
        assert prompts(source.get_samples(299 * 2)) == expected
        assert [r.line for r in source.skipped_rows] == [18]
        source.close()
    shuffled = make_args(prompt_data=str(path), streaming_data=True, rollout_shuffle=True,
                         shuffle_buffer_size=32)
    single = prompts(RolloutDataSource(shuffled).get_samples(400))
    shuffled.num_data_workers = 3
    assert prompts(RolloutDataSource(shuffled).get_samples(400)) == single


def test_prefetch_threads_stop_on_close_and_when_the_source_is_dropped(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", text_rows(5_000))

    def data_threads() -> list[threading.Thread]:
        return [t for t in threading.enumerate() if t.name.startswith("agentrl-data")]

    before = len(data_threads())
    source = RolloutDataSource(make_args(prompt_data=str(path), streaming_data=True,
                                         num_data_workers=3))
    assert prompts(source.get_samples(2)) == ["question 0", "question 1"]
    assert len(data_threads()) > before  # reading ahead
    source.close()
    assert len(data_threads()) == before
    assert prompts(source.get_samples(1)) == ["question 2"]  # usable after close()
    del source
    gc.collect()
    assert len(data_threads()) == before


def _peak_streaming_bytes(path: Path, n: int) -> int:
    source = RolloutDataSource(make_args(prompt_data=str(path), streaming_data=True, n_samples_per_prompt=1))
    tracemalloc.start()
    try:
        for _ in range(n // 500):
            source.get_samples(500)
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_streaming_memory_does_not_grow_with_file_size(tmp_path):
    filler = "x" * 400
    small = write_jsonl(tmp_path / "small.jsonl",
                        [{"prompt": f"q{i} {filler}"} for i in range(2_000)])
    large = write_jsonl(tmp_path / "large.jsonl",
                        [{"prompt": f"q{i} {filler}"} for i in range(20_000)])
    assert large.stat().st_size > 8_000_000
    peak_small = _peak_streaming_bytes(small, 2_000)
    peak_large = _peak_streaming_bytes(large, 20_000)
    # 10x the file, same memory: nowhere near the 8 MB the large file holds
    assert peak_large < 2_000_000
    assert peak_large < 2 * peak_small + 200_000


# -- resume ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("options", [
    {},
    {"rollout_shuffle": True},
    {"streaming_data": True},
    {"streaming_data": True, "num_data_workers": 3},
    {"streaming_data": True, "rollout_shuffle": True, "shuffle_buffer_size": 5},
])
def test_save_load_resumes_exactly(tmp_path, options):
    rows: list[Any] = text_rows(13)
    rows[4] = "bad"
    path = write_jsonl(tmp_path / "d.jsonl", rows)
    args = make_args(prompt_data=str(path), n_samples_per_prompt=2, rollout_seed=3, **options)
    uninterrupted = dicts(RolloutDataSource(args).get_samples(35))

    first = RolloutDataSource(args)
    head = dicts(first.get_samples(17))  # stops inside the second epoch
    first.save(tmp_path / "state" / "data.json")
    first.close()
    resumed = RolloutDataSource(args)
    resumed.load(tmp_path / "state" / "data.json")
    assert resumed.epoch == 1 and resumed.num_skipped_rows == 1
    assert head + dicts(resumed.get_samples(18)) == uninterrupted
    resumed.close()


# -- env sources ----------------------------------------------------------------------------------


class TaskEnv(agentrl.ToolEnv):
    """A tiny env with a fixed task set per split."""

    def make_prompt(self, task):
        return [{"role": "user", "content": f"add {task['a']} and {task['b']}"}]

    def compute_reward(self, task, final, state):
        return 0.0

    def task_set(self, split="test", limit=None):
        tasks = [{"a": i, "b": 10 * i, "label": i * 11, "id": f"{split}-{i}"} for i in range(4)]
        return tasks[:limit]


class SeedEnv(agentrl.ToolEnv):
    """An env without a task set: tasks are drawn from seeds."""

    def sample_task(self):
        return {"a": int(self.np_random.integers(100))}

    def make_prompt(self, task):
        return [{"role": "user", "content": str(task["a"])}]

    def compute_reward(self, task, final, state):
        return 0.0


@pytest.fixture
def test_envs(monkeypatch):
    registry.load_builtin_envs()  # before the copy, or the built-ins vanish with it afterwards
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))
    agentrl.register_env("data-test-tasks-v0", entry_point=TaskEnv)
    agentrl.register_env("data-test-seeds-v0", entry_point=SeedEnv)


def test_env_task_set_source(test_envs):
    source = RolloutDataSource(make_args(env="data-test-tasks", env_split="train",
                                         n_samples_per_prompt=2))
    assert len(source) == 4
    groups = source.get_samples(5)
    assert groups[1][0].prompt == [{"role": "user", "content": "add 1 and 10"}]
    assert groups[1][0].label == 11 and groups[1][1].label == 11
    assert groups[1][0].metadata["task"] == {"a": 1, "b": 10, "label": 11, "id": "train-1"}
    assert groups[1][0].metadata["source"] == {"env": "data-test-tasks", "split": "train", "index": 1}
    assert groups[4][0].metadata["task"]["id"] == "train-0" and source.epoch == 1
    # the row drives the episode: reset with it gives the same prompt
    env = agentrl.make_env("data-test-tasks")
    observation, _ = env.reset(options={"task": groups[1][0].metadata["task"]})
    assert observation == groups[1][0].prompt
    source.close()


def test_builtin_calc_env_task_set():
    source = RolloutDataSource(make_args(env="calc", env_split="train"))
    (group,) = source.get_samples(1)
    task = group[0].metadata["task"]
    assert group[0].prompt[-1] == {"role": "user", "content": str(task["question"])}
    assert len(source) == len(agentrl.make_env("calc").task_set("train"))
    source.close()


def test_env_without_task_set_gives_a_seed_stream(test_envs):
    args = make_args(env="data-test-seeds", n_samples_per_prompt=2, rollout_seed=5)
    source = RolloutDataSource(args)
    with pytest.raises(TypeError, match="unknown"):
        len(source)
    groups = source.get_samples(6)
    seeds = [g[0].metadata["seed"] for g in groups]
    assert len(set(seeds)) == 6 and all(isinstance(s, int) and s >= 0 for s in seeds)
    assert all(g[1].metadata["seed"] == g[0].metadata["seed"] for g in groups)
    assert "task" not in groups[0][0].metadata
    assert groups[2][0].metadata["source"] == {"env": "data-test-seeds", "split": "train", "index": 2}
    assert seeds == [g[0].metadata["seed"] for g in RolloutDataSource(args).get_samples(6)]
    other = RolloutDataSource(make_args(env="data-test-seeds", rollout_seed=6)).get_samples(6)
    assert seeds != [g[0].metadata["seed"] for g in other]
    # resume continues the same stream
    resumed = RolloutDataSource(args)
    resumed.load_state_dict(source.state_dict())
    assert dicts(resumed.get_samples(3)) == dicts(source.get_samples(3))
    # a seed draws the same task every time
    env = agentrl.make_env("data-test-seeds")
    assert env.reset(seed=seeds[0])[0] == env.reset(seed=seeds[0])[0]


def test_max_prompts_keeps_the_first_usable_rows_and_plays_them_every_epoch(tmp_path, caplog):
    path = write_jsonl(tmp_path / "d.jsonl", [text_rows(1)[0], "{not json", *text_rows(5)[1:]])
    with caplog.at_level(logging.WARNING):
        source = RolloutDataSource(make_args(prompt_data=str(path), rollout_max_prompts=3))
    assert len(source) == 3 and "d.jsonl:2" in caplog.text  # the bad row is reported, not counted
    assert prompts(source.get_samples(7)) == ["question 0", "question 1", "question 2"] * 2 + ["question 0"]
    assert source.epoch == 2
    shuffled = RolloutDataSource(make_args(prompt_data=str(path), rollout_max_prompts=3,
                                           rollout_shuffle=True, rollout_seed=3))
    epochs = [prompts(shuffled.get_samples(3)) for _ in range(4)]
    assert all(sorted(e) == ["question 0", "question 1", "question 2"] for e in epochs)
    assert len({tuple(e) for e in epochs}) > 1  # the same set, in a new order each epoch


def test_max_prompts_of_an_env_task_set_and_of_a_seed_stream(test_envs):
    tasks = RolloutDataSource(make_args(env="data-test-tasks", rollout_max_prompts=2))
    ids = [g[0].metadata["task"]["id"] for g in tasks.get_samples(5)]
    assert len(tasks) == 2 and ids == ["train-0", "train-1"] * 2 + ["train-0"]
    seeds = RolloutDataSource(make_args(env="data-test-seeds", rollout_max_prompts=2))
    drawn = [g[0].metadata["seed"] for g in seeds.get_samples(6)]
    assert len(seeds) == 2 and drawn[:2] * 3 == drawn and drawn[0] != drawn[1]
    full = RolloutDataSource(make_args(env="data-test-seeds"))
    assert [g[0].metadata["seed"] for g in full.get_samples(2)] == drawn[:2]  # the first N seeds


def test_max_prompts_is_checked_against_streaming():
    from agentrl.rollout.config import RolloutConfig

    with pytest.raises(ConfigError, match="--rollout-max-prompts must be >= 1"):
        RolloutConfig(env="calc", rollout_max_prompts=0).validate()
    with pytest.raises(ConfigError, match="--rollout-max-prompts .* --streaming-data"):
        RolloutConfig(prompt_data="d.jsonl", rollout_max_prompts=4, streaming_data=True).validate()


# -- buffer ---------------------------------------------------------------------------------------


def buffered(tmp_path: Path, **kw: Any) -> RolloutDataSourceWithBuffer:
    path = write_jsonl(tmp_path / "d.jsonl", text_rows(10))
    return RolloutDataSourceWithBuffer(make_args(prompt_data=str(path), n_samples_per_prompt=2, **kw))


def test_buffer_is_served_first_in_fifo_order(tmp_path):
    source = buffered(tmp_path)
    a, b, c = source.get_samples(3)
    a[0].response = "partial"
    source.add_samples([b, a])
    assert source.buffer == [b, a]
    out = source.get_samples(3)
    assert out[0] is b and out[1] is a and out[1][0].response == "partial"
    assert out[2][0].prompt == "question 3" and out[2][0].group_id == 3
    assert source.buffer == []
    source.add_samples([c])
    assert source.get_samples(0) == [] and source.buffer == [c]


def test_add_samples_validates_groups(tmp_path):
    source = buffered(tmp_path)
    (group,) = source.get_samples(1)
    with pytest.raises(TypeError, match="list of groups"):
        source.add_samples(group[0])  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="non-empty list of Samples"):
        source.add_samples([[]])
    with pytest.raises(TypeError, match="not only Sample"):
        source.add_samples([[group[0], "x"]])  # type: ignore[list-item]
    with pytest.raises(TypeError, match="mixes group ids"):
        source.add_samples([[group[0], Sample(group_id=99)]])
    assert source.buffer == []


class ByReward(RolloutDataSourceWithBuffer):
    """A user subclass that overrides only buffer_filter: highest reward first."""

    def buffer_filter(self, args, buffer, num_samples):
        buffer.sort(key=lambda g: -(g[0].reward or 0.0))
        return buffer[:num_samples]


def test_subclass_buffer_filter(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", text_rows(10))
    source = ByReward(make_args(prompt_data=str(path)))
    groups = source.get_samples(4)
    for group, reward in zip(groups, (0.1, 0.9, 0.5, 0.3), strict=True):
        group[0].reward = reward
    source.add_samples(groups)
    out = source.get_samples(2)
    assert [g[0].reward for g in out] == [0.9, 0.5]
    assert [g[0].reward for g in source.buffer] == [0.1, 0.3]  # buffer order untouched


def test_buffer_filter_plugin_file(tmp_path):
    plugin = tmp_path / "my_filter.py"
    plugin.write_text(
        "def newest_first(args, buffer, num_samples):\n"
        "    assert args.marker == 'seen'\n"
        "    return list(reversed(buffer))[:num_samples]\n"
    )
    source = buffered(tmp_path, buffer_filter_path=str(plugin), marker="seen")
    groups = source.get_samples(3)
    source.add_samples(groups)
    out = source.get_samples(2)
    assert out[0] is groups[2] and out[1] is groups[1] and source.buffer == [groups[0]]
    with pytest.raises(PluginError, match="--buffer-filter-path"):
        buffered(tmp_path, buffer_filter_path=str(tmp_path / "nope.py"))


@pytest.mark.parametrize(("body", "message"), [
    ("return [list(g) for g in buffer[:n]]", "not in the buffer"),
    ("return buffer[:1] * 2", "same group twice"),
    ("return buffer", "at most 2"),
    ("return None", "must return a list"),
])
def test_buffer_filter_results_are_checked(tmp_path, body, message):
    plugin = tmp_path / "bad_filter.py"
    plugin.write_text(f"def pick(args, buffer, n):\n    {body}\n")
    source = buffered(tmp_path, buffer_filter_path=f"{plugin}:pick")
    groups = source.get_samples(3)
    source.add_samples(groups)
    with pytest.raises(PluginError, match=rf"--buffer-filter-path {plugin}:pick.*{message}"):
        source.get_samples(2)
    assert len(source.buffer) == 3  # nothing lost on a bad filter


def test_buffer_survives_save_and_load(tmp_path):
    source = buffered(tmp_path, rollout_shuffle=True)
    groups = source.get_samples(3)
    groups[1][0].response, groups[1][0].reward = "half done", 0.5
    source.add_samples([groups[1]])
    source.save(tmp_path / "s.json")
    resumed = buffered(tmp_path, rollout_shuffle=True)
    resumed.load(tmp_path / "s.json")
    assert dicts(resumed.buffer) == dicts([groups[1]])
    assert dicts(resumed.get_samples(3)) == dicts(source.get_samples(3))
    assert resumed.buffer == [] and source.buffer == []


def test_load_data_source_factory(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", text_rows(2))
    assert type(load_data_source(make_args(prompt_data=str(path)))) is RolloutDataSourceWithBuffer
    plugin = tmp_path / "my_source.py"
    plugin.write_text(
        "from agentrl.rollout.data import RolloutDataSource\n"
        "class Reversed(RolloutDataSource):\n"
        "    def get_samples(self, n):\n"
        "        return super().get_samples(n)[::-1]\n"
    )
    source = load_data_source(make_args(prompt_data=str(path), data_source_path=str(plugin)))
    assert type(source).__name__ == "Reversed"
    assert prompts(source.get_samples(2)) == ["question 1", "question 0"]
    bad = tmp_path / "bad_source.py"
    bad.write_text("class NotASource:\n    def __init__(self, args):\n        pass\n")
    with pytest.raises(PluginError, match="has no get_samples, add_samples"):
        load_data_source(make_args(data_source_path=str(bad)))


def test_an_env_row_the_env_cannot_prompt_from_is_reported_with_file_and_line(tmp_path, caplog):
    """Regression: a calc row without the fields calc reads became a failed, token-less sample
    that crashed the trainer; now it is a malformed row, reported like the others."""
    rows = [{"question": "What is 1 + 1?", "expression": "1 + 1", "answer": 2},
            {"text": "no question here"},
            {"question": "What is 2 + 2?", "expression": "2 + 2", "answer": 4}]
    path = write_jsonl(tmp_path / "tasks.jsonl", rows)
    with caplog.at_level(logging.WARNING):
        source = RolloutDataSource(make_args(prompt_data=str(path), env="calc", n_samples_per_prompt=1))
        groups = source.get_samples(2)
    assert [g[0].metadata["task"]["answer"] for g in groups] == [2, 4]
    (skipped,) = source.skipped_rows
    assert (skipped.file, skipped.line) == (str(path), 2)
    assert skipped.reason.startswith("not a task of --env calc: no 'question'")
    assert f"{path}:2" in caplog.text
    source.close()


def test_seeds_of_two_splits_never_coincide():
    from agentrl.rollout.data import env_seed

    train = {env_seed(7, "train", k) for k in range(5000)}
    test = {env_seed(7, "test", k) for k in range(5000)}
    assert len(train) == len(test) == 5000 and not train & test
    assert env_seed(7, "train", 0) != env_seed(8, "train", 0)


def test_a_row_too_large_for_any_context_is_skipped_unread(tmp_path, monkeypatch):
    """Regression: a single giant JSONL line went whole into memory and then into training."""
    from agentrl.rollout import _rows

    monkeypatch.setattr(_rows, "MAX_ROW_BYTES", 1 << 20)
    path = tmp_path / "d.jsonl"
    with path.open("w") as f:
        f.write(json.dumps({"prompt": "first"}) + "\n")
        f.write(json.dumps({"prompt": "x" * (3 << 20)}) + "\n")
        f.write(json.dumps({"prompt": "third"}) + "\n")
    for streaming in (False, True):
        source = RolloutDataSource(make_args(prompt_data=str(path), n_samples_per_prompt=1,
                                             streaming_data=streaming))
        assert prompts(source.get_samples(2)) == ["first", "third"]
        (skipped,) = source.skipped_rows
        assert skipped.line == 2 and "rows over 1 MiB are skipped" in skipped.reason
        source.close()


def test_a_parquet_file_that_is_not_parquet_is_named(tmp_path):
    path = tmp_path / "d.parquet"
    path.write_text('{"prompt": "not parquet"}\n')
    with pytest.raises(DataError, match="is not a readable Parquet file"):
        RolloutDataSource(make_args(prompt_data=str(path)))


def test_a_folder_as_prompt_data_is_named_as_a_folder(tmp_path):
    with pytest.raises(DataError, match="is a folder: give one .jsonl or .parquet file of it"):
        RolloutDataSource(make_args(prompt_data=str(tmp_path)))
