"""Asynchronous rollout (``--async-training``): groups play on the engines while the trainer
trains, and no trained group is more than ``--max-staleness`` weight versions old.

Versions are integers: the weights after ``t`` training iterations are version ``t``, and the
trainer trains iteration ``t`` with version ``t`` (``train.py``'s rollout id). A sample's oldest
version is that of its first trained token (:meth:`Sample.oldest_version`; versions only grow
during an episode), and its staleness when trained at ``t`` is ``t - oldest``. With ``B`` groups
per batch, ``K = --max-staleness`` and ``e`` the version the engines serve:

* **Admission is the only pacing.** A new group starts only while fewer than ``(e + K + 1) * B``
  groups were ever admitted (minus those discarded by dynamic sampling or for being too long;
  trained ones count). Nothing is aborted, dropped or restarted for being late, so long episodes
  are trained in the share they were started in.
* **Batches are earliest-deadline-first.** A group is due at ``oldest + K``. A batch takes every
  due group, waiting for one still running (the trainer waits, never the rollout), then the
  finished groups with the earliest deadlines.

Why no trained group exceeds ``K``: a group admitted while the engines serve ``e`` has
``oldest >= e``, and at most ``(v + K + 1) * B`` groups can be admitted while the engines serve
``v`` or less, so at most ``(t + 1) * B`` groups are due by iteration ``t``: exactly what
iterations ``0..t`` train. Iteration ``t`` needs ``(t + 1) * B`` admissions in all, which the
engines' version after iteration ``t - 1`` allows when ``K >= --update-weights-interval - 1``
(checked at start-up). :meth:`AsyncRollout.next_batch` checks the bound on every batch.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import itertools
import logging
from collections.abc import Mapping
from typing import Any

from agentrl.errors import DataError
from agentrl.records.sample import Sample, Status
from agentrl.rollout.ledger import GroupState, SampleLedger
from agentrl.rollout.runner import RolloutBatch, RolloutRunner, batch_metrics, group_order

__all__ = ["AsyncRollout", "StalenessError"]

log = logging.getLogger(__name__)

RID_PREFIX = "a-"
"""Request ids of the pipeline's groups: ``a-g<group id>-s<index>-t<turn>``. They hold no
rollout id, so a group keeps its ids (and its sampling seeds) across iterations and resumes."""


MAX_RESUMES = 3
"""Times a group the engine aborted is resumed before it is dropped (``rollout/aborted_groups``)."""


class StalenessError(RuntimeError):
    """A batch would hold a group older than ``--max-staleness``: a bug in the pipeline, never
    a user error (the admission bound makes it impossible)."""


@dataclasses.dataclass(eq=False)
class _Group:
    samples: list[Sample]
    admitted: int  # the engines' version when the group was admitted
    fresh: list[dict[str, Any]]  # the samples as admitted, to be played again after a restart
    task: asyncio.Task[None] | None = None
    finished: int | None = None  # completion order, once played and judged
    _final_oldest: int | None = None  # oldest(), fixed once the group is finished

    @property
    def group_id(self) -> Any:
        return self.samples[0].group_id

    def oldest(self) -> int:
        """The oldest version among the group's tokens so far (for a running group, a lower
        bound: its first tokens may still be in flight, sampled at ``admitted`` or later).
        A finished group's tokens no longer change: it is read once, not on every batch."""
        if self._final_oldest is not None:
            return self._final_oldest
        oldest = min(s.oldest_version(default=self.admitted) for s in self.samples)  # type: ignore[type-var]
        if self.finished is not None:
            self._final_oldest = oldest
        return oldest


class AsyncRollout:
    """Continuous rollout for ``--async-training`` (see the module docstring for the rules).

    Args:
        runner: Plays, scores and judges groups (custom generate, agents, dynamic sampling); its
            data source supplies the prompts.
        groups_per_batch: ``B``, ``--rollout-batch-size``.
        max_staleness: ``K``, ``--max-staleness``.
        max_judged_groups: Groups judged since the last batch after which a batch short of
            groups that passed the filter is topped up with filtered-out ones
            (``--dynamic-sampling-max-groups``, default ``8 * B``).
        submit_size: Groups fetched from the data source at a time (``--over-sampling-batch-size``).
    """

    def __init__(self, runner: RolloutRunner, *, groups_per_batch: int, max_staleness: int,
                 max_judged_groups: int | None = None, submit_size: int | None = None) -> None:
        if groups_per_batch < 1 or max_staleness < 0:
            raise ValueError(f"need groups_per_batch >= 1 and max_staleness >= 0, got "
                             f"{groups_per_batch} and {max_staleness}")
        self.runner = runner
        self.groups_per_batch = groups_per_batch
        self.max_staleness = max_staleness
        self.max_judged_groups = max(groups_per_batch, max_judged_groups or 8 * groups_per_batch)
        self.submit_size = submit_size or 1
        self._engine_version = 0
        self._live = 0  # admitted minus discarded; trained groups count
        self._trained = 0  # groups trained over the run
        self._replay: collections.deque[list[Sample]] = collections.deque()
        self._running: dict[int, _Group] = {}  # by id(), until judged
        self._ready: list[_Group] = []  # kept, waiting to be trained
        self._rejected: list[_Group] = []  # filtered out: they may top a batch up
        self._completions = itertools.count()
        self._changed = asyncio.Event()
        self._error: BaseException | None = None
        self._admission: asyncio.Task[None] | None = None
        self._exhausted = False
        self._closing = False
        self._restored = False
        self._last_batch_at = 0.0
        self._window = _Window()
        self.ledger = SampleLedger()
        """What became of every group started (saved with each checkpoint)."""

    @classmethod
    def from_runner(cls, runner: RolloutRunner, *, max_staleness: int) -> AsyncRollout:
        """With the batch shape and dynamic-sampling limits of the runner's rollout config."""
        config = runner.ctx.config
        return cls(runner, groups_per_batch=config.rollout_batch_size, max_staleness=max_staleness,
                   max_judged_groups=config.dynamic_sampling_max_groups,
                   submit_size=config.over_sampling_batch_size)

    # -- the loop's side ---------------------------------------------------------------------

    def start(self, engine_version: int = 0) -> None:
        """Starts admitting groups (after :meth:`restore`, when resuming), the engines serving
        ``engine_version``."""
        if self._admission is not None:
            raise RuntimeError("the pipeline is already started")
        if not self._restored:  # a fresh run, or one resumed from a synchronous checkpoint
            self._trained = self._live = engine_version * self.groups_per_batch
        self._engine_version = engine_version
        self._last_batch_at = asyncio.get_running_loop().time()
        self._admission = asyncio.create_task(self._admit(), name="async-rollout-admission")

    def published(self, version: int) -> None:
        """The engines now serve ``version`` (call once the weight push has returned)."""
        self._engine_version = max(self._engine_version, version)
        self._notify()

    async def next_batch(self, trainer_version: int) -> RolloutBatch:
        """``B`` groups for trainer version ``t``, earliest deadline first.

        Waits while a due group is still running, or fewer than ``B`` groups are ready. Each
        sample gets ``metadata["trainer_version"] = t``.

        Raises:
            StalenessError: A chosen group would be older than ``K`` (a pipeline bug).
            Exception: The first error of a background group (a failing plug-in, a framework
                bug), re-raised here.
        """
        t, loop = trainer_version, asyncio.get_running_loop()
        started = loop.time()
        due_waits = 0
        while True:
            self._raise_error()
            self._drop_expired_rejected(t)
            due_running = [g for g in self._running.values() if self._deadline(g) <= t]
            if due_running:
                due_waits += 1
                await self._wait()
                continue
            if len(self._ready) >= self.groups_per_batch or self._may_top_up() or (
                    self._exhausted and not self._running):
                break
            self._check_enough_fit()
            await self._wait()
        self._ready.sort(key=lambda g: (self._deadline(g), g.finished))
        chosen, self._ready = (self._ready[: self.groups_per_batch],
                               self._ready[self.groups_per_batch :])
        window, self._window = self._window, _Window()
        missing = self.groups_per_batch - len(chosen)
        if missing and self._rejected:
            log.warning("dynamic sampling: only %d of %d groups passed the filter after %d groups; "
                        "topping up with %d filtered-out groups", len(chosen),
                        self.groups_per_batch, window.judged, min(missing, len(self._rejected)))
            topped, self._rejected = self._rejected[-missing:], self._rejected[:-missing]
            chosen += topped
            self._live += len(topped)  # trained after all: counted again
            window.counts["dynamic_sampling_exhausted"] = 1
        self._check(chosen, t)
        late = [g for g in self._ready if self._deadline(g) <= t]
        if late:
            raise StalenessError(f"{len(late)} more groups are due at trainer version {t} than a "
                                 f"batch of {self.groups_per_batch} holds (group {late[0].group_id})")
        self._trained += len(chosen)
        self.ledger.trained([g.group_id for g in chosen], trainer_version=t, epoch=self._epoch())
        groups = sorted((g.samples for g in chosen), key=group_order)
        for sample in (s for g in groups for s in g):
            sample.metadata["trainer_version"] = t
        now = loop.time()
        wait_s, period_s = now - started, now - self._last_batch_at
        self._last_batch_at = now
        # rollout/wall_s (and tokens_per_s): the time the pipeline took to deliver this batch,
        # since the previous one, most of it overlapped with training
        metrics = batch_metrics(groups, window.counts, window.admitted, period_s)
        metrics.update(self._staleness_metrics(chosen, t))
        metrics.update({
            "async/trainer_wait_s": wait_s, "async/due_waits": due_waits,
            "async/admission_blocked_s": window.blocked_s,
            "async/groups_in_flight": len(self._running), "async/groups_ready": len(self._ready),
            "async/engine_version": self._engine_version,
        })
        return RolloutBatch(groups, metrics)

    def snapshot(self) -> dict[str, Any]:
        """What a checkpoint needs to resume exactly once, taken without awaiting (so it is
        consistent with the data source's state read in the same step): the count of groups
        trained, the ledger, and every group started but neither trained nor discarded
        (running, or finished and waiting), as it was when started, to be played again."""
        untrained = [g.fresh for g in (*self._running.values(), *self._ready)]
        replay = [[s.to_dict() for s in group] for group in self._replay]
        return {"trained_groups": self._trained, "groups": [*replay, *untrained],
                "ledger": self.ledger.state_dict()}

    def restore(self, state: Mapping[str, Any]) -> None:
        """Continues from :meth:`snapshot`: the untrained groups are admitted first, before any
        new prompt, so every prompt is trained exactly once across the restart."""
        if self._admission is not None:
            raise RuntimeError("restore() before start()")
        self._restored = True
        self._trained = self._live = int(state["trained_groups"])
        self.ledger.load_state_dict(state.get("ledger", {}))
        groups = [[Sample.from_dict(s) for s in group] for group in state.get("groups", [])]
        for sample in (s for g in groups for s in g):
            sample.metadata["restarted"] = sample.metadata.get("restarted", 0) + 1
        self._replay.extend(groups)

    async def aclose(self) -> None:
        """Stops admitting, aborts the pipeline's requests and cancels its groups (their
        episodes close their envs)."""
        self._closing = True
        tasks = [t for t in (self._admission, *(g.task for g in self._running.values())) if t]
        for task in tasks:
            task.cancel()
        engine = self.runner.ctx.engine
        if engine is not None:
            await engine.abort(RID_PREFIX)
        await asyncio.gather(*tasks, return_exceptions=True)
        for group in self._rejected:
            await self.runner.discard(group.samples)
        self._rejected.clear()

    # -- internals ---------------------------------------------------------------------------

    def _capacity(self) -> int:
        return (self._engine_version + self.max_staleness + 1) * self.groups_per_batch

    def _deadline(self, group: _Group) -> int:
        return group.oldest() + self.max_staleness

    def _may_top_up(self) -> bool:
        return bool(self._rejected) and self._window.judged >= self.max_judged_groups

    async def _admit(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while not self._closing:
                room = self._capacity() - self._live
                if room <= 0:
                    blocked = loop.time()
                    await self._wait()
                    self._window.blocked_s += loop.time() - blocked
                    continue
                groups = self._take(min(room, self.submit_size))
                if not groups:
                    self._exhausted = True
                    self._notify()
                    return
                for samples in groups:
                    self._launch(samples)
        except Exception as exc:  # noqa: BLE001 - the data source failed: next_batch re-raises it
            self._fail(exc)

    def _take(self, count: int) -> list[list[Sample]]:
        groups = [self._replay.popleft() for _ in range(min(count, len(self._replay)))]
        if len(groups) < count:
            groups += self.runner.data_source.get_samples(count - len(groups))
        return groups

    def _epoch(self) -> int:
        return int(getattr(self.runner.data_source, "epoch", 0))  # plug-in sources may lack it

    def _launch(self, samples: list[Sample]) -> None:
        group = _Group(samples, admitted=self._engine_version, fresh=[s.to_dict() for s in samples])
        self.ledger.admit(samples, version=self._engine_version, epoch=self._epoch())
        self._live += 1
        self._window.admitted += 1
        self._running[id(group)] = group
        group.task = asyncio.create_task(self._play(group), name=f"async-rollout-g{group.group_id}")

    async def _play(self, group: _Group) -> None:
        try:
            rid = f"{RID_PREFIX}g{group.group_id}"
            group.samples = await self.runner.play_group(group.samples, rid)
            for _ in range(MAX_RESUMES):  # aborted by the engine itself: resume, envs kept open
                if not any(s.status is Status.ABORTED for s in group.samples) or self._closing:
                    break
                group.samples = await self.runner.play_group(group.samples, rid)
            if self.runner.on_group_done is not None:
                self.runner.on_group_done(group.samples)
            if any(s.status is Status.ABORTED for s in group.samples):
                self._window.counts["aborted_groups"] += 1
                verdict = "drop"
            else:
                verdict = self.runner.judge(group.samples, self._window.counts)
        except Exception as exc:  # noqa: BLE001 - a plug-in or bug: next_batch re-raises it
            self._fail(exc)
            return
        finally:
            self._running.pop(id(group), None)
        self._window.judged += 1
        group.finished = next(self._completions)
        if verdict == "keep":
            self._ready.append(group)
            self.ledger.set_state(group.group_id, GroupState.FINISHED)
        else:
            self._live -= 1  # discarded: admission may start another in its place
            if verdict == "reject":
                self._rejected.append(group)
                self.ledger.set_state(group.group_id, GroupState.FILTERED)
            else:
                self.ledger.set_state(group.group_id, GroupState.DROPPED)
                await self.runner.discard(group.samples)
        self._notify()

    def _check_enough_fit(self) -> None:
        """Refuses to wait for ever when nearly every group is too long to train on."""
        counts, window = self._window.counts, self._window
        if (window.judged >= self.max_judged_groups and not self._rejected
                and len(self._ready) < self.groups_per_batch
                and counts["overlong_prompts"] + counts["overlong_samples"] > 0):
            raise DataError(
                f"only {len(self._ready)} of {self.groups_per_batch} groups fit the context after "
                f"{window.judged} groups: {counts['overlong_prompts']} prompts and "
                f"{counts['overlong_samples']} samples were too long; shorten the prompts, raise "
                "--rollout-max-context-len or pass --overlong-prompts cut")

    def _drop_expired_rejected(self, t: int) -> None:
        """Filtered-out groups too old to top a batch up at ``t`` are forgotten."""
        self._rejected = [g for g in self._rejected if t - g.oldest() <= self.max_staleness]

    def _check(self, chosen: list[_Group], t: int) -> None:
        for group in chosen:
            age = t - group.oldest()
            if age > self.max_staleness:
                raise StalenessError(f"group {group.group_id} is {age} versions "
                                     f"old at trainer version {t}, over --max-staleness "
                                     f"{self.max_staleness}")

    def _staleness_metrics(self, chosen: list[_Group], t: int) -> dict[str, float]:
        """``async/staleness/<k>``: samples trained ``k`` versions old (the histogram), and per
        trained token with a known version ``async/token_staleness/<k>``."""
        out: dict[str, float] = collections.Counter()
        staleness = []
        for group in chosen:
            for sample in group.samples:
                age = t - sample.oldest_version(default=group.admitted)  # type: ignore[operator]
                staleness.append(age)
                out[f"async/staleness/{age}"] += 1
                for version, mask in zip(sample.token_versions, sample.loss_mask, strict=False):
                    if mask and version >= 0:
                        out[f"async/token_staleness/{t - version}"] += 1
        out = dict(out)
        out["async/staleness_max"] = max(staleness, default=0)
        out["async/staleness_mean"] = sum(staleness) / len(staleness) if staleness else 0.0
        return out

    def _fail(self, exc: BaseException) -> None:
        if self._error is None:
            self._error = exc
        self._notify()

    def _raise_error(self) -> None:
        if self._error is not None:
            raise self._error

    def _notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    async def _wait(self) -> None:
        await self._changed.wait()


@dataclasses.dataclass
class _Window:
    """What happened between two batches."""

    counts: collections.Counter[str] = dataclasses.field(
        default_factory=lambda: collections.Counter(overlong_prompts=0, overlong_samples=0))
    admitted: int = 0
    judged: int = 0
    blocked_s: float = 0.0

