"""Start-up of ``train.py``: seconds from launching a tiny run to its first rollout, and from
launching a run with a bad flag to its error.

Each figure is the median of ``--repeats`` launches, measured from the moment this script starts
the process to the moment ``RolloutRunner.generate`` is first called, by a wrapper that then runs
``train.py`` unchanged. ``--src DIR`` runs another checkout instead (its ``train.py``
and packages, with this environment's dependencies), so two versions can be compared on the same
machine and load.

* ``startup_to_first_rollout_s``: a tiny calc run (2 prompts x 2 samples, Ray trainer rank,
  embedded engine).
* ``flag_error_s``: ``--rollout-batch-size 0``, until the process exits (target < 2 s).

    python bench/startup.py [--repeats 3] [--src path/to/other/checkout]
"""

from __future__ import annotations

import argparse
import json
import os
import site
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TINY_RUN = ["--env", "calc", "--rollout-batch-size", "2", "--n-samples-per-prompt", "2",
            "--max-turns", "2", "--rollout-max-response-len", "12", "--num-rollout", "1",
            "--no-progress"]

WRAPPER = """
import os, runpy, sys, time
launched = float(os.environ["AGENTRL_BENCH_LAUNCHED"])
import agentrl.rollout.runner as runner
generate = runner.RolloutRunner.generate
async def first(self, *args, **kwargs):
    print(f"FIRST_ROLLOUT_AFTER {time.time() - launched:.3f}", flush=True)
    runner.RolloutRunner.generate = generate
    return await generate(self, *args, **kwargs)
runner.RolloutRunner.generate = first
train_py = sys.argv[1]
sys.argv = sys.argv[1:]
sys.path.insert(0, os.path.dirname(os.path.abspath(train_py)))
runpy.run_path(train_py, run_name="__main__")
"""


def python_for(src: Path) -> tuple[list[str], dict[str, str]]:
    """The interpreter command and environment that import agentrl from ``src``.

    This checkout is installed in editable mode, which would win over any path; another
    checkout runs without site processing (``-S``), its packages first on the path, then this
    environment's site-packages.
    """
    if src == ROOT:
        return [sys.executable], dict(os.environ)
    links = Path(tempfile.mkdtemp(prefix="agentrl-src-"))
    for name, folder in (("agentrl", "agentrl"), ("agentrl_envs", "envs"), ("agentrl_tools", "tools")):
        (links / name).symlink_to(src / folder)
    path = os.pathsep.join([str(links), str(src), *site.getsitepackages()])
    return [sys.executable, "-S"], {**os.environ, "PYTHONPATH": path}


def to_first_rollout(src: Path) -> float:
    python, env = python_for(src)
    train_py = src / "train.py"
    env["AGENTRL_BENCH_LAUNCHED"] = repr(time.time())
    with tempfile.TemporaryDirectory() as out:
        done = subprocess.run([*python, "-c", WRAPPER, str(train_py), *TINY_RUN,
                               "--output-dir", f"{out}/run"], cwd=src, env=env,
                              capture_output=True, text=True, timeout=900)
    marks = [line for line in done.stdout.splitlines() if line.startswith("FIRST_ROLLOUT_AFTER")]
    if done.returncode != 0 or not marks:
        raise SystemExit(f"the tiny run failed (rc {done.returncode}):\n{done.stderr[-3000:]}")
    return float(marks[0].split()[1])


def to_flag_error(src: Path) -> float:
    python, env = python_for(src)
    started = time.perf_counter()
    done = subprocess.run([*python, str(src / "train.py"), "--env", "calc", "--rollout-batch-size", "0"],
                          cwd=src, env=env, capture_output=True, text=True, timeout=300)
    elapsed = time.perf_counter() - started
    if done.returncode != 2 or "--rollout-batch-size" not in done.stderr:
        raise SystemExit(f"expected a flag error, got rc {done.returncode}:\n{done.stderr[-2000:]}")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--src", type=Path, default=ROOT, help="the checkout to measure")
    args = parser.parse_args()
    src = args.src.resolve()
    rollout = [to_first_rollout(src) for _ in range(args.repeats)]
    flag = [to_flag_error(src) for _ in range(args.repeats)]
    print(f"{src}: first rollout after {rollout} s; flag error after "
          f"{[round(f, 3) for f in flag]} s")
    print(json.dumps({"name": "startup_to_first_rollout_s", "value": round(statistics.median(rollout), 2),
                      "target": "report (at most half the value before the rollout-layer consolidation)"}))
    print(json.dumps({"name": "flag_error_s", "value": round(statistics.median(flag), 2), "target": "< 2"}))


if __name__ == "__main__":
    main()
