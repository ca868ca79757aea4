"""Cross-check against Harbor itself: every shipped task, and a task using every field agentrl
reads, loads with Harbor's own ``Task`` model (harbor 0.25.0 in the Python 3.12 venv that
scripts/setup-harbor-check.sh makes), and agentrl's reading of each field agrees with Harbor's."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from agentrl_envs.harbor import SHIPPED_TASKS, load_task
from agentrl_envs.harbor.network import phase_policies
from tests.unit.test_harbor_task import MULTI_STEP, make_task

REPO = Path(__file__).resolve().parents[2]
HARBOR_PYTHON = REPO / ".venv-harbor" / "bin" / "python"
SKIP = None if HARBOR_PYTHON.exists() else (
    "no .venv-harbor (Python 3.12 with harbor): run scripts/setup-harbor-check.sh, which needs a "
    "Python 3.12 interpreter (python3.12 on PATH or pyenv's 3.12)")
pytestmark = pytest.mark.skipif(SKIP is not None, reason=SKIP or "")

DUMP = """
import json, sys
from harbor.models.task.task import Task
from harbor.models.task.verifier_mode import resolve_verifier_environment_definition

def phase_networks(c):  # harbor/trial/network_policy.py's resolution (a step's table, the task's, the baseline)
    baseline = c.environment.resolve_baseline()
    out = [baseline]
    for step in c.steps or [None]:
        for role in ("agent", "verifier"):
            explicit = getattr(step, role).explicit_phase_policy() if step else None
            out.append(explicit or getattr(c, role).explicit_phase_policy() or baseline)
    return out

out = {}
for path in sys.argv[1:]:
    task = Task(path)
    c = task.config
    e = c.environment
    out[path] = {
        "name": task.name, "version": c.task.version if c.task else None,
        "schema_version": c.schema_version,
        "instruction": (task.step_instruction(c.steps[0].name) if c.steps else task.instruction).strip(),
        "agent_timeout_s": c.agent.timeout_sec, "verifier_timeout_s": c.verifier.timeout_sec,
        "verifier_env": c.verifier.env, "build_timeout_s": e.build_timeout_sec,
        "docker_image": e.docker_image, "cpus": e.cpus, "memory_mb": e.memory_mb,
        "storage_mb": e.storage_mb, "network_mode": e.network_mode.value, "workdir": e.workdir,
        "env": e.env, "solution_env": c.solution.env,
        "mcp_servers": [[m.name, m.transport, m.url, m.command, m.args] for m in e.mcp_servers],
        "allowed_hosts": list(e.allowed_hosts or []),
        # each phase's effective network policy, as Harbor's trial resolves it
        "networks": [[p.network_mode.value, p.allowed_hosts] for p in phase_networks(c)],
        "verifiers": [None if d is None else [str(d.directory), d.bundled_tests, d.config.docker_image,
                      d.config.workdir, d.config.cpus, d.config.memory_mb, d.config.storage_mb]
                      for d in (resolve_verifier_environment_definition(c, task.paths, s) for s in c.steps or [None])],
        "collect": [[h.command, h.timeout_sec, None if h.user is None else str(h.user)]
                    for h in [*c.verifier.collect, *(c.steps[0].verifier.collect if c.steps else [])]],
        "healthchecks": [None if h is None else [h.command, h.interval_sec, h.timeout_sec, h.start_period_sec,
                                                h.start_interval_sec, h.retries]
                         for h in [e.healthcheck, *(s.healthcheck for s in c.steps or [])]],
        "multi_step": bool(c.steps),
        "reward_strategy": (c.multi_step_reward_strategy or "mean") if c.steps else "mean",
        # a step's effective settings, as Harbor's multi-step trial resolves them
        "steps": [[s.name, task.step_instruction(s.name).strip(),
                   s.agent.timeout_sec if s.agent.timeout_sec is not None else c.agent.timeout_sec,
                   s.verifier.timeout_sec, {**c.verifier.env, **s.verifier.env}, s.min_reward]
                  for s in c.steps or []],
    }
print(json.dumps(out))
"""


def ours(path: Path) -> dict:
    task = load_task(path)
    fields = {k: getattr(task, k) for k in (
        "name", "version", "schema_version", "instruction", "agent_timeout_s", "verifier_timeout_s",
        "build_timeout_s", "docker_image", "cpus", "memory_mb", "storage_mb", "network_mode", "workdir")}
    fields.update(verifier_env=dict(task.verifier_env), env=dict(task.env), solution_env=dict(task.solution_env),
                  mcp_servers=[[m.name, m.transport, m.url, m.command, list(m.args)] for m in task.mcp_servers],
                  allowed_hosts=list(task.allowed_hosts),
                  networks=[[p.mode, list(p.allowed_hosts)] for _, p in phase_policies(task)],
                  verifiers=[None if (v := s.verifier_environment) is None else [
                      str(v.context_dir), v.bundled_tests, v.settings.docker_image, v.settings.workdir,
                      v.settings.cpus, v.settings.memory_mb, v.settings.storage_mb] for s in task.steps],
                  collect=[[h.command, h.timeout_s, h.user] for h in task.steps[0].collect],
                  healthchecks=[None if h is None else [h.command, h.interval_s, h.timeout_s, h.start_period_s,
                                                       h.start_interval_s, h.retries]
                                for h in [task.healthcheck, *(s.healthcheck for s in task.steps if task.multi_step)]],
                  multi_step=task.multi_step, reward_strategy=task.reward_strategy,
                  steps=[[s.name, s.instruction, s.agent_timeout_s, s.verifier_timeout_s, dict(s.verifier_env),
                          dict(s.min_reward) if isinstance(s.min_reward, dict) else s.min_reward]
                         for s in task.steps] if task.multi_step else [])
    return fields


def test_harbor_loads_every_task_and_reads_it_as_agentrl_does(tmp_path: Path) -> None:
    paths = sorted(str(p) for p in SHIPPED_TASKS.iterdir() if (p / "task.toml").is_file())
    paths.append(str(make_task(tmp_path).resolve()))  # every field agentrl reads
    paths.append(str(make_task(tmp_path, MULTI_STEP, name="steps", files={  # and of steps
        "instruction.md": None, "steps/first/instruction.md": "<!-- canary -->\nDo one.\n",
        "steps/first/tests/test.sh": "exit 0\n", "steps/second/instruction.md": "Do two.\n",
        "steps/second/tests/test_two.py": "",
    }).resolve()))
    done = subprocess.run([str(HARBOR_PYTHON), "-c", DUMP, *paths], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "HARBOR_TELEMETRY": "0"})
    assert done.returncode == 0, done.stderr[-3000:]
    theirs = json.loads(done.stdout)
    assert len(theirs) == len(paths) >= 15
    for path in paths:
        assert ours(Path(path)) == theirs[path], path
