"""``Trainer``: what the training loop and the weight sync need from a trainer (every method
either calls).

Two classes satisfy it: :class:`~agentrl.trainer.actor.MegatronActor` (one rank, in this
process) and :class:`~agentrl.placement.cluster.TrainerGroup` (every rank as a Ray actor,
each call run on all of them, rank 0's answer returned). Code written against ``Trainer`` works
with either. This module imports neither (nor torch), so annotating with it costs nothing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from agentrl.records.sample import Sample

__all__ = ["Trainer"]


@runtime_checkable
class Trainer(Protocol):
    """The policy's trainer, as ``train.py`` and :mod:`agentrl.run.weights`
    use it. Every method is a collective over the trainer's ranks."""

    def train(self, samples: Sequence[Sample]) -> dict[str, float]:
        """One rollout's training (``--num-steps-per-rollout`` optimizer steps).

        Args:
            samples: The rollout's samples, every group complete.

        Returns:
            Metrics averaged over the steps (plain floats).
        """

    def save_checkpoint(self, directory: str | Path,
                        extra: Mapping[str, Any] | None = None) -> None:
        """Saves model, optimizer, schedule, step and RNG states under ``directory``, with
        ``extra`` (JSON-able) kept beside them."""

    def load_checkpoint(self, directory: str | Path) -> dict[str, Any]:
        """Restores what :meth:`save_checkpoint` saved; returns its ``extra``."""

    def save_hf(self, out_dir: str | Path, tokenizer_dir: str | Path | None = None) -> Path:
        """Writes the policy as a Hugging Face model directory; returns it."""

    def save_adapter(self, out_dir: str | Path, base_model: str | None = None) -> Path:
        """Writes the policy's LoRA adapters alone in PEFT's format (``--weight-sync adapter``,
        exports), recording ``base_model`` as their base (default: the folder the run started
        from); returns the folder."""

    def hf_state_dict(self) -> dict[str, Any]:
        """The policy's weights under Hugging Face names (``--weight-sync tensor``)."""

    def hf_state_dict_ref(self) -> Any | None:
        """Rank 0's :meth:`hf_state_dict` left in Ray's object store, as a reference engine
        actors read without a copy through the driver; ``None`` where the trainer has no object
        store (one rank in this process)."""

    def rank0_address(self) -> tuple[str, int]:
        """Rank 0's host and a free port there: the rendezvous of a weight-broadcast group."""

    def open_weight_group(self, master_address: str, master_port: int, world_size: int,
                          group_name: str, backend: str) -> None:
        """Joins a weight-broadcast group with inference servers (``--weight-sync
        broadcast``); blocks until every server has joined."""

    def weight_metadata(self) -> dict[str, list[Any]]:
        """Names, dtypes and shapes of :meth:`hf_state_dict`, in broadcast order."""

    def broadcast_weights(self) -> None:
        """Broadcasts the weights over the group :meth:`open_weight_group` joined."""
