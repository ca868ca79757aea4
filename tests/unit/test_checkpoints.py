"""Checkpoint folders: the seal (manifest of sizes), and which one ``--load`` resumes from when
some are damaged. Fake folders stand in for Megatron's files (a real save is in
tests/integration/test_megatron_actor.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agentrl.errors import ConfigError
from agentrl.run.checkpoints import (
    MANIFEST,
    PIPELINE_FILE,
    check_resumable,
    checkpoint_folder,
    checkpoint_problem,
    latest_checkpoint,
    mark_latest,
    publish_checkpoint,
)


def fake_save(root: Path, next_rollout: int, *, seal: bool = True) -> Path:
    """A checkpoint folder as train.py leaves it: trainer files, data.json, then the seal."""
    folder = checkpoint_folder(root, next_rollout)
    folder.mkdir(parents=True)
    (folder / "__0_0.distcp").write_bytes(b"w" * 64)
    (folder / ".metadata").write_bytes(b"m" * 16)
    (folder / "common.pt").write_bytes(b"c" * 8)
    (folder / "data.json").write_text(json.dumps({"epoch": 0, "offset": next_rollout}))
    if seal:
        mark_latest(root, folder)
    return folder


def truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def test_a_sealed_folder_is_complete_and_the_marker_names_it(tmp_path: Path) -> None:
    fake_save(tmp_path, 1)
    newest = fake_save(tmp_path, 2)
    assert checkpoint_problem(newest) is None
    assert latest_checkpoint(tmp_path) == newest


def test_a_truncated_trainer_file_falls_back_to_the_previous_checkpoint(
        tmp_path: Path) -> None:
    older = fake_save(tmp_path, 1)
    newest = fake_save(tmp_path, 2)
    truncate(newest / "__0_0.distcp")
    reports: list[str] = []
    assert latest_checkpoint(tmp_path, report=reports.append) == older
    assert any(str(newest) in line and "__0_0.distcp is 32 bytes, 64 when it was saved" in line
               for line in reports)
    assert any(f"using {older}, the newest complete checkpoint" in line for line in reports)


@pytest.mark.parametrize("name", [".metadata", "common.pt"])
def test_each_truncated_file_is_named(tmp_path: Path, name: str) -> None:
    folder = fake_save(tmp_path, 1)
    truncate(folder / name)
    assert checkpoint_problem(folder).startswith(f"{name} is ")


def test_a_missing_data_json_is_named(tmp_path: Path) -> None:
    folder = fake_save(tmp_path, 1)
    (folder / "data.json").unlink()
    assert checkpoint_problem(folder) == "data.json is missing"


def test_a_data_json_that_does_not_parse_is_named(tmp_path: Path) -> None:
    folder = fake_save(tmp_path, 1, seal=False)
    (folder / "data.json").write_text('{"epoch": 0, "off')  # cut short, then sealed as it was
    mark_latest(tmp_path, folder)
    assert checkpoint_problem(folder).startswith("data.json is not valid JSON")


def test_an_unsealed_folder_is_an_unfinished_save(tmp_path: Path) -> None:
    folder = fake_save(tmp_path, 1, seal=False)
    assert "no manifest.json: its save did not finish" in checkpoint_problem(folder)


def test_a_marker_naming_a_missing_folder_falls_back(tmp_path: Path) -> None:
    older = fake_save(tmp_path, 1)
    (tmp_path / "latest").write_text("rollout_00002\n")
    reports: list[str] = []
    assert latest_checkpoint(tmp_path, report=reports.append) == older
    assert "rollout_00002 is damaged and skipped: the folder does not exist" in reports[0]


def test_folders_newer_than_the_marker_are_not_candidates(tmp_path: Path) -> None:
    first = fake_save(tmp_path, 1)
    fake_save(tmp_path, 2)
    (tmp_path / "latest").write_text(first.name + "\n")  # moved back by hand, as a rewind
    assert latest_checkpoint(tmp_path) == first


def test_no_complete_checkpoint_names_every_damaged_one(tmp_path: Path) -> None:
    truncate(fake_save(tmp_path, 1) / "common.pt")
    (fake_save(tmp_path, 2) / "data.json").unlink()
    with pytest.raises(ConfigError) as exc:
        latest_checkpoint(tmp_path, report=None)
    message = str(exc.value)
    assert message.startswith(f"--load {str(tmp_path)!r}: no complete checkpoint there")
    assert "rollout_00002: data.json is missing" in message
    assert "rollout_00001: common.pt is 4 bytes" in message


def test_loading_one_damaged_folder_names_it(tmp_path: Path) -> None:
    folder = fake_save(tmp_path, 1)
    truncate(folder / "__0_0.distcp")
    with pytest.raises(ConfigError, match=r"this checkpoint is damaged: __0_0.distcp is 32"):
        latest_checkpoint(folder)


def test_a_folder_without_checkpoints_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no checkpoint there"):
        latest_checkpoint(tmp_path / "nothing")


def fake_files(folder: Path, tag: bytes = b"w") -> None:
    (folder / "__0_0.distcp").write_bytes(tag * 64)
    (folder / "common.pt").write_bytes(b"c" * 8)
    (folder / "data.json").write_text("{}")


class Killed(Exception):
    """Stands in for a SIGKILL in the middle of a save."""


def test_a_save_killed_midway_leaves_the_previous_checkpoint_usable(tmp_path: Path) -> None:
    first = publish_checkpoint(tmp_path, 1, fake_files)

    def dies_midway(folder: Path) -> None:
        (folder / "__0_0.distcp").write_bytes(b"half")
        raise Killed

    with pytest.raises(Killed):
        publish_checkpoint(tmp_path, 2, dies_midway)
    assert not checkpoint_folder(tmp_path, 2).exists()  # nothing under a checkpoint's name
    assert latest_checkpoint(tmp_path, report=None) == first
    second = publish_checkpoint(tmp_path, 2, fake_files)  # the next save clears the leftovers
    assert latest_checkpoint(tmp_path, report=None) == second
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest", "rollout_00001", "rollout_00002"]


def test_a_stale_folder_of_a_killed_save_is_replaced_not_resealed(tmp_path: Path) -> None:
    publish_checkpoint(tmp_path, 1, fake_files)
    stale = checkpoint_folder(tmp_path, 2)  # an in-place save of another version, never sealed
    stale.mkdir()
    (stale / "__1_0.distcp").write_bytes(b"old shard")
    folder = publish_checkpoint(tmp_path, 2, lambda f: fake_files(f, b"n"))
    assert not (folder / "__1_0.distcp").exists()
    assert set(json.loads((folder / MANIFEST).read_text())["files"]) == {
        "__0_0.distcp", "common.pt", "data.json"}
    assert checkpoint_problem(folder) is None


def test_an_async_checkpoint_is_not_resumed_synchronously(tmp_path: Path) -> None:
    def with_groups(folder: Path) -> None:
        fake_files(folder)
        (folder / PIPELINE_FILE).write_text(json.dumps({"trained_groups": 4, "groups": [[{}]]}))

    folder = publish_checkpoint(tmp_path, 1, with_groups)
    with pytest.raises(ConfigError, match="resume it with --async-training"):
        check_resumable(folder, async_training=False)
    check_resumable(folder, async_training=True)
    check_resumable(publish_checkpoint(tmp_path, 2, fake_files), async_training=False)
