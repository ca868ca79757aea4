"""The composition root: everything a training run needs, built in one readable place from its
typed configs (:class:`~agentrl.run.config.Args`). ``train.py`` is parse, :func:`assemble`, the
loop; ``agentrl eval`` builds its policy's context with :func:`eval_context`, the same pieces.

What :func:`assemble` builds, in order (each closed in reverse order on the way out: at the end,
on an error, and on Ctrl-C / SIGTERM):

1. signal handling (:class:`~agentrl.run.interrupts.StopOnSignals`: the first signal stops the
   run cleanly and says how to continue);
2. the run log (metrics, trajectories, TensorBoard, ``run.json``);
3. the env factory, with the run's sandbox pools wherever ``--sandbox-placement`` puts them;
4. the data source (prompts read and checked before anything heavy loads);
5. the policy: the trainer (Ray ranks, or one in this process) and the engine of whichever
   backend and placement the flags ask for, both from one checkpoint;
6. weight sync from the trainer to the engine, chosen once;
7. the rollout context (chat template checked token-exact, a black-box agent's gateway), the
   ``--eval-*`` sets' envs, the runner and, with ``--async-training``, the pipeline;
8. with ``--load``: the trainer, data position, pipeline and counters restored, and the
   engine given the restored weights.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

from agentrl.engine.base import Engine
from agentrl.env.factory import EnvFactory
from agentrl.eval.runner import EvalEnvs
from agentrl.placement.cluster import ClusterConfig, TrainerGroup
from agentrl.placement.sandbox_hosts import placed_env_factory
from agentrl.rollout import RolloutRunner, load_data_source
from agentrl.rollout.build import policy_checkpoint
from agentrl.rollout.config import RolloutConfig
from agentrl.rollout.data import RolloutDataSource
from agentrl.rollout.episode import Policy, RolloutContext
from agentrl.rollout.pipeline import AsyncRollout
from agentrl.run.checkpoints import DATA_FILE, latest_checkpoint, read_pipeline_state, resume_advice
from agentrl.run.config import Args
from agentrl.run.context import make_rollout_context
from agentrl.run.interrupts import StopOnSignals
from agentrl.run.run_log import RunLog
from agentrl.run.serving import serve_policy, start_policy
from agentrl.run.weights import WeightSync, weight_sync_for
from agentrl.trainer.protocol import Trainer

__all__ = ["Run", "assemble", "eval_context"]


@dataclasses.dataclass
class Run:
    """One training run, assembled: what the loop in ``train.py`` drives.

    Attributes:
        args: The run's typed configs.
        log: The run log (metrics, trajectories, progress, the final summary).
        checkpoint: The Hugging Face folder the policy started from (``--hf-checkpoint``, or
            the built-in tiny model).
        data: The prompts, as groups (its position is saved with every checkpoint).
        trainer: The Megatron trainer (a :class:`~agentrl.placement.cluster.TrainerGroup` of Ray
            ranks, or one actor in this process).
        engine: The rollout engine.
        weights: How the trainer's weights reach the engine.
        ctx: The context every episode shares.
        evals: The ``--eval-*`` sets' envs, made once for every evaluation.
        runner: Plays groups of episodes.
        pipeline: ``--async-training``'s asynchronous rollout, else ``None``.
        save_root: Where checkpoints go (``--save``, else ``<output-dir>/checkpoints``).
        start: The first rollout to play (0, or where ``--load`` resumes).
        doing: What the run is doing now, for the message if a signal stops it; the loop sets it.
    """

    args: Args
    log: RunLog
    checkpoint: str
    data: RolloutDataSource
    trainer: Trainer
    engine: Engine
    weights: WeightSync
    ctx: RolloutContext
    evals: EvalEnvs
    runner: RolloutRunner
    pipeline: AsyncRollout | None
    save_root: str
    start: int = 0
    doing: str = "start-up"


@contextlib.asynccontextmanager
async def assemble(args: Args, argv: Sequence[str]) -> AsyncIterator[Run]:
    """Builds everything a training run needs (see the module docstring) and closes it all on
    the way out.

    Args:
        args: The run's flags, parsed and validated (:func:`~agentrl.run.flags.parse_args`).
        argv: The command line, recorded in ``run.json`` and used to say how to resume.

    Yields:
        The :class:`Run`.

    Raises:
        RunInterrupted: A SIGINT / SIGTERM stopped the run (everything was closed first).
        AgentRLError: A bad flag value, data row, plug-in or checkpoint, said plainly.
    """
    rollout, trainer_config, run_config = args.rollout, args.trainer, args.run
    save_root = trainer_config.save or f"{run_config.output_dir}/checkpoints"
    run: Run | None = None
    with StopOnSignals(describe=lambda: run.doing if run is not None else "start-up",
                       advice=lambda: resume_advice(save_root, argv), prog="train.py") as stop:
        async with contextlib.AsyncExitStack() as closing:
            log = closing.enter_context(RunLog.from_config(args))
            # every env of the run (rollouts, data, eval) shares one set of sandbox pools
            envs = placed_env_factory(rollout, args.cluster)
            if envs is not None:
                closing.push_async_callback(envs.aclose)
            data = load_data_source(rollout, envs)  # read and checked before anything heavy
            checkpoint = str(policy_checkpoint(rollout))
            log.record_launch(argv, vars(args.namespace), checkpoint)  # run.json, for agentrl view
            trainer, engine = await start_policy(args, checkpoint, closing)
            if isinstance(trainer, TrainerGroup):  # a signal to the whole process group stops Ray too
                stop.watch(trainer.ray_lost, "Ray's own processes were stopped by the same signal")
            weights = weight_sync_for(engine, trainer, run_config.weight_sync, run_config.output_dir)
            ctx = make_rollout_context(rollout, engine, envs)
            closing.push_async_callback(ctx.aclose)  # a black-box agent's gateway, if any
            evals = EvalEnvs(rollout, envs)
            closing.push_async_callback(evals.aclose)
            runner = RolloutRunner.from_context(ctx, data)
            closing.push_async_callback(runner.close)
            runner.on_group_done = log.progress.group_done
            pipeline = None
            if run_config.async_training:  # groups go on playing while the trainer trains
                pipeline = AsyncRollout.from_runner(runner, max_staleness=run_config.max_staleness)
                closing.push_async_callback(pipeline.aclose)
            run = Run(args=args, log=log, checkpoint=checkpoint, data=data, trainer=trainer,
                      engine=engine, weights=weights, ctx=ctx, evals=evals, runner=runner,
                      pipeline=pipeline, save_root=save_root)
            if trainer_config.load:
                run.start = await _resume(run, latest_checkpoint(trainer_config.load))
            if pipeline is not None:
                pipeline.start(engine_version=run.start)
            yield run


async def _resume(run: Run, folder: Path) -> int:
    """Restores the trainer, the run log's counters, the data position and the pipeline from
    ``folder``, pushes the restored weights to the engine and returns the next rollout."""
    extra = run.trainer.load_checkpoint(folder)
    start = int(extra.get("next_rollout", 0))
    run.log.restore(extra.get("run_log", {}), start)  # counters go on; later lines are redone
    run.data.load(folder / DATA_FILE)
    state = read_pipeline_state(folder)
    if run.pipeline is not None and state is not None:
        run.pipeline.restore(state)  # the groups it had started are played again first
    await run.weights.push(version=str(start))
    print(f"resumed from {folder} at rollout {start}")
    return start


async def eval_context(rollout: RolloutConfig, envs: EnvFactory | None,
                       closing: contextlib.AsyncExitStack, *,
                       agent_model: Policy | None = None) -> RolloutContext:
    """The context ``agentrl eval --policy model`` plays in: the engine started as
    :func:`assemble` starts it (in this process, no trainer), and the same rollout context.

    Args:
        rollout: The evaluation's rollout flags.
        envs: Its env factory.
        closing: Gets the engine's and the context's close.
        agent_model: With a black-box agent, a scripted policy that answers it instead of the
            engine's model.
    """
    engine = await serve_policy(rollout, ClusterConfig(use_ray=False), policy_checkpoint(rollout))
    closing.push_async_callback(engine.close)
    ctx = make_rollout_context(rollout, engine, envs, agent_model=agent_model)
    closing.push_async_callback(ctx.aclose)
    return ctx
