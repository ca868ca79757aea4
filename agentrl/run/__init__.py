"""The run: what ``train.py`` and ``agentrl eval`` put together and drive.

* :mod:`~agentrl.run.flags` / :mod:`~agentrl.run.validation` - the flags, parsed into each
  subsystem's typed config and checked alone and together before anything heavy loads.
* :mod:`~agentrl.run.serving` / :mod:`~agentrl.run.context` - the policy (trainer and engine)
  and the rollout context a run asks for.
* :mod:`~agentrl.run.weights` - weight sync from the trainer to the engines.
* :mod:`~agentrl.run.checkpoints` / :mod:`~agentrl.run.export` - checkpoints written whole or
  not at all, and Hugging Face exports (``--save-hf``, ``agentrl export``).
* :mod:`~agentrl.run.run_log` / :mod:`~agentrl.run.sinks` / :mod:`~agentrl.run.progress` /
  :mod:`~agentrl.run.run_folder` - the run's folder, metrics, trajectories and progress.
* :mod:`~agentrl.run.interrupts` - Ctrl-C and SIGTERM turned into a clean stop.

Where the trainer's ranks, the engines and the sandboxes run (Ray) is
:mod:`agentrl.placement`'s, below this package.
"""
