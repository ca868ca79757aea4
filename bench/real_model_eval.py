"""Zero-shot success of a real model on every offline built-in env, with ``agentrl eval``.

Runs ``agentrl eval --env ENV --policy model --hf-checkpoint MODEL`` on each env's test split
(greedy, one sample per task, the env's own turn limit) exactly as a user would, one env after
another, and reads back the ``--output`` summary.

    python bench/real_model_eval.py [--model smollm2-135m-instruct] [--prompts 32]
        [--envs calc,math-python,humaneval,bfcl,swe-tools] [--out DIR]

Prints one table line per env, then JSON lines ``{"name": "zero_shot_success_<env>", "value":
<success rate>, "target": "report"}`` and ``{"name": "zero_shot_episodes_per_s_<env>", ...}``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

OFFLINE_ENVS = ("calc", "math-python", "humaneval", "bfcl", "swe-tools")


def evaluate(env: str, model: str, prompts: int, out: Path) -> dict:
    """One ``agentrl eval`` run; its summary's first set, with the command's wall time."""
    output = out / f"{env}.json"
    command = [sys.executable, "-m", "agentrl", "eval", "--env", env, "--policy", "model",
               "--hf-checkpoint", model, "--eval-max-prompts", str(prompts),
               "--n-samples-per-eval-prompt", "1", "--eval-temperature", "0",
               "--output", str(output)]
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - start
    if not output.is_file():
        raise RuntimeError(f"{' '.join(command)} exited {done.returncode}:\n{done.stderr[-3000:]}")
    metrics = next(iter(json.loads(output.read_text())["sets"].values()))
    return {"metrics": metrics, "command_s": wall}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--prompts", type=int, default=32, help="test tasks per env")
    parser.add_argument("--envs", default=",".join(OFFLINE_ENVS))
    parser.add_argument("--out", default=None, help="folder for the eval outputs (default: temp)")
    args = parser.parse_args()
    out = Path(args.out or tempfile.mkdtemp(prefix="real-model-eval-"))
    out.mkdir(parents=True, exist_ok=True)
    figures = []
    for env in args.envs.split(","):
        result = evaluate(env, args.model, args.prompts, out)
        m = result["metrics"]
        episodes = m["n_samples"]
        wall = m.get("wall_s") or result["command_s"]
        rate = episodes / wall if wall else 0.0
        print(f"{env:12s} success {m['success_rate']:.3f} over {episodes} episodes, "
              f"{m.get('mean_turns', 0):.2f} turns, {m.get('tool_calls', 0)} tool calls, "
              f"{rate:.3f} episodes/s ({wall:.0f} s; command {result['command_s']:.0f} s)",
              flush=True)
        figures.append({"name": f"zero_shot_success_{env}", "value": round(m["success_rate"], 4),
                        "target": "report", "episodes": episodes})
        figures.append({"name": f"zero_shot_episodes_per_s_{env}", "value": round(rate, 4),
                        "target": "report"})
    print(f"outputs in {out}")
    for figure in figures:
        print(json.dumps(figure))


if __name__ == "__main__":
    main()
