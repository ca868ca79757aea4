"""Where a run's scalar metrics go besides ``metrics.jsonl``: TensorBoard and Weights & Biases.

Both backends are imported only when a sink is built: ``torch.utils.tensorboard`` costs seconds
to import and ``wandb`` is optional, so ``import agentrl.run.run_log`` stays light.
"""

from __future__ import annotations

import concurrent.futures
import importlib.util
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

from agentrl.errors import ConfigError

__all__ = ["MetricsSink", "TensorBoardSink", "WandbSink", "require_wandb", "scalars"]

WANDB_MODES = ("online", "offline")
WANDB_MISSING = ("--use-wandb needs the wandb package, which is not installed: pip install wandb "
                 "(or drop --use-wandb)")


class MetricsSink(Protocol):
    """A backend that records scalars against a step (the rollout id)."""

    def log(self, step: int, values: Mapping[str, float]) -> None:
        """Records ``values`` (tag -> number) at ``step`` and makes them visible to readers."""

    def close(self) -> None:
        """Flushes and releases the backend; calling it twice is harmless."""


def scalars(values: Mapping[str, Any], prefix: str = "") -> dict[str, float]:
    """The numeric entries of ``values`` as ``tag -> float``; nested mappings are flattened with
    ``/`` (``{"statuses": {"completed": 3}}`` -> ``statuses/completed``).

    Booleans become 0/1; strings, lists and ``None`` are dropped (they are not plottable).
    """
    out: dict[str, float] = {}
    for key, value in values.items():
        tag = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(scalars(value, prefix=f"{tag}/"))
        elif isinstance(value, bool | int | float):
            out[tag] = float(value)
        elif hasattr(value, "item") and getattr(value, "ndim", None) == 0:
            # 0-d numpy / torch values: metrics computed by the trainer are often these.
            item = value.item()
            if isinstance(item, bool | int | float):
                out[tag] = float(item)
    return out


class TensorBoardSink:
    """One scalar per tag in event files under ``log_dir``, flushed after every call.

    Args:
        log_dir: The folder for the event files (created if missing).

    Raises:
        ConfigError: The ``tensorboard`` package is missing; the message names
            ``--no-use-tensorboard`` and the install command.
    """

    def __init__(self, log_dir: str | Path) -> None:
        if importlib.util.find_spec("tensorboard") is None:
            raise ConfigError("TensorBoard logging needs the tensorboard package: pip install "
                              "tensorboard, or pass --no-use-tensorboard")
        self.log_dir = Path(log_dir)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        # Importing the writer (torch, tensorboard) takes seconds: it happens in a thread while
        # the run starts its other parts, and the first log() waits for it. A daemon thread,
        # never joined by close(): a signal that interrupts the main thread inside an import
        # can leave an import lock held, and the opener then waits on it forever.
        self._lock = threading.Lock()
        self._closed = False
        self._made: Any = None  # the writer, once the opener has made it (under _lock)
        self._opening: concurrent.futures.Future[None] | None = concurrent.futures.Future()
        threading.Thread(target=self._open, args=(self._opening,), daemon=True,
                         name="agentrl-tensorboard").start()
        self._writer: Any = None

    def _open(self, done: concurrent.futures.Future[None]) -> None:
        try:
            # `import torch` alone first: while another thread imports torch, this one then
            # waits holding no other import lock. Importing torch.utils.tensorboard first held
            # torch.utils' lock while waiting for torch, whose own import needs torch.utils:
            # the other thread got a half-initialised torch.utils ("cannot import name
            # 'set_module' ... circular import").
            import torch  # noqa: F401  # isort: skip
            from torch.utils.tensorboard import SummaryWriter  # isort: skip

            from tensorboard.compat import tf  # isort: skip

            tf.io  # noqa: B018 - a lazy import (tensorflow or its stub): done here, not under the lock
            with self._lock:
                if not self._closed:  # a closed sink makes no writer (nor its folder, again)
                    self._made = SummaryWriter(log_dir=str(self.log_dir))
        except BaseException as exc:  # noqa: BLE001 - handed to the first log()
            done.set_exception(exc)
        else:
            done.set_result(None)

    def _wait(self) -> None:
        opening, self._opening = self._opening, None
        if opening is not None:
            opening.result()
            self._writer = self._made

    def log(self, step: int, values: Mapping[str, float]) -> None:
        self._wait()
        if self._writer is None:
            return
        for tag, value in values.items():
            self._writer.add_scalar(tag, value, global_step=step)
        # Flush now: a run can die (OOM, preemption) long before the writer's own flush timer,
        # and a live TensorBoard should show the rollout that just finished.
        self._writer.flush()

    def close(self) -> None:
        """Closes the writer. One still being opened is not waited for: nothing was logged to
        it (log() waits), and the opener makes none after this."""
        with self._lock:
            self._closed = True
            writer, self._made, self._writer, self._opening = self._made, None, None, None
        if writer is not None:
            writer.close()


def require_wandb() -> None:
    """Raises :class:`ConfigError` naming ``--use-wandb`` if ``wandb`` cannot be imported.

    Only looks the package up (no import), so flag validation stays fast.
    """
    try:
        found = importlib.util.find_spec("wandb") is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        raise ConfigError(WANDB_MISSING)


class WandbSink:
    """Logs scalars to a Weights & Biases run whose files live under ``root``.

    Every record carries ``rollout_id`` and every metric is plotted against it, rather than
    against wandb's own step counter: that counter must strictly grow, but an eval and the
    rollout it precedes share a rollout id.

    Args:
        root: The run's output folder; wandb writes ``<root>/wandb/<run folder>``.
        project: The wandb project.
        mode: ``"offline"`` (files only; ``wandb sync`` uploads them later) or ``"online"``.
        run_name: The run's display name; wandb picks one when ``None``.
        config: Hyperparameters to record with the run (e.g. every flag).

    Raises:
        ConfigError: ``wandb`` is not installed, or ``mode`` is not one of
            :data:`WANDB_MODES`.
    """

    def __init__(self, root: str | Path, project: str = "agentrl", mode: str = "offline",
                 run_name: str | None = None,
                 config: Mapping[str, Any] | None = None) -> None:
        if mode not in WANDB_MODES:
            raise ConfigError(f"--wandb-mode must be one of {', '.join(WANDB_MODES)}, got {mode!r}")
        try:
            import wandb
        except ImportError as exc:
            raise ConfigError(WANDB_MISSING) from exc
        root = Path(root)
        root.mkdir(parents=True, exist_ok=True)
        self._run: Any = wandb.init(project=project, name=run_name, mode=mode, dir=str(root),
                                    config=dict(config or {}))
        self._run.define_metric("rollout_id")
        self._run.define_metric("*", step_metric="rollout_id")

    def log(self, step: int, values: Mapping[str, float]) -> None:
        if self._run is None:
            return
        self._run.log({**values, "rollout_id": step})

    def close(self) -> None:
        if self._run is not None:
            self._run.finish()
            self._run = None
