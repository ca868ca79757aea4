"""One rollout: enough groups of samples for a training step, played concurrently.

Per group (one prompt, ``--n-samples-per-prompt`` samples sharing a group id) the samples are
played as episodes (or by ``--custom-generate-function-path``), scored (custom reward models
override the env's reward), and kept or dropped by the dynamic-sampling filter. Groups are
submitted ``--over-sampling-batch-size`` at a time until ``--rollout-batch-size`` groups have
passed; then the rest are stopped. With ``--partial-rollout`` the stopped groups go back to the
data source's buffer and their episodes resume, envs still open, in a later rollout; without
it they are closed and dropped (counted in the metrics).

No sample longer than the context reaches the trainer. A group whose prompt does not fit
(status ``skipped``, see :mod:`agentrl.rollout.overlong`) is dropped and another prompt is
played in its place; its row is reported once with file and line (``data_source.skip_row``)
and counted in ``rollout/overlong_prompts``. A group with a sample longer than
``--rollout-max-context-len`` (a custom generate function's own tokens) is dropped likewise,
counted in ``rollout/overlong_samples``. Evaluation keeps such groups (scored 0), so that an
eval set is played whole, and reports them the same way.

A sample whose sandbox was lost (its node died: finish ``sandbox_lost``) or whose environment
server went away (finish ``env_server_lost``) is played again from its start, in a fresh env and
sandbox, as many times as the env factory's ``sandbox_retries`` allows (3 with
``--use-fault-tolerance``, else 0); each retry is counted in ``metadata["sandbox_retries"]`` and
the sample appears once in its group.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import logging
from collections.abc import Callable, Sequence
from typing import Any

from agentrl.errors import DataError, PluginError, RolloutFailedError
from agentrl.plugins import load_plugin
from agentrl.records.sample import Sample, Status
from agentrl.rollout.custom import load_custom_generate, run_custom_generate
from agentrl.rollout.data import SkippedRow, report_skipped, row_location
from agentrl.rollout.episode import LOST_RESOURCE_FINISHES, Episode, RolloutContext
from agentrl.rollout.outcomes import outcome_metrics

__all__ = ["RolloutBatch", "RolloutRunner", "batch_metrics", "group_order"]

log = logging.getLogger(__name__)

GroupFilter = Callable[[Any, Sequence[Sample]], bool]

ATTEMPT_METADATA = ("finish", "error", "traceback", "turns", "episode_s", "tool_errors",
                    "tool_outputs_cut", "weight_versions", "messages")
"""What an episode records in ``sample.metadata`` about how it went: cleared before a sample
is played again after its sandbox was lost (its task, seed and source stay)."""


@dataclasses.dataclass
class RolloutBatch:
    """The groups of one rollout and what it took to get them.

    Attributes:
        groups: ``--rollout-batch-size`` groups (fewer only if the data ran out), each a list of
            samples sharing a group id.
        metrics: Counts and means for logging (``rollout/...`` keys).
    """

    groups: list[list[Sample]]
    metrics: dict[str, float]

    @property
    def samples(self) -> list[Sample]:
        return [s for g in self.groups for s in g]

    def check_failures(self, max_failed_fraction: float | None = None) -> None:
        """Refuses a batch with too many failed samples (nothing to learn from).

        Args:
            max_failed_fraction: The share of failed samples allowed (``--max-failed-fraction``);
                ``None``: every sample but one may fail.

        Raises:
            RolloutFailedError: Every sample failed, or more than ``max_failed_fraction`` did;
                the message names the first failure (sample, task, reason).
        """
        samples = self.samples
        failed = [s for s in samples if s.status is Status.FAILED]
        if not failed:
            return
        too_many = (len(failed) == len(samples) if max_failed_fraction is None
                    else len(failed) > max_failed_fraction * len(samples))
        if not too_many:
            return
        first = failed[0]
        limit = ("every sample" if max_failed_fraction is None
                 else f"more than --max-failed-fraction {max_failed_fraction}")
        raise RolloutFailedError(
            f"{len(failed)} of {len(samples)} samples failed ({limit}); the first, sample "
            f"{first.group_id}/{first.index} (task {first.metadata.get('task_id')}): "
            f"{first.metadata.get('error', 'no reason recorded')}")


class RolloutRunner:
    """Plays rollouts from a data source.

    Args:
        ctx: The shared context (engine, renderer, sampling, env factory, args).
        data_source: A :class:`~agentrl.rollout.data.RolloutDataSource` (``get_samples`` /
            ``add_samples``).
        custom_generate: ``async custom_generate(args, samples, evaluation)`` or ``None`` to
            play env episodes.
        group_filter: ``filter(args, group) -> bool`` or ``None`` to keep every group.
        evaluation: Passed to ``custom_generate``; eval rollouts never filter.
    """

    def __init__(
        self, ctx: RolloutContext, data_source: Any, *, custom_generate: Any = None,
        group_filter: GroupFilter | None = None, evaluation: bool = False,
    ) -> None:
        self.ctx = ctx
        self.evaluation = evaluation
        self.data_source = data_source
        self.custom_generate = custom_generate
        self.group_filter = group_filter
        self.suspended: dict[tuple[Any, int], Episode] = {}
        self.on_group_done: Callable[[list[Sample]], None] | None = None
        """Called with each group as it finishes (progress displays); kept or not."""
        self._semaphore = asyncio.Semaphore(ctx.config.rollout_concurrency)
        self._first_overlong: str | None = None  # this rollout's first group too long to train on

    @classmethod
    def from_context(cls, ctx: RolloutContext, data_source: Any, *, evaluation: bool = False
                     ) -> RolloutRunner:
        """With the plug-ins the config names (``--custom-generate-function-path``, and for
        training rollouts ``--dynamic-sampling-filter-path``)."""
        config = ctx.config
        spec = config.custom_generate_function_path
        custom = load_custom_generate(spec) if spec else None
        spec = None if evaluation else config.dynamic_sampling_filter_path
        group_filter = load_plugin(spec, flag="--dynamic-sampling-filter-path") if spec else None
        if group_filter is not None and not callable(group_filter):
            raise PluginError(f"--dynamic-sampling-filter-path {spec!r} is not callable")
        return cls(ctx, data_source, custom_generate=custom, group_filter=group_filter,
                   evaluation=evaluation)

    async def generate(
        self, rollout_id: int | str, num_groups: int | None = None, submit_size: int | None = None
    ) -> RolloutBatch:
        """Plays groups until ``num_groups`` (default ``--rollout-batch-size``) pass the filter,
        fetching ``submit_size`` (default ``--over-sampling-batch-size``) groups at a time.

        Returns:
            The batch. Failed samples are included (status ``failed``, reward 0.0): the trainer
            decides what to do with them. No sample in it is longer than the context.

        Raises:
            DataError: Too few groups fit the context to fill a training batch (the prompts
                are too long); names the first such row.
        """
        config = self.ctx.config
        target = num_groups or config.rollout_batch_size
        step = submit_size or config.over_sampling_batch_size or target
        max_groups = max(target, config.dynamic_sampling_max_groups or 8 * target)
        self.ctx.stopping.clear()
        self._first_overlong = None
        counts: collections.Counter[str] = collections.Counter(overlong_prompts=0, overlong_samples=0)
        kept: list[list[Sample]] = []
        rejected: list[list[Sample]] = []
        surplus: list[list[Sample]] = []
        pending: set[asyncio.Task[list[Sample]]] = set()
        started = asyncio.get_running_loop().time()
        try:
            submitted = await self._collect(rollout_id, target, step, max_groups, pending,
                                            kept, rejected, surplus, counts)
        except BaseException:
            # interrupted (a signal, a failing plug-in): no episode may outlive the rollout
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
            raise
        leftovers = surplus + await self._stop(pending, f"r{rollout_id}-")
        for group in leftovers:
            unfinished = any(s.status is Status.ABORTED for s in group)
            if not unfinished and not self._fits(group, counts):
                await self.discard(group)
                continue
            if unfinished:
                counts["aborted_groups"] += 1
            elif self._passes(group):
                counts["surplus_groups"] += 1
            else:
                counts["filtered_groups"] += 1
                continue
            if config.partial_rollout and not self.evaluation:
                self.data_source.add_samples([group])
                counts["groups_to_buffer"] += 1
            else:
                await self.discard(group)
        if len(kept) < target and not self.evaluation and self._first_overlong is not None:
            raise DataError(
                f"only {len(kept)} of {target} groups fit the context after {submitted} prompts: "
                f"{counts['overlong_prompts']} prompts and {counts['overlong_samples']} samples "
                f"were too long, the first {self._first_overlong}; shorten the prompts, raise "
                "--rollout-max-context-len or pass --overlong-prompts cut")
        if len(kept) < target and rejected:
            missing = target - len(kept)
            log.warning("dynamic sampling: only %d of %d groups passed the filter after %d groups; "
                        "topping up with %d filtered-out groups", len(kept), target, submitted,
                        min(missing, len(rejected)))
            kept.extend(rejected[-missing:])
            counts["dynamic_sampling_exhausted"] = 1
        # completion order is a race; group-id order makes a rollout's batch reproducible
        kept.sort(key=group_order)
        metrics = batch_metrics(kept, counts, submitted, asyncio.get_running_loop().time() - started)
        return RolloutBatch(kept, metrics)

    async def close(self) -> None:
        """Closes the envs of suspended (partial) episodes."""
        episodes, self.suspended = list(self.suspended.values()), {}
        for episode in episodes:
            await episode.close()

    # -- internals ---------------------------------------------------------------------------

    async def _collect(self, rollout_id: int | str, target: int, step: int, max_groups: int,
                       pending: set[asyncio.Task[list[Sample]]], kept: list[list[Sample]],
                       rejected: list[list[Sample]], surplus: list[list[Sample]],
                       counts: collections.Counter[str]) -> int:
        """Submits groups and sorts finished ones into ``kept`` / ``rejected`` / ``surplus``
        until ``target`` are kept (or ``max_groups`` were submitted); returns how many were
        submitted. ``pending`` is updated in place, so the caller can stop what still runs."""
        submitted = 0
        while len(kept) < target:
            while len(kept) + len(pending) < target and submitted < max_groups:
                groups = self.data_source.get_samples(min(step, max_groups - submitted))
                if not groups:
                    break
                for group in groups:
                    rid = f"r{rollout_id}-g{group[0].group_id}"
                    pending.add(asyncio.create_task(self.play_group(group, rid)))
                submitted += len(groups)
            if not pending:
                break
            done, _ = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            pending.difference_update(done)
            surplus.clear()
            for task in done:
                group = task.result()
                if self.on_group_done is not None:
                    self.on_group_done(group)
                if not self._fits(group, counts):
                    await self.discard(group)
                    continue
                if len(kept) >= target:
                    surplus.append(group)
                elif self._passes(group):
                    kept.append(group)
                else:
                    rejected.append(group)
                    counts["filtered_groups"] += 1
        return submitted

    def _fits(self, group: list[Sample], counts: collections.Counter[str]) -> bool:
        """Whether ``group`` may be trained on: no prompt too long for the context (its row is
        reported once, through the data source) and no sample longer than the context.
        Counts and reports the group otherwise; an evaluation keeps it all the same."""
        skipped = next((s for s in group if s.status is Status.SKIPPED), None)
        limit = self.ctx.max_context_len
        oversized = [s for s in group if len(s.tokens) > limit]
        if skipped is None and not oversized:
            return True
        first = skipped or oversized[0]
        file, line = row_location(first.metadata.get("source") or {})
        if skipped is not None:
            counts["overlong_prompts"] += 1
            reason = str(skipped.metadata.get("error", "the prompt does not fit the context"))
            skip_row = getattr(self.data_source, "skip_row", None)  # plug-in sources may lack it
            if callable(skip_row):
                skip_row(skipped.metadata.get("source") or {}, reason)
            else:
                report_skipped(SkippedRow(file, line, reason))
        if oversized:
            counts["overlong_samples"] += len(oversized)
            log.warning("group %s (row %s:%d) has %d samples longer than the context of %d "
                        "tokens (the longest: %d); %s", group[0].group_id, file, line,
                        len(oversized), limit, max(len(s.tokens) for s in oversized),
                        "kept for evaluation" if self.evaluation else "not trained on")
        if self._first_overlong is None:
            self._first_overlong = f"{file}:{line}"
        return self.evaluation

    def _passes(self, group: list[Sample]) -> bool:
        if self.group_filter is None:
            return True
        try:
            return bool(self.group_filter(self.ctx.args, group))
        except Exception as exc:  # a user's filter: say which, and on what
            raise PluginError(f"--dynamic-sampling-filter-path {self.ctx.config.dynamic_sampling_filter_path}: "
                              f"{type(exc).__name__}: {exc} (on group {group[0].group_id})") from exc

    def judge(self, group: list[Sample], counts: collections.Counter[str]) -> str:
        """What a training rollout does with a finished group: ``keep`` it, ``reject`` it (the
        dynamic-sampling filter said no; it may still top up a batch) or ``drop`` it (too long
        to train on, see :meth:`_fits`; its suspended episodes are closed by :meth:`discard`).
        Counts what it found in ``counts`` (``rollout/...`` metrics)."""
        if not self._fits(group, counts):
            return "drop"
        if self._passes(group):
            return "keep"
        counts["filtered_groups"] += 1
        return "reject"

    async def play_group(self, group: list[Sample], rid: str) -> list[Sample]:
        """Plays and scores one group (episodes, a black-box agent or the custom generate
        function), request ids prefixed ``rid``; samples finished earlier are left as they are,
        aborted ones resume. Returns the group (an agent's extra segments included)."""
        if self.custom_generate is not None:
            todo = [s for s in group if s.status is not Status.COMPLETED
                    and s.status is not Status.TRUNCATED and s.status is not Status.FAILED]
            if todo:
                async with self._semaphore:
                    await run_custom_generate(self.custom_generate, self.ctx, todo, rid,
                                              evaluation=self.evaluation)
            return group
        if self.ctx.agents is not None:
            played = await asyncio.gather(*(self._play_agent(s, f"{rid}-s{s.index}") for s in group))
            group = [s for samples in played for s in samples]
        else:
            await asyncio.gather(*(self._play_sample(s, f"{rid}-s{s.index}") for s in group))
        assert self.ctx.rewards is not None
        await self.ctx.rewards.apply([s for s in group if s.metadata.get("finish") != "abort"])
        return group

    async def _play_sample(self, sample: Sample, rid: str) -> None:
        if sample.status not in (Status.PENDING, Status.ABORTED):
            return  # finished in an earlier rollout (partial rollout)
        key = (sample.group_id, sample.index)
        episode = self.suspended.pop(key, None)
        if episode is None:
            if sample.status is Status.ABORTED:  # its env is gone (restart): play it afresh
                sample.metadata["restarted"] = sample.metadata.get("restarted", 0) + 1
            sample.status, sample.reward = Status.PENDING, None
            episode = Episode(self.ctx, sample, rid)
        else:
            episode.rid = rid
        async with self._semaphore:
            await episode.run()
        while self._replays_lost_resource(sample):
            retry = sample.metadata["sandbox_retries"]
            # a suffix of its own: the engine's per-episode state starts afresh, and an abort
            # of the rollout's (or the group's) prefix still reaches it
            episode = Episode(self.ctx, sample, f"{rid}-r{retry}")
            async with self._semaphore:
                await episode.run()
        if sample.status is Status.ABORTED:
            self.suspended[key] = episode

    def _replays_lost_resource(self, sample: Sample) -> bool:
        """Whether ``sample`` failed because its sandbox or env server was lost and has a retry
        left; if so it is made pending again, without what the lost attempt recorded, and the retry is
        counted in ``metadata["sandbox_retries"]``."""
        meta = sample.metadata
        retries = meta.get("sandbox_retries", 0)
        if (sample.status is not Status.FAILED or meta.get("finish") not in LOST_RESOURCE_FINISHES
                or retries >= self.ctx.sandbox_retries):
            return False
        log.warning("sample %s/%s lost what it ran on (%s); playing it again (retry %d of %d)",
                    sample.group_id, sample.index, meta.get("error"), retries + 1,
                    self.ctx.sandbox_retries)
        for name in ATTEMPT_METADATA:
            meta.pop(name, None)
        meta["sandbox_retries"] = retries + 1
        sample.status, sample.reward, sample.response = Status.PENDING, None, ""
        return True

    async def _play_agent(self, sample: Sample, rid: str) -> list[Sample]:
        """A black-box agent's episode; an unfinished one is played afresh (an agent's own
        state cannot be suspended)."""
        if sample.status not in (Status.PENDING, Status.ABORTED):
            return [sample]
        sample.status, sample.reward = Status.PENDING, None
        episode = Episode(self.ctx, sample, rid)
        async with self._semaphore:
            return await self.ctx.agents.play(episode, evaluation=self.evaluation)

    async def _stop(self, pending: set[asyncio.Task[list[Sample]]], rid_prefix: str
                    ) -> list[list[Sample]]:
        """Stops what is still running and returns those groups."""
        if not pending:
            return []
        self.ctx.stopping.set()
        if self.ctx.engine is not None:
            await self.ctx.engine.abort(rid_prefix)
        done = await asyncio.gather(*pending)
        self.ctx.stopping.clear()
        return list(done)

    async def discard(self, group: list[Sample]) -> None:
        """Closes the suspended episodes of a group that will not be played on."""
        for sample in group:
            episode = self.suspended.pop((sample.group_id, sample.index), None)
            if episode is not None:
                await episode.close()


def group_order(group: list[Sample]) -> tuple[int, int, str]:
    """Sort key: integer group ids in numeric order, then any others by their text."""
    gid = group[0].group_id
    return (0, gid, "") if isinstance(gid, int) else (1, 0, str(gid))


def batch_metrics(groups: list[list[Sample]], counts: collections.Counter[str], submitted: int,
                  wall_s: float) -> dict[str, float]:
    """A training batch's ``rollout/...`` metrics: its groups, what ``counts`` counted on the
    way (filtered, overlong, aborted groups), the groups submitted and the seconds it took."""
    samples = [s for g in groups for s in g]
    outcome = outcome_metrics(samples)  # success and reward as the evaluation counts them
    out: dict[str, float] = {
        "rollout/groups": len(groups),
        "rollout/samples": outcome["n_samples"],
        "rollout/groups_submitted": submitted,
        "rollout/wall_s": wall_s,
        "rollout/reward_mean": outcome["mean_reward"],
        "rollout/response_len_mean": outcome["mean_response_len"],
        "rollout/turns_mean": outcome["mean_turns"],
    }
    for status in ("completed", "truncated", "aborted", "failed"):
        out[f"rollout/{status}"] = outcome["statuses"].get(status, 0)
    for key, value in counts.items():
        out[f"rollout/{key}"] = value
    out["rollout/success_rate"] = outcome["success_rate"]
    out["rollout/tool_calls"] = outcome["tool_calls"]
    out["rollout/tool_errors"] = sum(outcome["tool_errors"].values())
    for kind, count in outcome["tool_errors"].items():
        out[f"rollout/tool_errors/{kind}"] = count
    for key, value in outcome.get("gateway", {}).items():  # black-box agents' sessions
        out[f"rollout/gateway/{key}"] = value
    generated = sum(sum(s.loss_mask) for s in samples)
    out["rollout/generated_tokens"] = generated
    out["rollout/tokens_per_s"] = generated / wall_s if wall_s > 0 else 0.0
    out["rollout/generate_busy_s"] = sum(t.generate_s for s in samples for t in s.turns)
    out["rollout/tools_busy_s"] = sum(t.tools_s for s in samples for t in s.turns)
    zero_std = sum(1 for g in groups if len(g) > 1 and len({s.reward for s in g}) == 1)
    out["rollout/zero_std_groups"] = zero_std
    return out
