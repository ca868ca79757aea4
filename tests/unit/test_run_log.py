"""RunLog: JSONL files, TensorBoard scalars, the wandb flags, and the dead-run warning."""

from __future__ import annotations

import json
import sys
import threading
import types
from pathlib import Path

import pytest

from agentrl.errors import ConfigError
from agentrl.run.config import RunConfig
from agentrl.run.flags import parse_args
from agentrl.run.run_log import RunLog, run_change
from agentrl.run.sinks import TensorBoardSink, scalars

ENV = ["--env", "calc"]
FLAT = {"rollout/groups": 4, "rollout/samples": 4, "rollout/zero_std_groups": 4, "rollout/reward_mean": 0.0}
LEARNING = {"rollout/groups": 4, "rollout/samples": 4, "rollout/zero_std_groups": 1, "rollout/reward_mean": 0.5}
EVAL = {"step": 2, "sets": {"calc": {"n_prompts": 3, "n_samples": 6, "mean_reward": 0.5,
                                     "statuses": {"completed": 5, "truncated": 1},
                                     "pass@1": 0.5, "pass@2": 0.75}}}


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # the default --output-dir (a new folder under runs/) is relative: keep it in this test's folder
    monkeypatch.chdir(tmp_path)


def read_scalars(log_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """``tag -> [(step, value)]`` from the event files under ``log_dir``."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(log_dir))
    events.Reload()
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)]
            for tag in events.Tags()["scalars"]}


def test_metrics_jsonl_and_tensorboard_scalars(tmp_path: Path) -> None:
    with RunLog(tmp_path) as log:
        log.metrics(0, {**LEARNING, "train/loss": 1.25, "rollout/note": "text is not plotted"})
        log.metrics(1, {**LEARNING, "rollout/reward_mean": 0.75, "train/loss": 0.5})
        # Flushed on every rollout: readable while the run is still going.
        assert read_scalars(log.tensorboard_dir)["train/loss"] == [(0, 1.25), (1, 0.5)]

    lines = [json.loads(line) for line in log.metrics_path.read_text().splitlines()]
    assert [line["rollout_id"] for line in lines] == [0, 1]
    assert lines[0]["train/loss"] == 1.25 and lines[0]["rollout/note"] == "text is not plotted"
    assert lines[1]["run/flat_rollouts_in_a_row"] == 0 and "elapsed_s" in lines[1]

    tags = read_scalars(tmp_path / "tensorboard")
    assert tags["rollout/reward_mean"] == [(0, 0.5), (1, 0.75)]
    assert tags["run/flat_rollouts_in_a_row"] == [(0, 0.0), (1, 0.0)]
    assert [step for step, _ in tags["run/elapsed_s"]] == [0, 1]
    assert "rollout/note" not in tags


def test_eval_writes_jsonl_and_scalars(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = RunLog(tmp_path)
    log.eval(2, EVAL)
    log.eval(4, {"calc": {"pass@1": 1.0}})  # the bare {set: metrics} form
    log.close()

    lines = [json.loads(line) for line in log.eval_path.read_text().splitlines()]
    assert lines == [EVAL, {"step": 4, "sets": {"calc": {"pass@1": 1.0}}}]
    tags = read_scalars(log.tensorboard_dir)
    assert tags["eval/calc/pass@1"] == [(2, 0.5), (4, 1.0)]
    assert tags["eval/calc/pass@2"] == [(2, 0.75)]
    assert tags["eval/calc/statuses/truncated"] == [(2, 1.0)]
    shown = "eval step=2 calc: n_prompts=3 n_samples=6 pass@1=0.5 mean_reward=0.5"
    assert shown in capsys.readouterr().out
    with pytest.raises(ValueError, match="step 2"):
        log.eval(3, EVAL)


def test_a_sink_closed_while_its_writer_opens_makes_no_writer_after(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Regression: close() waited for the writer's import, which a signal landing inside an
    import in the main thread can leave blocked forever on an import lock (a SIGINT during
    start-up hung the run). close() now returns while the import is still under way, and the
    opener makes no writer after it."""
    importing, made = threading.Event(), []

    class Writer:
        def __init__(self, log_dir: str) -> None:
            made.append(log_dir)

    def slow_import(name: str) -> type:  # the module's attribute, once "imported"
        importing.wait(timeout=60)
        return Writer

    module = types.ModuleType("torch.utils.tensorboard")
    module.__getattr__ = slow_import  # type: ignore[method-assign]
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", module)
    sink = TensorBoardSink(tmp_path / "tb")
    opening = sink._opening
    closing = threading.Thread(target=sink.close)
    closing.start()
    closing.join(timeout=30)
    assert not closing.is_alive()  # returned with the import still under way
    importing.set()
    assert opening is not None and opening.result(timeout=60) is None
    assert made == []


def test_no_tensorboard_writes_no_folder(tmp_path: Path) -> None:
    args = parse_args([*ENV, "--no-use-tensorboard", "--output-dir", str(tmp_path)])
    assert args.run.use_tensorboard is False
    log = RunLog.from_config(args)
    log.metrics(0, LEARNING)
    log.eval(0, EVAL["sets"])
    log.close()
    assert not (tmp_path / "tensorboard").exists()
    assert log.metrics_path.is_file() and log.eval_path.is_file()


def test_close_is_idempotent_and_later_writes_go_to_jsonl_only(tmp_path: Path) -> None:
    log = RunLog(tmp_path)
    log.metrics(0, LEARNING)
    log.close()
    log.close()
    log.metrics(1, LEARNING)
    assert len(log.metrics_path.read_text().splitlines()) == 2
    assert [step for step, _ in read_scalars(log.tensorboard_dir)["rollout/reward_mean"]] == [0]


def test_dead_run_warning_after_n_flat_rollouts_and_reset(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = RunLog(tmp_path, dead_run_rollouts=2, use_tensorboard=False)
    log.metrics(0, FLAT)
    assert "dead run" not in capsys.readouterr().err
    log.metrics(1, FLAT)
    assert "WARNING: dead run: in the last 2 rollouts" in capsys.readouterr().err
    log.metrics(2, LEARNING)  # one rollout with signal resets the count
    log.metrics(3, FLAT)
    assert "dead run" not in capsys.readouterr().err
    log.metrics(4, FLAT)
    assert "in the last 2 rollouts" in capsys.readouterr().err
    flat = [json.loads(line)["run/flat_rollouts_in_a_row"]
            for line in log.metrics_path.read_text().splitlines()]
    assert flat == [1, 2, 0, 1, 2]


def test_a_run_shorter_than_the_warning_says_so_at_its_end(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    short = RunLog(tmp_path / "short", dead_run_rollouts=3, use_tensorboard=False)
    short.metrics(0, FLAT)
    short.metrics(1, FLAT)
    assert "dead run" not in capsys.readouterr().err  # 2 < 3: not yet
    short.finish()
    assert "WARNING: dead run: in all 2 rollouts of this run" in capsys.readouterr().err
    learned = RunLog(tmp_path / "learned", dead_run_rollouts=3, use_tensorboard=False)
    learned.metrics(0, LEARNING)
    learned.metrics(1, FLAT)
    learned.finish()  # one rollout had signal: no warning
    assert "dead run" not in capsys.readouterr().err


def test_dropped_gateway_replies_are_explained_once(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = RunLog(tmp_path, use_tensorboard=False)
    log.metrics(0, {**LEARNING, "rollout/gateway/dropped_replies": 0.0})
    assert "dropped_replies" not in capsys.readouterr().err
    log.metrics(1, {**LEARNING, "rollout/gateway/dropped_replies": 3.0})
    assert "(--gateway-segments all trains every segment)" in capsys.readouterr().err
    log.metrics(2, {**LEARNING, "rollout/gateway/dropped_replies": 2.0})
    assert "dropped_replies" not in capsys.readouterr().err  # once a run
    every = RunLog(tmp_path / "all", use_tensorboard=False, gateway_segments="all")
    every.metrics(0, {**LEARNING, "rollout/gateway/dropped_replies": 3.0})
    assert "dropped_replies" not in capsys.readouterr().err  # they are trained there


def test_the_last_lines_name_the_exports_or_where_lora_adapters_are(tmp_path: Path) -> None:
    log = RunLog(tmp_path, use_tensorboard=False)
    exported = log.ending("ck", ["hf/rollout_00002"], lora=True)
    assert exported[0].endswith("checkpoints ck/ (continue with --load ck and a larger --num-rollout)")
    assert exported[1] == "exported (Hugging Face folders, --save-hf): hf/rollout_00002"
    assert exported[-1] == f"look at the run: agentrl view {tmp_path}"
    lora = log.ending("ck", [], lora=True)
    assert "the LoRA adapters are only in the checkpoints under ck/ (no --save-hf)" in lora[1]
    assert f"`agentrl export {tmp_path} --hf DIR` writes the newest" in lora[1]
    assert len(log.ending("ck", [], lora=False)) == 2


def test_dead_run_counter_survives_resume(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    first = RunLog(tmp_path, dead_run_rollouts=3, use_tensorboard=False)
    first.metrics(0, FLAT)
    # train.py checkpoints rollout 1 before recording its metrics: the saved count includes it
    saved = json.loads(json.dumps(first.counters(FLAT)))  # kept in the checkpoint as JSON
    first.metrics(1, FLAT)
    assert saved["flat_rollouts"] == first.flat_rollouts == 2
    assert "dead run" not in capsys.readouterr().err

    assert saved["elapsed_s"] > 0
    saved["elapsed_s"] += 100.0  # as if the first run had trained for 100 s more
    resumed = RunLog(tmp_path, dead_run_rollouts=3, use_tensorboard=False)  # --load, same dir
    resumed.restore(saved, 2)
    resumed.metrics(2, FLAT)  # the third flat rollout in a row, across the restart
    assert "WARNING: dead run: in the last 3 rollouts" in capsys.readouterr().err
    lines = [json.loads(line) for line in resumed.metrics_path.read_text().splitlines()]
    assert [line["run/flat_rollouts_in_a_row"] for line in lines] == [1, 2, 3]
    # the run's elapsed time goes on from the checkpoint instead of restarting at 0
    assert lines[1]["elapsed_s"] < 100.0 <= lines[2]["elapsed_s"]
    # a checkpoint saved before the counters were kept resumes with them at 0
    old = RunLog(tmp_path / "old", use_tensorboard=False)
    old.restore({}, 0)
    assert old.flat_rollouts == 0 and old.counters()["elapsed_s"] < 60


def test_a_resume_moves_the_lines_written_after_its_checkpoint_aside(tmp_path: Path) -> None:
    first = RunLog(tmp_path, use_tensorboard=False)
    for rollout_id in range(4):
        first.eval(rollout_id, {"calc": {"pass@1": 0.5}})
        first.metrics(rollout_id, LEARNING)
    with first.metrics_path.open("a") as f:
        f.write('{"rollout_id": 4, "elaps')  # a kill in the middle of a line
    resumed = RunLog(tmp_path, use_tensorboard=False)
    resumed.restore({}, 2)  # the checkpoint was saved after rollout 1
    resumed.metrics(2, LEARNING)
    ids = [json.loads(line)["rollout_id"] for line in resumed.metrics_path.read_text().splitlines()]
    assert ids == [0, 1, 2]
    steps = [json.loads(line)["step"] for line in resumed.eval_path.read_text().splitlines()]
    assert steps == [0, 1]
    moved = (tmp_path / "metrics.jsonl.superseded").read_text().splitlines()
    assert [json.loads(line)["rollout_id"] for line in moved[:2]] == [2, 3]
    assert moved[2] == '{"rollout_id": 4, "elaps'  # kept as written, not lost
    assert len((tmp_path / "eval.jsonl.superseded").read_text().splitlines()) == 2
    resumed.restore({}, 2)  # resumed again from the same checkpoint: its rollout 2 moves too
    assert len((tmp_path / "metrics.jsonl.superseded").read_text().splitlines()) == 4


def test_wandb_flags_defaults() -> None:
    run = parse_args(ENV).run
    assert (run.use_tensorboard, run.use_wandb) == (True, False)
    assert (run.wandb_project, run.wandb_mode, run.wandb_run_name) == ("agentrl", "offline", None)
    with pytest.raises(ConfigError, match="--wandb-mode"):
        RunConfig(wandb_mode="cloud").validate()


def test_wandb_missing_is_a_config_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setitem(sys.modules, "wandb", None)  # makes `import wandb` fail, installed or not
    with pytest.raises(ConfigError, match=r"--use-wandb.*pip install wandb"):
        RunLog(tmp_path / "run", use_wandb=True)
    with pytest.raises(SystemExit) as exc:  # at flag parsing, before any model is loaded
        parse_args([*ENV, "--use-wandb"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "--use-wandb" in err and "pip install wandb" in err


def test_wandb_sink_logs_against_rollout_id(monkeypatch: pytest.MonkeyPatch,
                                            tmp_path: Path) -> None:
    calls: list[tuple[str, object]] = []

    class FakeRun:
        def define_metric(self, name: str, step_metric: str | None = None) -> None:
            calls.append(("define_metric", (name, step_metric)))

        def log(self, record: dict[str, float]) -> None:
            calls.append(("log", record))

        def finish(self) -> None:
            calls.append(("finish", None))

    def init(**kwargs: object) -> FakeRun:
        calls.append(("init", kwargs))
        return FakeRun()

    monkeypatch.setitem(sys.modules, "wandb", types.SimpleNamespace(init=init))
    log = RunLog(tmp_path, use_tensorboard=False, use_wandb=True, wandb_run_name="r1",
                 wandb_config={"lr": 1e-6})
    log.metrics(3, {**LEARNING, "train/loss": 0.5})
    log.eval(3, EVAL["sets"])
    log.close()
    log.close()

    assert calls[0] == ("init", {"project": "agentrl", "name": "r1", "mode": "offline",
                                 "dir": str(tmp_path), "config": {"lr": 1e-6}})
    logged = [record for kind, record in calls if kind == "log"]
    assert logged[0]["train/loss"] == 0.5 and logged[0]["rollout_id"] == 3
    assert logged[1]["eval/calc/pass@1"] == 0.5 and logged[1]["rollout_id"] == 3
    assert [kind for kind, _ in calls].count("finish") == 1


def test_wandb_offline_run_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("wandb", reason="wandb is optional and not installed")
    monkeypatch.setenv("WANDB_SILENT", "true")
    log = RunLog(tmp_path, use_tensorboard=False, use_wandb=True, wandb_mode="offline")
    log.metrics(0, LEARNING)
    log.close()
    assert list((tmp_path / "wandb").glob("offline-run-*"))


def test_scalars_flattens_and_filters() -> None:
    assert scalars({"a": 1, "b": True, "c": "x", "d": None, "e": [1], "f": {"g": 2.5}},
                   prefix="p/") == {"p/a": 1.0, "p/b": 1.0, "p/f/g": 2.5}


def test_stage_times_go_into_the_next_metrics_line(tmp_path: Path) -> None:
    log = RunLog(tmp_path, use_tensorboard=False)
    with log.stage("train"):
        pass
    with log.stage("train"):
        pass
    with log.stage("weight_sync"):
        pass
    log.metrics(0, LEARNING)
    log.metrics(1, LEARNING)
    first, second = (json.loads(x) for x in log.metrics_path.read_text().splitlines())
    assert {"time/train_s", "time/weight_sync_s"} <= first.keys()
    assert first["time/train_s"] >= 0 and "time/train_s" not in second


def test_progress_counts_episodes_and_draws_bars(tmp_path: Path) -> None:
    import io

    from rich.console import Console

    from agentrl.records.sample import Sample
    from agentrl.run.progress import RunProgress

    screen = io.StringIO()
    progress = RunProgress(2, 4, 1, console=Console(file=screen, force_terminal=True, width=120))
    progress.rollout_started(0)
    progress.group_done([Sample(group_id=0, index=i, reward=float(i == 0)) for i in range(2)])
    assert progress.success_rate == 0.5
    progress.group_done([Sample(group_id=1, index=i, reward=1.0) for i in range(2)])
    assert progress.success_rate == 0.75
    progress.trained(0)
    progress.close()  # draws the final state
    drawn = screen.getvalue()
    assert "rollout 0 episodes" in drawn and "4/4" in drawn and "success 0.75" in drawn
    assert "train steps" in drawn and "1/2" in drawn
    quiet = RunProgress(2, 4, 1, enabled=False)
    quiet.group_done([Sample(group_id=0, index=0, reward=1.0)])
    quiet.rollout_started(1)
    assert quiet._bar is None and quiet.success_rate == 0.0


def test_the_change_compares_the_first_rollouts_with_the_last(tmp_path: Path) -> None:
    log = RunLog(tmp_path / "run", use_tensorboard=False)
    assert log.change() is None  # nothing recorded yet
    for rollout_id, success in enumerate([0.0, 0.25, 0.25, 0.5, 0.5, 0.75, 0.75]):
        log.metrics(rollout_id, {**LEARNING, "rollout/success_rate": success,
                                 "rollout/reward_mean": success})
    with log.metrics_path.open("a") as f:
        f.write('{"rollout_id": 7, "rollout/succ')  # a line a kill cut in half is left out
    # +- by hand: sqrt((1/6 * 5/6 + 2/3 * 1/3) / 12) = sqrt(0.36111 / 12) = 0.173
    assert str(log.change()).splitlines() == [
        "success on the training tasks: 0.167 in rollouts 0-2 -> 0.667 in rollouts 4-6 (+0.500 +- "
        "0.173, 12 episodes each); mean reward 0.167 -> 0.667",
        "(+- is one standard error of the change from the episode counts alone: a change within "
        "about twice it can be chance)"]
    change = run_change(log.metrics_path)  # the same numbers, for a script that reads a finished run
    assert change == log.change() and change.first == (0, 1, 2) and change.last == (4, 5, 6)
    assert change.success_after - change.success_before == pytest.approx(0.5)
    log.close()


def test_the_change_of_a_two_rollout_run_compares_one_with_one(tmp_path: Path) -> None:
    log = RunLog(tmp_path / "run", use_tensorboard=False)
    log.metrics(0, {**FLAT, "rollout/success_rate": 0.0})
    assert log.change() is None
    log.metrics(1, {**LEARNING, "rollout/success_rate": 0.5, "rollout/reward_mean": 0.5})
    # sqrt((0 + 0.5 * 0.5) / 4) = 0.25: with 4 episodes a change of 0.5 is two errors
    assert str(log.change()).splitlines()[0] == ("success on the training tasks: 0.000 in rollout 0 -> "
                                                 "0.500 in rollout 1 (+0.500 +- 0.250, 4 episodes "
                                                 "each); mean reward 0.000 -> 0.500")
    log.close()


def test_the_change_adds_held_out_success_from_the_first_and_last_evaluation(tmp_path: Path) -> None:
    log = RunLog(tmp_path / "run", use_tensorboard=False)
    for rollout_id in range(2):
        log.metrics(rollout_id, {**LEARNING, "rollout/success_rate": 0.5})
    log.eval(0, {"step": 0, "sets": {"a": {"pass@1": 0.25, "n_samples": 8}, "b": {"pass@1": 0.75, "n_samples": 8}}})
    assert log.change().heldout_steps is None  # one evaluation: nothing to compare
    log.eval(2, {"step": 2, "sets": {"a": {"pass@1": 0.5, "n_samples": 8}, "b": {"pass@1": 1.0, "n_samples": 8}}})
    change = log.change()
    assert change.heldout_steps == (0, 2) and change.heldout_episodes == 16
    assert (change.heldout_before, change.heldout_after) == (0.5, 0.75)  # the mean over the sets
    assert str(change).splitlines()[1] == ("success on held-out tasks (eval pass@1, 16 episodes each): "
                                           "0.500 at step 0 -> 0.750 at step 2 (+0.250 +- 0.165)")
    log.close()


def test_the_console_line_shows_the_async_and_gateway_figures_a_run_has(tmp_path: Path, capsys) -> None:
    log = RunLog(tmp_path / "run", use_tensorboard=False)
    log.metrics(0, {**LEARNING, "async/staleness_mean": 0.5, "async/trainer_wait_s": 1.25,
                    "rollout/gateway/dropped_replies": 2})
    line = capsys.readouterr().out.strip().splitlines()[-1]
    assert "async/staleness_mean=0.5" in line and "async/trainer_wait_s=1.25" in line
    assert "rollout/gateway/dropped_replies=2" in line
    log.close()

