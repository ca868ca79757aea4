"""What a run is doing right now, on the terminal: rollout episodes done / total (with the
success rate so far), train steps done / total, and the stage it is in.

Drawn with ``rich`` when stdout is a terminal; otherwise (CI logs, ``nohup``) nothing is drawn
and the per-rollout metrics line that :class:`~agentrl.run.run_log.RunLog` prints is the
record. ``--no-progress`` turns it off.
"""

from __future__ import annotations

import sys
from typing import Any

from agentrl.rollout.outcomes import succeeded

__all__ = ["RunProgress"]


class RunProgress:
    """Progress bars for one run.

    Args:
        num_rollout: Rollouts in the run.
        samples_per_rollout: Episodes one rollout plays (prompts x samples per prompt).
        steps_per_rollout: Optimizer steps per rollout.
        enabled: Draw at all (still only on a terminal).
        console: A ``rich.console.Console`` to draw on instead of stdout (drawn even if it is
            not a terminal).
    """

    def __init__(self, num_rollout: int, samples_per_rollout: int, steps_per_rollout: int,
                 enabled: bool = True, console: Any = None) -> None:
        self.samples_per_rollout = samples_per_rollout
        self.steps_per_rollout = steps_per_rollout
        self._bar: Any = None
        self._episodes_done = self._successes = 0
        if not enabled or (console is None and not sys.stdout.isatty()):
            return
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
        )

        self._bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                             TextColumn("{task.fields[note]}"), TimeElapsedColumn(),
                             console=console)
        self._episodes = self._bar.add_task("rollout", total=samples_per_rollout, note="")
        self._steps = self._bar.add_task("train steps", total=num_rollout * steps_per_rollout, note="")
        self._bar.start()

    @property
    def success_rate(self) -> float:
        """Success rate of the current rollout's finished episodes so far."""
        return self._successes / self._episodes_done if self._episodes_done else 0.0

    def rollout_started(self, rollout_id: int) -> None:
        self._episodes_done = self._successes = 0
        if self._bar is not None:
            self._bar.reset(self._episodes, total=self.samples_per_rollout,
                            description=f"rollout {rollout_id} episodes", note="")

    def group_done(self, group: list[Any]) -> None:
        """A group of episodes finished (``RolloutRunner.on_group_done``)."""
        self._episodes_done += len(group)
        self._successes += sum(succeeded(s) for s in group)
        if self._bar is not None:
            self._bar.update(self._episodes, completed=min(self._episodes_done, self.samples_per_rollout),
                             note=f"success {self.success_rate:.2f}")

    def stage(self, name: str) -> None:
        """The loop moved to stage ``name`` (train, weight sync, eval, save)."""
        if self._bar is not None:
            self._bar.update(self._steps, note=name)

    def trained(self, rollout_id: int) -> None:
        if self._bar is not None:
            self._bar.update(self._steps, completed=(rollout_id + 1) * self.steps_per_rollout, note="")

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None
