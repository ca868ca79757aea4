"""The eval sets' envs over a run's evaluations (:class:`agentrl.eval.runner.EvalEnvs`): one
factory per eval env, made once and reused, its sandbox pools and MCP servers closed when the run
closes it; an evaluation without the run's one closes what it made itself. Either way nothing is
left behind: no open sandbox pool, no sandbox workspace, no process."""

from __future__ import annotations

import asyncio
import dataclasses
import os

import psutil
import pytest

from agentrl import register_env
from agentrl.env import registry
from agentrl.eval.runner import EvalEnvs, run_evaluation
from agentrl.rollout.config import RolloutConfig
from agentrl.rollout.episode import RolloutContext
from agentrl.sandbox import SandboxPools
from agentrl.sandbox._procs import sandbox_root
from tests.support.mcp_envs import missing, sdk_server
from tests.support.sandbox_env_ids import run_then_answer
from tests.unit.test_rollout_episode import make_ctx

EVAL_ENV = "eval-exec-mcp-v0"
EVALUATIONS = 3


@pytest.fixture
def eval_env(monkeypatch):
    reason = missing("mcp")
    if reason:
        pytest.skip(reason)
    # imported when the test runs, not at collection (the module registers its envs, and the
    # tests parametrized over every registered env must see the built-in ones only), and before
    # the registry is copied, as a test that names it by "tests.support.sandbox_envs:..." would
    from tests.support.sandbox_envs import SandboxExecEnv

    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))

    class ExecWithServerEnv(SandboxExecEnv):
        """``sandbox-exec``'s tasks in process sandboxes, with an MCP server the run shares
        (``lifetime="run"``): a process that whoever made the env factory must stop."""

        mcp_servers = (sdk_server(lifetime="run"),)

    register_env(EVAL_ENV, entry_point=ExecWithServerEnv)


@pytest.fixture
def made_pools(monkeypatch) -> list[SandboxPools]:
    """Every :class:`SandboxPools` made during the test."""
    made: list[SandboxPools] = []
    init = SandboxPools.__init__

    def recording(self: SandboxPools, *args: object, **kwargs: object) -> None:
        init(self, *args, **kwargs)  # type: ignore[arg-type]
        made.append(self)

    monkeypatch.setattr(SandboxPools, "__init__", recording)
    return made


def run_context(run_env: str | None) -> RolloutContext:
    """A run on ``run_env`` (``None``: single-turn training prompts) that evaluates
    :data:`EVAL_ENV`, scripted to solve its tasks."""
    ctx = make_ctx(run_then_answer, env=run_env)
    config = RolloutConfig(env=run_env, max_turns=3, eval_env=[EVAL_ENV], eval_max_prompts=2)
    return dataclasses.replace(ctx, config=config)


def children() -> set[int]:
    """This process's live descendants (zombies are reaped, not left running)."""
    procs = psutil.Process().children(recursive=True)
    return {p.pid for p in procs if p.is_running() and p.status() != psutil.STATUS_ZOMBIE}


def workspaces() -> set[str]:
    """This process's sandbox workspaces."""
    root = sandbox_root()
    mine = f"ws-{os.getpid()}-"
    return {n for n in os.listdir(root) if n.startswith(mine)} if os.path.isdir(root) else set()


def assert_solved(results: list[dict]) -> None:
    for step, result in enumerate(results):
        metrics = result["sets"][EVAL_ENV]
        assert result["step"] == step and metrics["n_samples"] == 2, metrics
        assert metrics["success_rate"] == 1.0 and metrics["failed"] == 0, metrics


@pytest.mark.parametrize("run_env", [None, "calc"], ids=["no-env", "env-calc"])
def test_a_runs_evaluations_share_one_env_factory_and_leave_nothing_behind(eval_env, made_pools, run_env):
    """Without ``--env`` the eval env's factory is made here, with its pools and MCP server, and
    closed with the :class:`EvalEnvs`; with one it is derived from the run's factory, whose
    pools and MCP server the run closes."""
    before, own_workspaces = children(), workspaces()
    ctx = run_context(run_env)

    async def run() -> list[dict]:
        evals = EvalEnvs(ctx.config, ctx.envs)  # as a run makes it: once, closed at its end
        try:
            results = []
            factory = evals.factory(EVAL_ENV)
            for step in range(EVALUATIONS):
                results.append(await run_evaluation(ctx, step, evals))
                assert evals.factory(EVAL_ENV) is factory  # the same factory every evaluation
                assert len(children() - before) == 1  # one MCP server, the run's, still up
            assert len(made_pools) == 1 and len(made_pools[0]) == 1  # one set of pools, one pool
        finally:
            await evals.aclose()
            if ctx.envs is not None:  # the run's own factory: the run closes it after
                assert len(made_pools[0]) == 1 and len(children() - before) == 1
                await ctx.envs.aclose()
        assert len(made_pools[0]) == 0  # every pool closed, in the loop that used it
        return results

    assert_solved(asyncio.run(run()))
    assert children() == before and workspaces() == own_workspaces


def test_an_evaluation_without_the_runs_eval_envs_closes_what_it_made(eval_env, made_pools):
    """``run_evaluation(ctx, step)`` alone: each evaluation makes its own factory (pools, MCP
    server) and closes it before it returns."""
    before, own_workspaces = children(), workspaces()
    ctx = run_context(None)

    async def run() -> list[dict]:
        results = []
        for step in range(EVALUATIONS):
            results.append(await run_evaluation(ctx, step))
            assert children() == before and [len(p) for p in made_pools] == [0] * (step + 1)
        return results

    assert_solved(asyncio.run(run()))
    assert workspaces() == own_workspaces
