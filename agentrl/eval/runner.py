"""Evaluate a policy on an environment's tasks: many episodes at once, one summary.

A policy is a function ``(env, task, history) -> action``. Built in: ``oracle`` (the env's
scripted expert, :meth:`ToolEnv.oracle_action`) and ``null`` (:meth:`ToolEnv.null_action`,
which does no work). ``model`` (:func:`evaluate_model`) plays a language model served by the
embedded engine, through the same token-in/token-out episode runner that training uses.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import json
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from agentrl.env import ToolEnv, make_env
from agentrl.errors import AgentRLError
from agentrl.eval.metrics import SUCCESS_REWARD, pass_at_k

Policy = Callable[[ToolEnv, Mapping[str, Any], Sequence[Mapping[str, Any]]], Any]


def scripted_policy(name: str) -> Policy:
    """``oracle`` or ``null``.

    Raises:
        AgentRLError: Any other name (model policies need the rollout engine).
    """
    if name == "oracle":
        return lambda env, task, history: env.oracle_action(task, history)
    if name == "null":
        return lambda env, task, history: env.null_action(task, history)
    raise AgentRLError(f"unknown policy {name!r}: choose 'oracle', 'null' or 'model'")


@dataclasses.dataclass
class EpisodeRecord:
    """One evaluated episode (one line of the episodes JSONL)."""

    task_id: str
    sample: int
    reward: float
    success: bool
    terminated: bool
    truncated: bool
    turns: int
    tool_calls: int
    tool_errors: dict[str, int]
    policy_s: float
    tools_s: float
    grading_s: float
    total_s: float
    error: str | None = None
    messages: list[dict[str, Any]] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class EvalResult:
    """The summary of an evaluation (the ``--output`` JSON, episodes aside)."""

    env_id: str
    policy: str
    split: str
    n_tasks: int
    n_samples: int
    n_episodes: int
    success_rate: float
    mean_reward: float
    pass_at_k: dict[str, float]
    mean_turns: float
    tool_calls: int
    tool_errors: dict[str, int]
    failed_episodes: int
    time_per_episode_s: dict[str, float]
    wall_s: float

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


async def run_episode(
    env: ToolEnv, task: Mapping[str, Any] | None, seed: int, policy: Policy, sample: int
) -> EpisodeRecord:
    """Plays one episode to its end with ``policy``; an env failure becomes ``error``."""
    start = time.perf_counter()
    policy_s = tools_s = grading_s = 0.0
    turns = calls = 0
    errors: collections.Counter[str] = collections.Counter()
    reward, terminated, truncated = 0.0, False, False
    options = {"task": dict(task)} if task is not None else None
    task_id = str((task or {}).get("id", (task or {}).get("task_id", f"seed-{seed}")))
    try:
        _, info = await env.areset(seed=seed, options=options)
        task = info["task"]
        task_id = str(task.get("id", task.get("task_id", task_id)))
        while not (terminated or truncated):
            t0 = time.perf_counter()
            action = policy(env, task, env.messages)
            policy_s += time.perf_counter() - t0
            _, reward, terminated, truncated, info = await env.astep(action)
            turns += 1
            calls += len(info["tool_calls"])
            errors.update(info["tool_errors"])
            tools_s += info["timings"]["tools_s"]
            grading_s += info["timings"]["reward_s"]
        error = None
    except Exception as exc:  # noqa: BLE001 - one broken episode must not end the evaluation
        error = f"{type(exc).__name__}: {exc}"
        await env.aclose()
    return EpisodeRecord(
        task_id=task_id, sample=sample, reward=float(reward),
        success=error is None and reward >= SUCCESS_REWARD, terminated=terminated,
        truncated=truncated, turns=turns, tool_calls=calls, tool_errors=dict(errors),
        policy_s=policy_s, tools_s=tools_s, grading_s=grading_s,
        total_s=time.perf_counter() - start, error=error, messages=list(env.messages),
    )


async def evaluate(
    env_id: str,
    *,
    policy: str = "oracle",
    split: str = "test",
    limit: int | None = None,
    n_samples: int = 1,
    concurrency: int = 8,
    env_kwargs: Mapping[str, Any] | None = None,
) -> tuple[EvalResult, list[EpisodeRecord]]:
    """Runs ``n_samples`` episodes per task of ``split`` (the first ``limit`` tasks).

    Envs without a fixed task set are evaluated on seeds ``0 .. limit-1`` (default 100).
    ``concurrency`` env instances play at once, each one episode at a time.
    """
    if n_samples < 1 or concurrency < 1:
        raise AgentRLError("--n-samples and --concurrency must be >= 1")
    policy_fn = scripted_policy(policy)
    spec_id, tasks = _tasks(env_id, split, limit, env_kwargs)
    jobs: asyncio.Queue[tuple[int, Mapping[str, Any] | None, int]] = asyncio.Queue()
    for index, task in enumerate(tasks):
        for sample in range(n_samples):
            jobs.put_nowait((index, task, sample))
    records: list[EpisodeRecord] = []

    async def worker() -> None:
        env = make_env(env_id, **dict(env_kwargs or {}))
        try:
            while not jobs.empty():
                index, task, sample = jobs.get_nowait()
                records.append(await run_episode(env, task, index * 1000 + sample, policy_fn, sample))
        finally:
            await env.aclose()

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(min(concurrency, jobs.qsize()) or 1)))
    wall = time.perf_counter() - start
    records.sort(key=lambda r: (r.task_id, r.sample))
    return summarize(spec_id, policy, split, len(tasks), n_samples, records, wall), records


async def evaluate_model(
    env_id: str,
    *,
    hf_checkpoint: str | None = None,
    split: str = "test",
    limit: int | None = None,
    n_samples: int = 1,
    concurrency: int = 8,
    env_kwargs: Mapping[str, Any] | None = None,
    temperature: float = 1.0,
    max_response_len: int = 512,
    max_context_len: int | None = None,
    tool_call_format: str = "hermes",
) -> tuple[EvalResult, list[EpisodeRecord]]:
    """Like :func:`evaluate`, with a model as the policy: ``hf_checkpoint`` (default: the
    built-in tiny model) served by the embedded engine, episodes played by the rollout's
    episode runner (so what is evaluated is exactly what training samples)."""
    from agentrl.rollout.build import load_policy_engine, make_rollout_context
    from agentrl.rollout.config import RolloutConfig
    from agentrl.rollout.episode import Episode
    from agentrl.rollout.sample import Sample

    if n_samples < 1 or concurrency < 1:
        raise AgentRLError("--n-samples and --concurrency must be >= 1")
    config = RolloutConfig(
        env=env_id, hf_checkpoint=hf_checkpoint, rollout_temperature=temperature,
        rollout_max_response_len=max_response_len, rollout_max_context_len=max_context_len,
        rollout_concurrency=concurrency, tool_call_format=tool_call_format,
    )  # fmt: skip
    config.validate()
    spec_id, tasks = _tasks(env_id, split, limit, env_kwargs)
    engine = load_policy_engine(config)
    try:
        ctx = make_rollout_context(config, engine, engine.tokenizer, env_kwargs=env_kwargs)
        semaphore = asyncio.Semaphore(concurrency)

        async def play(index: int, task: Mapping[str, Any] | None, sample_index: int) -> EpisodeRecord:
            meta = {"task": dict(task)} if task is not None else {"seed": index * 1000 + sample_index}
            episode = Episode(ctx, Sample(group_id=index, index=sample_index, metadata=meta),
                              f"eval-{index}-{sample_index}")  # fmt: skip
            async with semaphore:
                started = time.perf_counter()
                sample = await episode.run()
            return _record(sample, episode.history, time.perf_counter() - started)

        start = time.perf_counter()
        records = list(await asyncio.gather(*(
            play(i, task, j) for i, task in enumerate(tasks) for j in range(n_samples))))
        wall = time.perf_counter() - start
    finally:
        await engine.close()
    records.sort(key=lambda r: (r.task_id, r.sample))
    label = f"model:{hf_checkpoint or 'tiny'}"
    return summarize(spec_id, label, split, len(tasks), n_samples, records, wall), records


def _record(sample: Any, history: list[dict[str, Any]], total_s: float) -> EpisodeRecord:
    """An :class:`EpisodeRecord` of a played :class:`~agentrl.Sample`."""
    meta = sample.metadata
    task = meta.get("task") or {}
    task_id = str(meta.get("task_id") or task.get("id", task.get("task_id", f"seed-{meta.get('seed')}")))
    assistant = [t for t in sample.turns if t.role == "assistant"]
    error = meta.get("error") if sample.status.value == "failed" else None
    reward = float(sample.reward or 0.0)
    return EpisodeRecord(
        task_id=task_id, sample=sample.index, reward=reward,
        success=error is None and reward >= SUCCESS_REWARD,
        terminated=meta.get("finish") == "env", truncated=sample.status.value == "truncated",
        turns=int(meta.get("turns", 0)), tool_calls=sum(len(t.tool_names) for t in assistant),
        tool_errors=dict(meta.get("tool_errors", {})),
        policy_s=sum(t.generate_s for t in assistant), tools_s=sum(t.tools_s for t in assistant),
        grading_s=sum(t.reward_s for t in assistant), total_s=total_s, error=error,
        messages=[*history, {"role": "assistant", "content": sample.response}]
        if meta.get("finish") == "env" else list(history),
    )  # fmt: skip


def _tasks(env_id: str, split: str, limit: int | None, env_kwargs: Mapping[str, Any] | None
           ) -> tuple[str, list[Mapping[str, Any] | None]]:  # fmt: skip
    """The env's registry id and the tasks of ``split``; ``None`` per task (a seed) for envs
    without a task set (``limit`` of them, default 100)."""
    probe = make_env(env_id, **dict(env_kwargs or {}))
    spec_id = probe.env_id or env_id
    try:
        tasks: list[Mapping[str, Any] | None] = list(probe.task_set(split, limit))
    except AgentRLError:
        tasks = [None] * (limit or 100)
    probe.close()
    return spec_id, tasks


def summarize(
    env_id: str, policy: str, split: str, n_tasks: int, n_samples: int,
    records: Sequence[EpisodeRecord], wall_s: float,
) -> EvalResult:
    """Aggregates episode records into an :class:`EvalResult`."""
    by_task: dict[str, list[EpisodeRecord]] = collections.defaultdict(list)
    for record in records:
        by_task[record.task_id].append(record)
    ks = sorted({1, n_samples} | {k for k in (5, 10) if k < n_samples})
    pass_k = {
        str(k): statistics.fmean(
            pass_at_k(len(group), sum(r.success for r in group), k) for group in by_task.values()
        ) if by_task else 0.0
        for k in ks
    }
    errors: collections.Counter[str] = collections.Counter()
    for record in records:
        errors.update(record.tool_errors)
    n = len(records) or 1
    return EvalResult(
        env_id=env_id, policy=policy, split=split, n_tasks=n_tasks, n_samples=n_samples,
        n_episodes=len(records),
        success_rate=sum(r.success for r in records) / n,
        mean_reward=sum(r.reward for r in records) / n,
        pass_at_k=pass_k,
        mean_turns=sum(r.turns for r in records) / n,
        tool_calls=sum(r.tool_calls for r in records),
        tool_errors=dict(sorted(errors.items())),
        failed_episodes=sum(r.error is not None for r in records),
        time_per_episode_s={
            "policy": sum(r.policy_s for r in records) / n,
            "tools": sum(r.tools_s for r in records) / n,
            "grading": sum(r.grading_s for r in records) / n,
            "total": sum(r.total_s for r in records) / n,
        },
        wall_s=wall_s,
    )


def format_table(result: EvalResult) -> str:
    """The human-readable summary printed by ``agentrl eval``."""
    t = result.time_per_episode_s
    rows = [
        ("env / policy / split", f"{result.env_id} / {result.policy} / {result.split}"),
        ("episodes", f"{result.n_episodes} ({result.n_tasks} tasks x {result.n_samples} samples)"),
        ("success rate", f"{result.success_rate:.3f}"),
        ("mean reward", f"{result.mean_reward:.3f}"),
        *((f"pass@{k}", f"{v:.3f}") for k, v in result.pass_at_k.items()),
        ("mean turns", f"{result.mean_turns:.2f}"),
        ("tool calls", str(result.tool_calls)),
        ("tool errors", ", ".join(f"{k}={v}" for k, v in result.tool_errors.items()) or "none"),
        ("failed episodes", str(result.failed_episodes)),
        ("time/episode (s)", f"policy {t['policy']:.3f}  tools {t['tools']:.3f}  "
                             f"grading {t['grading']:.3f}  total {t['total']:.3f}"),
        ("wall time (s)", f"{result.wall_s:.1f}"),
    ]
    width = max(len(name) for name, _ in rows)
    return "\n".join(f"{name.ljust(width)}  {value}" for name, value in rows)


def write_outputs(path: str | Path, result: EvalResult, records: Sequence[EpisodeRecord]) -> Path:
    """Writes the summary JSON to ``path`` and the episodes, one JSON object per line, beside
    it (``<stem>.episodes.jsonl``). Returns the episodes path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result.to_json(), indent=2) + "\n")
    episodes = path.with_name(path.stem + ".episodes.jsonl")
    with episodes.open("w") as f:
        for record in records:
            f.write(json.dumps(dataclasses.asdict(record), ensure_ascii=False, default=str) + "\n")
    return episodes
