"""Play ``calc`` episodes with the scripted oracle and print each transcript.

The oracle writes raw assistant text in the env's tool-call format, exactly as a model would,
so this exercises the whole per-turn path: parse -> validate -> run the tool -> tool message ->
final answer -> reward.

    python examples/calc_episode.py --episodes 3 --split test
"""

from __future__ import annotations

import argparse

import agentrl
from agentrl_envs.calc import calc_oracle


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=2)
    parser.add_argument("--split", default="test", choices=["train", "test"])
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    env = agentrl.make_env("calc", split=args.split, render_mode="ansi")
    agentrl.check_env(agentrl.make_env("calc"))
    for episode in range(args.episodes):
        _, info = env.reset(seed=args.seed + episode)
        terminated = truncated = False
        while not (terminated or truncated):
            action = calc_oracle(env, env.state.task, env.messages)  # the expert knows the row
            _, reward, terminated, truncated, _ = env.step(action)
        print(f"--- episode {episode} ({info['task']['id']})")
        print(env.render())
        print(f"reward {reward} terminated={terminated} truncated={truncated}\n")
    env.close()


if __name__ == "__main__":
    main()
