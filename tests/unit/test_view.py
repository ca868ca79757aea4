"""agentrl view's readers: JSON-lines indexing as files grow, path confinement, what counts as a
run or an evaluation, the episode table's filters, the group advantages and one episode's data."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from tokenizers import Tokenizer

from agentrl.algorithms.advantages import grpo_advantages as trainer_grpo
from agentrl.models.tiny import build_tiny_model
from agentrl.records.sample import Sample, Status, Turn
from agentrl.view.catalog import Catalog, ViewError, episode_view, grpo_advantages, select_rows
from agentrl.view.files import JsonlIndex, inside

pytestmark = pytest.mark.unit


def _sample(group: int, index: int, reward: float, status: Status = Status.COMPLETED,
            errors: dict[str, int] | None = None) -> Sample:
    sample = Sample(group_id=group, index=index, tokens=[1, 2, 3, 4, 5, 6], response_length=4,
                    loss_mask=[1, 1, 0, 1], rollout_log_probs=[-0.1, -2.0, 0.0, -0.5],
                    token_versions=[3, 3, -1, 4], reward=reward, status=status,
                    response="the answer is 42", weight_version="4",
                    turns=[Turn("assistant", 0, 2, tool_names=["calculator"]),
                           Turn("environment", 2, 3), Turn("assistant", 3, 4)])
    sample.metadata = {"task_id": f"task-{group}", "turns": 2, "finish": "env",
                       "tool_errors": errors or {},
                       "messages": [{"role": "user", "content": "what is 6 x 7?"},
                                    {"role": "assistant", "content": "",
                                     "tool_calls": [{"name": "calculator", "arguments": {"x": "6*7"}}]},
                                    {"role": "tool", "content": "42 [... 10 characters of output cut]"}],
                       "cut_messages": [{"message": 2, "original_chars": 40, "shown_chars": 30}],
                       "grade": {"answer": 42, "expected": 42},
                       "commands": [{"phase": "tools", "turn": 1, "kind": "exec", "command": "echo 42",
                                     "exit_code": 0, "duration_s": 0.01, "output": "42\n"}]}
    return sample


def _run(folder: Path, rollouts: dict[int, list[Sample]], metrics: int = 3) -> Path:
    (folder / "trajectories").mkdir(parents=True)
    for rollout_id, samples in rollouts.items():
        (folder / "trajectories" / f"rollout_{rollout_id:05d}.jsonl").write_text(
            "".join(s.to_json() + "\n" for s in samples))
    (folder / "metrics.jsonl").write_text("".join(
        json.dumps({"rollout_id": i, "rollout/reward_mean": i / 10}) + "\n" for i in range(metrics)))
    (folder / "run.json").write_text(json.dumps({"launches": [{
        "argv": ["--env", "calc"], "flags": {"advantage_estimator": "grpo"}, "policy_dir": None}]}))
    return folder


def test_the_index_reads_only_complete_lines_and_picks_up_what_is_appended(tmp_path):
    path = tmp_path / "m.jsonl"
    index = JsonlIndex(path)
    assert index.refresh() == 0  # not written yet
    path.write_text('{"a": 1}\n{"a": 2}\n{"a": ')  # the third line is still being written
    assert index.refresh() == 2
    assert [line.value for line in index.lines()] == [{"a": 1}, {"a": 2}]
    with path.open("a") as f:
        f.write('3}\n\n{"a": 4}\n')
    assert index.refresh() == 4  # the blank line is no record
    assert index.line(3).value == {"a": 4} and index.line(2).value == {"a": 3}


def test_the_index_starts_over_when_the_file_is_replaced(tmp_path):
    path = tmp_path / "m.jsonl"
    path.write_text('{"a": 1}\n{"a": 2}\n{"a": 3}\n')
    index = JsonlIndex(path)
    assert index.refresh() == 3
    staging = tmp_path / "m.tmp"
    staging.write_text('{"b": 1}\n')
    staging.replace(path)  # as a resumed run moves its superseded lines aside
    assert index.refresh() == 1 and index.line(0).value == {"b": 1}


def test_a_malformed_line_carries_its_number_and_reason(tmp_path):
    path = tmp_path / "m.jsonl"
    path.write_text('{"a": 1}\nnot json\n[1, 2]\n')
    index = JsonlIndex(path)
    index.refresh()
    lines = index.lines()
    assert lines[0].error is None
    assert lines[1].number == 2 and "not JSON" in lines[1].error
    assert lines[2].number == 3 and "not an object" in lines[2].error


def test_inside_refuses_dotdot_absolute_paths_and_symlinks_out(tmp_path):
    root = tmp_path / "root"
    (root / "sub").mkdir(parents=True)
    (root / "sub" / "f.txt").write_text("x")
    (tmp_path / "secret.txt").write_text("s")
    os.symlink(tmp_path / "secret.txt", root / "link.txt")
    os.symlink(root / "sub" / "f.txt", root / "inner-link.txt")
    assert inside(root, "sub/f.txt") == (root / "sub" / "f.txt").resolve()
    assert inside(root, "inner-link.txt") == (root / "sub" / "f.txt").resolve()
    assert inside(root, "../secret.txt") is None
    assert inside(root, "sub/../../secret.txt") is None
    assert inside(root, str(tmp_path / "secret.txt")) is None
    assert inside(root, "link.txt") is None
    assert inside(root, "missing.txt") is None


def test_the_catalog_finds_runs_and_evals_in_a_folder(tmp_path):
    _run(tmp_path / "runs" / "a", {0: [_sample(0, 0, 1.0)]})
    _run(tmp_path / "runs" / "b", {0: [_sample(0, 0, 0.0)]})
    (tmp_path / "evals").mkdir()
    (tmp_path / "evals" / "calc.json").write_text(json.dumps({"policy": "oracle", "sets": {}}))
    (tmp_path / "evals" / "other.json").write_text(json.dumps({"unrelated": True}))
    found = Catalog(tmp_path).targets()
    assert found == [{"id": "evals/calc.json", "kind": "eval", "title": "evals/calc.json"},
                     {"id": "runs/a", "kind": "run", "title": "runs/a"},
                     {"id": "runs/b", "kind": "run", "title": "runs/b"}]
    assert Catalog(tmp_path / "runs" / "a").targets()[0]["id"] == "."
    only = Catalog(tmp_path / "evals" / "calc.json")
    assert only.targets() == [{"id": "calc.json", "kind": "eval", "title": "calc.json"}]


def test_a_path_that_is_neither_a_run_nor_an_eval_is_refused_with_what_was_expected(tmp_path):
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(ViewError, match="neither a run"):
        Catalog(tmp_path)
    with pytest.raises(ViewError, match="not an `agentrl eval --output` file"):
        Catalog(tmp_path / "notes.txt")
    with pytest.raises(ViewError, match="no such file or folder"):
        Catalog(tmp_path / "missing")


def test_the_catalog_serves_only_the_targets_it_found(tmp_path):
    _run(tmp_path / "a", {0: [_sample(0, 0, 1.0)]})
    catalog = Catalog(tmp_path)
    with pytest.raises(ViewError, match="no run"):
        catalog.reader("../", "run")
    with pytest.raises(ViewError, match="no run"):
        catalog.reader("a/trajectories", "run")
    with pytest.raises(ViewError, match="has no trajectories/../run.json"):
        catalog.reader("a", "run").rows("../run.json")


def test_rows_filter_sort_and_page(tmp_path):
    samples = [_sample(0, 0, 1.0), _sample(0, 1, 0.0, Status.TRUNCATED, {"parse_error": 2}),
               _sample(1, 0, 0.5), _sample(1, 1, 0.0, Status.FAILED, {"timeout": 1})]
    samples[2].response = "a needle in the text"
    reader = Catalog(_run(tmp_path / "r", {0: samples})).reader(".", "run")
    rows = reader.rows("rollout_00000.jsonl")
    assert select_rows(rows, {"status": "truncated"})["matched"] == 1
    assert [r["line"] for r in select_rows(rows, {"error": "timeout"})["rows"]] == [4]
    assert [r["line"] for r in select_rows(rows, {"q": "NEEDLE"})["rows"]] == [3]
    assert [r["line"] for r in select_rows(rows, {"min_reward": "0.4"})["rows"]] == [1, 3]
    assert [r["reward"] for r in select_rows(rows, {"sort": "reward", "desc": "1"})["rows"]][:2] == [1.0, 0.5]
    page = select_rows(rows, {"limit": "2", "offset": "2"})
    assert [r["line"] for r in page["rows"]] == [3, 4] and page["matched"] == 4
    assert page["statuses"] == ["completed", "failed", "truncated"]
    assert page["error_kinds"] == ["parse_error", "timeout"]
    assert all("search" not in r for r in page["rows"])
    with pytest.raises(ViewError, match="not a number"):
        select_rows(rows, {"min_reward": "high"})
    with pytest.raises(ViewError, match="cannot sort"):
        select_rows(rows, {"sort": "__class__"})


def test_a_malformed_trajectory_line_is_a_row_that_says_so(tmp_path):
    folder = _run(tmp_path / "r", {0: [_sample(0, 0, 1.0)]})
    with (folder / "trajectories" / "rollout_00000.jsonl").open("a") as f:
        f.write("{broken\n")
    (folder / "metrics.jsonl").open("a").write("oops\n")
    reader = Catalog(folder).reader(".", "run")
    rows = reader.rows("rollout_00000.jsonl")
    assert rows[1]["status"] == "malformed" and rows[1]["line"] == 2
    assert any("metrics.jsonl line 4" in p for p in reader.overview()["problems"])
    with pytest.raises(ViewError, match="line 2: not JSON"):
        reader.sample("rollout_00000.jsonl", 2)


def test_group_advantages_are_the_trainers_grpo_advantages():
    rewards = [1.0, 0.0, 0.0, 1.0, 0.5]
    expected = trainer_grpo(torch.tensor(rewards), [0] * 5).tolist()
    assert grpo_advantages(rewards) == pytest.approx(expected, abs=1e-6)
    # by hand: [1, 0] has mean 0.5 and unbiased std sqrt(0.5), so 0.5 / sqrt(0.5) = 0.7071
    assert grpo_advantages([1.0, 0.0]) == pytest.approx([0.7071063, -0.7071063], abs=1e-6)
    assert grpo_advantages([1.0, 0.0], std_normalize=False) == [0.5, -0.5]
    assert grpo_advantages([1.0]) == [0.0] and grpo_advantages([0.3, 0.3]) == [0.0, 0.0]
    assert grpo_advantages([1.0, None, 0.0])[1] is None


def test_rows_of_a_run_carry_their_groups_advantages(tmp_path):
    reader = Catalog(_run(tmp_path / "r", {0: [_sample(0, 0, 1.0), _sample(0, 1, 0.0)]})).reader(".", "run")
    advantages = [r["advantage"] for r in reader.rows("rollout_00000.jsonl")]
    assert advantages == pytest.approx([0.7071063, -0.7071063], abs=1e-6)


def test_an_episode_view_holds_the_samples_tokens_mask_and_records():
    sample = _sample(0, 0, 1.0)
    view = episode_view(sample.to_dict(), policy_dir=None)
    tokens = view["tokens"]
    assert tokens["prompt_length"] == 2 and len(tokens["pieces"]) == 6
    assert tokens["pieces"][0] == "⟨1⟩" and "no tokenizer" in tokens["note"]
    assert tokens["mask"] == [1, 1, 0, 1] and tokens["versions"] == [3, 3, -1, 4]
    assert tokens["turn_starts"] == [0, 2, 3]
    assert view["grade"] == {"answer": 42, "expected": 42}
    assert view["commands"][0]["command"] == "echo 42"
    assert view["cut_messages"] == [{"message": 2, "original_chars": 40, "shown_chars": 30}]
    assert view["header"]["status"] == "completed" and view["header"]["weight_version"] == "4"
    assert view["header"]["gateway"] is None  # not an agent's episode
    sample.metadata["gateway"] = {"calls": 3, "segments": 2, "rewrites": 1, "replies": 3,
                                  "dropped_replies": 2}
    assert episode_view(sample.to_dict(), policy_dir=None)["header"]["gateway"]["dropped_replies"] == 2


def test_tokens_are_decoded_one_by_one_with_the_policys_tokenizer():
    folder = str(build_tiny_model())
    tokenizer = Tokenizer.from_file(f"{folder}/tokenizer.json")
    ids = tokenizer.encode("Answer: 42").ids
    sample = Sample(group_id=0, tokens=ids, response_length=len(ids), loss_mask=[1] * len(ids),
                    rollout_log_probs=[0.0] * len(ids))
    view = episode_view(sample.to_dict(), policy_dir=folder)
    assert "".join(view["tokens"]["pieces"]) == "Answer: 42" and view["tokens"]["note"] is None
    assert len(view["tokens"]["pieces"]) == len(ids)


def test_an_eval_episode_written_by_agentrl_eval_opens_with_its_tokens(tmp_path):
    from agentrl.eval.runner import write_episodes

    (tmp_path / "model.json").write_text(json.dumps({"policy": "model:tiny", "sets": {
        "calc": {"n_prompts": 1, "n_samples": 2, "pass@1": 0.5}}, "policy_dir": None}))
    write_episodes(tmp_path / "model.episodes.jsonl", [[_sample(0, 0, 1.0), _sample(0, 1, 0.0, Status.TRUNCATED)]])
    reader = Catalog(tmp_path / "model.episodes.jsonl").reader("model.json", "eval")
    assert reader.overview()["summary"]["sets"]["calc"]["pass@1"] == 0.5
    rows = reader.rows()
    assert [(r["status"], r["reward"], r["length"]) for r in rows] == [("completed", 1.0, 6), ("truncated", 0.0, 6)]
    view = reader.sample(1)
    assert view["tokens"]["mask"] == [1, 1, 0, 1] and len(view["tokens"]["pieces"]) == 6
    assert view["grade"] == {"answer": 42, "expected": 42} and view["commands"][0]["kind"] == "exec"
    assert view["turns"][1]["role"] == "environment"
