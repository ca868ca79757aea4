"""``RolloutDataSourceWithBuffer``: a data source that serves buffered groups (partial
rollouts, or what a ``--buffer-filter-path`` picks) before fresh ones; and
:func:`load_data_source`, which picks a run's data source (``--data-source-path``, else this)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from agentrl.env.factory import EnvFactory
from agentrl.errors import PluginError
from agentrl.plugins import load_plugin
from agentrl.records.sample import Sample
from agentrl.rollout._rows import as_rollout_config
from agentrl.rollout.config import RolloutConfig
from agentrl.rollout.data import RolloutDataSource, check_count

__all__ = ["RolloutDataSourceWithBuffer", "load_data_source"]


class RolloutDataSourceWithBuffer(RolloutDataSource):
    """A data source that serves buffered groups (e.g. partial rollouts) before fresh ones.

    Override :meth:`buffer_filter` in a subclass (call ``super().__init__(args)`` if you also
    override ``__init__``), or name a function ``(args, buffer, num_samples) -> groups`` with
    ``--buffer-filter-path``; a subclass's override takes precedence over the flag.
    """

    def __init__(self, args: Any, *, envs: EnvFactory | None = None, split: str = "train") -> None:
        super().__init__(args, envs=envs, split=split)
        self.buffer: list[list[Sample]] = []
        spec = self.config.buffer_filter_path
        self._filter_name = f"{type(self).__qualname__}.buffer_filter"
        self._filter_fn: Callable[..., Any] | None = None
        if spec:
            self._filter_fn = load_plugin(spec, flag="--buffer-filter-path")
            if not callable(self._filter_fn):
                raise PluginError(f"--buffer-filter-path {spec!r} is not callable")
            if type(self).buffer_filter is RolloutDataSourceWithBuffer.buffer_filter:
                self._filter_name = f"--buffer-filter-path {spec}"

    def add_samples(self, samples: list[list[Sample]]) -> None:
        """Appends groups to the buffer.

        Raises:
            TypeError: ``samples`` is not a list of non-empty lists of samples that each share
                one ``group_id``.
        """
        if not isinstance(samples, list):
            raise TypeError(f"add_samples takes a list of groups, got {type(samples).__name__}")
        for i, group in enumerate(samples):
            if not isinstance(group, list) or not group:
                raise TypeError(f"add_samples: item {i} must be a non-empty list of Samples "
                                f"(one group), got {type(group).__name__} {group!r:.60}")
            if not all(isinstance(s, Sample) for s in group):
                kinds = sorted({type(s).__name__ for s in group})
                raise TypeError(f"add_samples: group {i} holds {kinds}, not only Sample")
            ids = {s.group_id for s in group}
            if len(ids) != 1:
                raise TypeError(f"add_samples: group {i} mixes group ids {sorted(map(str, ids))};"
                                " pass one list per group")
        self.buffer.extend(samples)

    def buffer_filter(
        self, args: Any, buffer: list[list[Sample]], num_samples: int
    ) -> list[list[Sample]]:
        """Chooses up to ``num_samples`` groups of ``buffer`` to serve now (default: oldest
        first). ``buffer`` is a copy of the list, so reordering it is safe; return the group
        lists themselves (they are matched by identity and removed from the buffer)."""
        if self._filter_fn is not None:
            return self._filter_fn(args, buffer, num_samples)
        return buffer[:num_samples]

    def get_samples(self, num_samples: int) -> list[list[Sample]]:
        """Buffered groups chosen by :meth:`buffer_filter`, then fresh ones for the rest.

        Raises:
            PluginError: The filter returned more than ``num_samples`` groups, a group twice,
                or a group that was not in the buffer.
        """
        check_count(num_samples)
        groups = self._take_buffered(num_samples) if self.buffer and num_samples > 0 else []
        return groups + super().get_samples(num_samples - len(groups))

    def _take_buffered(self, num_samples: int) -> list[list[Sample]]:
        chosen = self.buffer_filter(self.args, list(self.buffer), num_samples)
        name = self._filter_name
        if not isinstance(chosen, list | tuple):
            raise PluginError(f"{name} must return a list of groups, got {type(chosen).__name__}")
        if len(chosen) > num_samples:
            raise PluginError(f"{name} returned {len(chosen)} groups; at most {num_samples} "
                              "were asked for")
        in_buffer = {id(g) for g in self.buffer}
        taken: set[int] = set()
        for group in chosen:
            if id(group) not in in_buffer:
                raise PluginError(f"{name} returned a group that is not in the buffer; return "
                                  "the buffer's own group lists, not copies or new groups")
            if id(group) in taken:
                raise PluginError(f"{name} returned the same group twice")
            taken.add(id(group))
        self.buffer = [g for g in self.buffer if id(g) not in taken]
        return list(chosen)

    def state_dict(self) -> dict[str, Any]:
        """The base state plus the buffered groups (as :meth:`Sample.to_dict`)."""
        state = super().state_dict()
        state["buffer"] = [[s.to_dict() for s in group] for group in self.buffer]
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restores position and buffer from :meth:`state_dict` data."""
        super().load_state_dict(state)
        self.buffer = [[Sample.from_dict(s) for s in group] for group in state.get("buffer", [])]


def load_data_source(config: RolloutConfig, envs: EnvFactory | None = None) -> RolloutDataSource:
    """The data source for a run: the class named by ``--data-source-path`` (built as
    ``cls(args)``, with the config as ``args``), else :class:`RolloutDataSourceWithBuffer` over
    the run's env factory.

    Raises:
        PluginError: The plug-in cannot be loaded or lacks ``get_samples``/``add_samples``.
    """
    args = config
    config = as_rollout_config(config)
    spec = config.data_source_path
    if not spec:
        return RolloutDataSourceWithBuffer(config, envs=envs)
    cls = load_plugin(spec, flag="--data-source-path")
    if not callable(cls):
        raise PluginError(f"--data-source-path {spec!r} is not a class")
    source = cls(args)
    missing = [m for m in ("get_samples", "add_samples") if not callable(getattr(source, m, None))]
    if missing:
        raise PluginError(f"--data-source-path {spec!r}: {type(source).__name__} has no "
                          f"{', '.join(missing)}; subclass agentrl.rollout.data.RolloutDataSource")
    return source
