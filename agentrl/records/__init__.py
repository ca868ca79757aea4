"""The records more than one layer exchanges, below all of them: :class:`~agentrl.records.sample.Sample`
(one episode as a token sequence, its loss mask, rollout log-probs, reward and status: what
rollouts produce, the gateway captures and the trainer trains on) and
:class:`~agentrl.records.trajectory.Trajectory` (the token-exact record an episode builds turn
by turn, whoever plays it: the rollout's engine turns or a black-box agent through the gateway).
"""
