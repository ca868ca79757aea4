"""swe-tools oracle throughput on the bwrap sandbox, and where the time goes.

Plays the scripted oracle (view the file, apply the fix with the editor, submit; grading runs
the hidden tests) on the first N test tasks, several episodes at once, through the same
evaluation runner as ``agentrl eval``.

* ``swe_tools_oracle_eps_per_s``: episodes finished per second of wall time.
* ``swe_tools_framework_share``: the share of episode time spent outside tool execution and
  grading (the tools' and the grader's own time is measured around each call by the env), i.e.
  reset (sandbox acquire, writing the project), parsing, dispatch, policy. Target < 0.10.

    python bench/swe_tools.py [--episodes 40] [--concurrency 4]
"""

from __future__ import annotations

import argparse
import asyncio
import json

from agentrl.rollout.config import RolloutConfig
from agentrl.run.evaluate import EvalConfig, evaluate


def play(episodes: int, concurrency: int) -> dict:
    config = RolloutConfig(env="swe-tools", env_kwarg=["sandbox=bwrap"], eval_max_prompts=episodes,
                           rollout_concurrency=concurrency)
    summary, _ = asyncio.run(evaluate(config, EvalConfig(policy="oracle", split="test")))
    return summary["sets"]["swe-tools"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=40)
    parser.add_argument("--concurrency", type=int, default=4)
    args = parser.parse_args()
    play(2, args.concurrency)  # warm-up, task cache
    result = play(args.episodes, args.concurrency)
    t = result["time_per_episode_s"]
    in_tools = t["tools"] + t["grading"]
    share = max(0.0, t["total"] - in_tools) / t["total"]
    eps = result["n_samples"] / result["wall_s"]
    print(f"{result['n_samples']} oracle episodes, success {result['success_rate']:.3f}, "
          f"{eps:.2f} episodes/s at concurrency {args.concurrency}")
    print(f"per episode: total {t['total']:.3f} s = tools {t['tools']:.3f} + grading "
          f"{t['grading']:.3f} + framework {t['total'] - in_tools:.3f} (share {share:.3f})")
    print(json.dumps({"name": "swe_tools_oracle_eps_per_s", "value": round(eps, 3), "target": "report"}))
    print(json.dumps({"name": "swe_tools_framework_share", "value": round(share, 3), "target": "< 0.10"}))


if __name__ == "__main__":
    main()
