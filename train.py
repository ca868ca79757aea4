"""agentrl's training loop: rollout -> advantages -> Megatron step -> weight sync, repeated.

    python train.py --env calc --max-turns 3 --num-rollout 3
    python train.py --custom-generate-function-path examples/custom_generate.py --env calc \
        --prompt-data tasks.jsonl --max-turns 5

Three parts: parse the flags, each into one typed config (``RolloutConfig`` of agentrl.rollout,
``TrainerConfig`` of agentrl.trainer, ``RunConfig`` of agentrl.run.config, ``ClusterConfig`` of
agentrl.placement.cluster; ``python train.py --help`` lists them); assemble the run
(:func:`agentrl.run.assemble.assemble`: log, envs, data, trainer, engine, weight sync, rollout
context, resume); and the loop below. The trainer's ranks run as Ray actors
(``--actor-num-nodes`` x ``--actor-num-gpus-per-node``, CPU processes on a machine without GPUs;
``--no-use-ray`` keeps one rank in this process); the embedded engine serves rollouts in this
process.
"""

from __future__ import annotations

import asyncio
import functools
import json
import sys
from pathlib import Path
from typing import Any

from agentrl.errors import AgentRLError, RunInterrupted
from agentrl.eval.runner import run_evaluation
from agentrl.rollout.demonstrations import DemoBatch, demonstrations
from agentrl.rollout.pipeline import AsyncRollout
from agentrl.run.assemble import Run, assemble
from agentrl.run.checkpoints import DATA_FILE, PIPELINE_FILE, nothing_left, publish_checkpoint
from agentrl.run.export import export_hf
from agentrl.run.flags import parse_args


async def main(argv: list[str]) -> None:
    args = parse_args(argv)
    if args.embedded is not None:  # its env settings and flag defaults differ from the env's own: say so
        print(args.embedded.announcement(args.rollout.env_kwargs), flush=True)
    if (done := nothing_left(args.trainer.load, args.run.num_rollout)) is not None:
        print(f"train.py: {done}")  # before Ray, the model or the data are touched
        return
    async with assemble(args, argv) as run:  # closed on the way out, and on Ctrl-C / SIGTERM
        exported = await train(run)
    run.log.finish()
    change = run.log.change()
    if change is not None:
        print(change)
    print("\n".join(run.log.ending(run.save_root, exported, lora=bool(args.trainer.lora_rank))))


async def train(run: Run) -> list[str]:
    """The loop: rollout -> train -> weight sync (-> save, evaluate), from ``run.start`` to
    ``--num-rollout``. Returns what ``--save-hf`` exported."""
    rollout, trainer, cfg = run.args.rollout, run.args.trainer, run.args.run
    log, engine, pipeline, exported = run.log, run.engine, run.pipeline, []
    for rollout_id in range(run.start, cfg.num_rollout):
        log.progress.rollout_started(rollout_id)
        run.doing = f"rollout {rollout_id}"
        if cfg.eval_interval and rollout_id % cfg.eval_interval == 0:
            with log.stage("eval"):
                log.eval(rollout_id, await run_evaluation(run.ctx, rollout_id, run.evals))
        with log.stage("rollout"):
            if trainer.loss_type == "sft_loss":  # a supervised warm start on demonstrations
                batch = DemoBatch(await demonstrations(run.ctx, run.data.get_samples(rollout.rollout_batch_size)))
            else:
                batch = await (pipeline.next_batch(rollout_id) if pipeline is not None
                               else run.runner.generate(rollout_id))
                batch.check_failures(cfg.max_failed_fraction)  # stops a run that would learn nothing
        run.doing = f"rollout {rollout_id} (training)"
        with log.stage("train"):
            # engines free their KV cache while the trainer shares the device (or, for an
            # engine on the CPU, the host memory); async rollouts keep playing instead
            if run.args.cluster.colocate or (engine.shares_host_memory and pipeline is None):
                await engine.release_memory()
            # in a thread: the loop stays free to react to a signal during a long step
            train_metrics = await asyncio.to_thread(run.trainer.train, batch.samples)
        if (rollout_id + 1) % cfg.update_weights_interval == 0:
            with log.stage("weight_sync"):
                await run.weights.push(version=str(rollout_id + 1))
            if pipeline is not None:  # new groups may start, on the new weights
                pipeline.published(rollout_id + 1)
        if cfg.save_trajectories:
            log.samples(rollout_id, batch.samples)
        last = rollout_id + 1 == cfg.num_rollout  # the end of the run is always saved
        if last or (trainer.save_interval and (rollout_id + 1) % trainer.save_interval == 0):
            # no await in here: a signal during a save takes effect once it is sealed, and the
            # data position and the pipeline are read at the same instant
            run.doing = f"rollout {rollout_id} (saving)"
            with log.stage("save"):
                # this rollout's metrics are recorded after the save: counted as if done
                extra = {"next_rollout": rollout_id + 1, "run_log": log.counters(batch.metrics)}
                publish_checkpoint(run.save_root, rollout_id + 1, functools.partial(
                    save, actor=run.trainer, extra=extra, data=run.data, pipeline=pipeline))
                if trainer.save_hf:
                    exported.append(export_hf(run.trainer, f"{trainer.save_hf}/rollout_{rollout_id + 1:05d}",
                                              run.checkpoint, chat_template=rollout.chat_template,
                                              lora=bool(trainer.lora_rank)).describe())
        log.metrics(rollout_id, {**batch.metrics, **{f"train/{k}": v for k, v in train_metrics.items()}})
    if cfg.eval_interval:
        run.doing = "the final evaluation"
        log.eval(cfg.num_rollout, await run_evaluation(run.ctx, cfg.num_rollout, run.evals))
    return exported


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
