"""agentrl's training loop: rollout -> advantages -> Megatron step -> weight sync, repeated.

    python train.py --env calc --max-turns 3 --num-rollout 3
    python train.py --custom-generate-function-path examples/custom_generate.py --env calc \
        --prompt-data tasks.jsonl --max-turns 5

Every flag (``python train.py --help``) belongs to one typed config: ``RolloutConfig``
(agentrl.rollout), ``TrainerConfig`` (agentrl.trainer), ``RunConfig`` (agentrl.run.config) or
``ClusterConfig`` (agentrl.placement.cluster).
The trainer's ranks run as Ray actors (``--actor-num-nodes`` x ``--actor-num-gpus-per-node``,
CPU processes on a machine without GPUs; ``--no-use-ray`` keeps one rank in this process); the
embedded engine serves rollouts in this process.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import sys
from pathlib import Path
from typing import Any

from agentrl.errors import AgentRLError, RunInterrupted
from agentrl.eval.runner import EvalEnvs, run_evaluation
from agentrl.placement.cluster import TrainerGroup
from agentrl.placement.sandbox_hosts import placed_env_factory
from agentrl.rollout import RolloutRunner, load_data_source
from agentrl.rollout.build import policy_checkpoint
from agentrl.rollout.demonstrations import DemoBatch, demonstrations
from agentrl.rollout.pipeline import AsyncRollout
from agentrl.run.checkpoints import (
    DATA_FILE,
    PIPELINE_FILE,
    latest_checkpoint,
    nothing_left,
    publish_checkpoint,
    read_pipeline_state,
    resume_advice,
)
from agentrl.run.context import make_rollout_context
from agentrl.run.export import export_hf
from agentrl.run.flags import parse_args
from agentrl.run.interrupts import StopOnSignals
from agentrl.run.run_log import RunLog
from agentrl.run.serving import start_policy
from agentrl.run.weights import weight_sync_for


async def main(argv: list[str]) -> None:
    args = parse_args(argv)
    rollout, trainer, run = args.rollout, args.trainer, args.run
    if args.embedded is not None:  # its env settings and flag defaults differ from the env's own: say so
        print(args.embedded.announcement(rollout.env_kwargs), flush=True)
    if (done := nothing_left(trainer.load, run.num_rollout)) is not None:
        print(f"train.py: {done}")  # before Ray, the model or the data are touched
        return
    save_root = trainer.save or f"{run.output_dir}/checkpoints"
    where = ["start-up"]  # what the run is doing, for the message if a signal stops it
    # Everything opened below is closed in reverse order on the way out: at the end, on an
    # error, and on Ctrl-C / SIGTERM (StopOnSignals turns the first into a clean stop).
    with StopOnSignals(describe=lambda: where[0], advice=lambda: resume_advice(save_root, argv),
                       prog="train.py") as stop:
        async with contextlib.AsyncExitStack() as closing:
            log = closing.enter_context(RunLog.from_config(args))
            envs = placed_env_factory(rollout, args.cluster)  # every env of the run: rollouts, data, eval (one sandbox pool)
            if envs is not None:
                closing.push_async_callback(envs.aclose)
            data = load_data_source(rollout, envs)  # the prompts: read and checked before anything heavy

            # the policy: trained with Megatron (Ray ranks, or this process), served by the engine
            checkpoint = policy_checkpoint(rollout)  # --hf-checkpoint, or the built-in tiny model
            log.record_launch(argv, vars(args.namespace), checkpoint)  # run.json: what ran, for agentrl view
            actor, engine = await start_policy(args, checkpoint, closing)
            if isinstance(actor, TrainerGroup):  # a signal to the whole process group stops Ray too
                stop.watch(actor.ray_lost, "Ray's own processes were stopped by the same signal")
            weights = weight_sync_for(engine, actor, run.weight_sync, run.output_dir)  # chosen once
            ctx = make_rollout_context(rollout, engine, envs)
            closing.push_async_callback(ctx.aclose)  # a black-box agent's gateway, if any
            evals = EvalEnvs(rollout, envs)  # the --eval-* sets' envs: made once, kept for every evaluation
            closing.push_async_callback(evals.aclose)
            runner = RolloutRunner.from_context(ctx, data)
            closing.push_async_callback(runner.close)
            runner.on_group_done = log.progress.group_done
            # --async-training: groups keep playing while the trainer trains (--max-staleness)
            pipeline = AsyncRollout.from_runner(runner, max_staleness=run.max_staleness) if run.async_training else None
            if pipeline is not None:
                closing.push_async_callback(pipeline.aclose)
            start, exported = 0, []
            if trainer.load:
                folder = latest_checkpoint(trainer.load)
                extra = actor.load_checkpoint(folder)
                start = int(extra.get("next_rollout", 0))
                log.restore(extra.get("run_log", {}), start)  # counters go on; later lines are redone
                data.load(folder / DATA_FILE)
                state = read_pipeline_state(folder)
                if pipeline is not None and state is not None:
                    pipeline.restore(state)  # the groups it had started are played again first
                await weights.push(version=str(start))
                print(f"resumed from {folder} at rollout {start}")
            if pipeline is not None:
                pipeline.start(engine_version=start)

            for rollout_id in range(start, run.num_rollout):
                log.progress.rollout_started(rollout_id)
                where[0] = f"rollout {rollout_id}"
                if run.eval_interval and rollout_id % run.eval_interval == 0:
                    with log.stage("eval"):
                        log.eval(rollout_id, await run_evaluation(ctx, rollout_id, evals))
                with log.stage("rollout"):
                    if trainer.loss_type == "sft_loss":  # a supervised warm start on demonstrations
                        batch = DemoBatch(await demonstrations(ctx, data.get_samples(rollout.rollout_batch_size)))
                    else:
                        batch = await (pipeline.next_batch(rollout_id) if pipeline is not None
                                       else runner.generate(rollout_id))
                        batch.check_failures(run.max_failed_fraction)  # stops a run that would learn nothing
                where[0] = f"rollout {rollout_id} (training)"
                with log.stage("train"):
                    # engines free their KV cache while the trainer shares the device (or, for
                    # an engine on the CPU, the host memory); async rollouts keep playing instead
                    if args.cluster.colocate or (engine.shares_host_memory and pipeline is None):
                        await engine.release_memory()
                    # in a thread: the loop stays free to react to a signal during a long step
                    train_metrics = await asyncio.to_thread(actor.train, batch.samples)
                if (rollout_id + 1) % run.update_weights_interval == 0:
                    with log.stage("weight_sync"):
                        await weights.push(version=str(rollout_id + 1))
                    if pipeline is not None:  # new groups may start, on the new weights
                        pipeline.published(rollout_id + 1)
                if run.save_trajectories:
                    log.samples(rollout_id, batch.samples)
                last = rollout_id + 1 == run.num_rollout  # the end of the run is always saved
                if last or (trainer.save_interval and (rollout_id + 1) % trainer.save_interval == 0):
                    # no await in here: a signal during a save takes effect once it is sealed,
                    # and the data position and the pipeline are read at the same instant
                    where[0] = f"rollout {rollout_id} (saving)"
                    with log.stage("save"):
                        # this rollout's metrics are recorded after the save: counted as if done
                        extra = {"next_rollout": rollout_id + 1, "run_log": log.counters(batch.metrics)}
                        publish_checkpoint(save_root, rollout_id + 1, functools.partial(
                            save, actor=actor, extra=extra, data=data, pipeline=pipeline))
                        if trainer.save_hf:
                            exported.append(export_hf(actor, f"{trainer.save_hf}/rollout_{rollout_id + 1:05d}",
                                                      checkpoint, chat_template=rollout.chat_template,
                                                      lora=bool(trainer.lora_rank)).describe())
                log.metrics(rollout_id, {**batch.metrics, **{f"train/{k}": v for k, v in train_metrics.items()}})

            if run.eval_interval:
                where[0] = "the final evaluation"
                log.eval(run.num_rollout, await run_evaluation(ctx, run.num_rollout, evals))
    log.finish()
    change = log.change()
    if change is not None:
        print(change)
    print("\n".join(log.ending(save_root, exported, lora=bool(trainer.lora_rank))))


def save(folder: Path, actor: Any, extra: dict[str, Any], data: Any, pipeline: AsyncRollout | None) -> None:
    """Writes a checkpoint's files into the fresh ``folder``: the trainer's (first: Megatron
    expects an empty folder), then the pipeline's state and the data position, read together
    with nothing in between."""
    actor.save_checkpoint(folder, extra=extra)
    if pipeline is not None:
        (folder / PIPELINE_FILE).write_text(json.dumps(pipeline.snapshot()), encoding="utf-8")
    data.save(folder / DATA_FILE)


if __name__ == "__main__":
    try:
        asyncio.run(main(sys.argv[1:]))
    except RunInterrupted as exc:  # Ctrl-C / SIGTERM: cleaned up; say where it stopped
        print(f"train.py: {exc}", file=sys.stderr)
        sys.exit(exc.exit_code)
    except AgentRLError as exc:  # a user-facing problem (config, data, plug-in): say it plainly
        sys.exit(f"train.py: error: {exc}")
