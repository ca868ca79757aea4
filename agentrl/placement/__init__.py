"""Ray placement: where a run's parts run, and the only package that uses Ray.

* :mod:`~agentrl.placement.cluster` - ``ClusterConfig`` (the placement flags), starting or
  joining Ray, and ``TrainerGroup``: the trainer's ranks as Ray actors.
* :mod:`~agentrl.placement.engines` - ``EngineGroup``: embedded engines as Ray actors, health
  checked and restarted.
* :mod:`~agentrl.placement.servers` - SGLang and vLLM servers started as Ray actors, supervised.
* :mod:`~agentrl.placement.bundles` - one placement group's bundles shared by the trainer and
  the engines (``--colocate``).
* :mod:`~agentrl.placement.sandbox_hosts` / :mod:`~agentrl.placement.remote_sandbox` - sandboxes
  on other nodes (``--sandbox-placement``), and the driver's side of one.
* :mod:`~agentrl.placement.remote_errors` - a remote actor's error as one line naming what
  failed.

Ray is imported inside the functions that need it, so that reading ``ClusterConfig`` (every
run's flags do) loads nothing heavy.
"""
