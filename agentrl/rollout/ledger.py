"""``SampleLedger``: what became of every prompt an asynchronous run started.

One entry per group (a prompt played ``--n-samples-per-prompt`` times; group ids are unique in
a run). A prompt the data source has not served yet is *not started*: it has no entry, and the
data source's saved position says where they begin. Otherwise a group is ``in_flight`` (being
played), ``finished`` (played and kept, waiting for the trainer), ``trained`` (with the trainer
version that trained it), ``filtered`` (the dynamic-sampling filter rejected it) or ``dropped``
(too long for the context, or aborted by the engine too often). The ledger is saved in every
asynchronous checkpoint; after a restart, the groups that were in flight or finished are played
again from their prompts, and their entries count the restart.

Trained entries are kept for the current and the previous epoch of the data; older ones are
folded into per-epoch counts, so the file stays bounded however long the run.
"""

from __future__ import annotations

import collections
import dataclasses
import enum
from collections.abc import Mapping, Sequence
from typing import Any

from agentrl.records.sample import Sample
from agentrl.rollout.data import row_location

__all__ = ["GroupState", "LedgerEntry", "SampleLedger"]


class GroupState(enum.StrEnum):
    """See the module docstring."""

    IN_FLIGHT = "in_flight"
    FINISHED = "finished"
    TRAINED = "trained"
    FILTERED = "filtered"
    DROPPED = "dropped"


@dataclasses.dataclass
class LedgerEntry:
    """One group's record.

    Attributes:
        group_id: The group's id.
        row: ``file:line`` (or ``env:index``) of the prompt's row.
        epoch: The data source's epoch when the group was first started.
        state: See :class:`GroupState`.
        admitted: The engines' weight version when it was (last) started.
        trained_at: The trainer version that trained it.
        restarts: Times it was played again from its prompt after a restart of the run.
    """

    group_id: Any
    row: str
    epoch: int
    state: GroupState
    admitted: int
    trained_at: int | None = None
    restarts: int = 0


class SampleLedger:
    """The run's ledger (see the module docstring). Not thread-safe: the rollout's event loop
    owns it."""

    def __init__(self) -> None:
        self.entries: dict[str, LedgerEntry] = {}
        self.folded: collections.Counter[int] = collections.Counter()  # trained, by old epoch

    def admit(self, group: Sequence[Sample], *, version: int, epoch: int) -> None:
        key = _key(group[0].group_id)
        entry = self.entries.get(key)
        if entry is None:
            source = group[0].metadata.get("source") or {}
            file, line = row_location(source)
            self.entries[key] = LedgerEntry(group[0].group_id, f"{file}:{line}", epoch,
                                            GroupState.IN_FLIGHT, version)
            return
        if entry.state is GroupState.TRAINED:
            raise RuntimeError(f"group {entry.group_id} was trained already (at version "
                               f"{entry.trained_at}); starting it again would train it twice")
        entry.state, entry.admitted = GroupState.IN_FLIGHT, version
        entry.restarts += 1

    def set_state(self, group_id: Any, state: GroupState) -> None:
        self.entries[_key(group_id)].state = state

    def trained(self, group_ids: Sequence[Any], *, trainer_version: int, epoch: int) -> None:
        """Marks ``group_ids`` trained at ``trainer_version``; folds the trained entries of
        epochs before ``epoch - 1`` into counts."""
        for group_id in group_ids:
            entry = self.entries[_key(group_id)]
            if entry.state is GroupState.TRAINED:
                raise RuntimeError(f"group {group_id} is trained twice (versions "
                                   f"{entry.trained_at} and {trainer_version})")
            entry.state, entry.trained_at = GroupState.TRAINED, trainer_version
        for key in [k for k, e in self.entries.items()
                    if e.state is GroupState.TRAINED and e.epoch < epoch - 1]:
            self.folded[self.entries.pop(key).epoch] += 1

    def counts(self) -> dict[str, int]:
        """Entries by state (folded trained entries included)."""
        out = collections.Counter(e.state.value for e in self.entries.values())
        out["trained"] += sum(self.folded.values())
        return {state.value: out.get(state.value, 0) for state in GroupState}

    def state_dict(self) -> dict[str, Any]:
        return {"entries": [{**dataclasses.asdict(e), "state": e.state.value}
                            for e in self.entries.values()],
                "folded": {str(k): v for k, v in self.folded.items()}}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.entries = {}
        for raw in state.get("entries", []):
            entry = LedgerEntry(**{**raw, "state": GroupState(raw["state"])})
            self.entries[_key(entry.group_id)] = entry
        self.folded = collections.Counter({int(k): int(v) for k, v in state.get("folded", {}).items()})


def _key(group_id: Any) -> str:
    return f"{type(group_id).__name__}:{group_id}"
