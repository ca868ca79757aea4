"""Multi-container Harbor tasks (environment/docker-compose.yaml) on the private Docker daemon:
the services start on a private network in dependency order once healthy, the agent's shell is
in `main`, an allowlist among the services holds per phase, a broken service is named with its
log, and everything is removed at close and after a kill. The shipped compose task is played in
tests/e2e/test_harbor_eval.py."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from agentrl.sandbox.egress import egress_unsupported
from agentrl_envs.harbor import HarborEnv, HarborTaskError
from tests.integration.test_harbor import BASE, SUBMIT, bash, play
from tests.support.sandboxes import backend_skip_reason

DOCKER_SKIP = backend_skip_reason("docker")
pytestmark = pytest.mark.skipif(DOCKER_SKIP is not None, reason=DOCKER_SKIP or "")

TOML = """\
schema_version = "1.4"
[task]
name = "test/{name}"
[environment]
network_mode = "no-network"
{extra}
"""
# `api` serves after a slow start (its healthcheck passes only then), `db` serves at once, and
# `init` must finish first; the verifier passes when main reached api.
COMPOSE = f"""\
services:
  main:
    environment: {{GREETING: hello}}
    depends_on:
      api: {{condition: service_healthy}}
  init:
    image: {BASE}
    command: ["sh", "-c", "sleep 1; exit 0"]
  api:
    image: {BASE}
    command: ["sh", "-c", "sleep 2; echo api > /tmp/who; cd /tmp && exec python3 -m http.server 8000"]
    healthcheck:
      test: ["CMD", "python3", "-c", "import urllib.request; urllib.request.urlopen('http://localhost:8000/who')"]
      interval: 500ms
      retries: 60
    depends_on:
      init: {{condition: service_completed_successfully}}
  db:
    build: {{context: db}}
"""
PROBE = """\
import sys, urllib.request
for target in sys.argv[1:]:
    try:
        print(target, urllib.request.urlopen(f"http://{target}:8000/who", timeout=5).read().decode().strip())
    except Exception:
        print(target, "blocked")
"""


def write_task(root: Path, name: str, *, extra: str = "", compose: str = COMPOSE) -> Path:
    task = root / name
    files = {
        "task.toml": TOML.format(name=name, extra=extra),
        "instruction.md": "Ask the services who they are.\n",
        "environment/Dockerfile": f"FROM {BASE}\nWORKDIR /app\nCOPY probe.py /opt/probe.py\n",
        "environment/probe.py": PROBE,
        "environment/docker-compose.yaml": compose,
        "environment/db/Dockerfile": f"FROM {BASE}\nRUN echo db > /tmp/who\n"
                                     "CMD [\"sh\", \"-c\", \"cd /tmp && exec python3 -m http.server 8000\"]\n",
        "tests/test.sh": "python3 /opt/probe.py api db > /tmp/seen; cat /tmp/seen\n"
                         "if grep -qx 'api api' /tmp/seen && [ -f /app/ok ]; then echo 1 > /logs/verifier/reward.txt; "
                         "else echo 0 > /logs/verifier/reward.txt; fi\n",
        "solution/solve.sh": "touch /app/ok\n",
    }
    for rel, text in files.items():
        (task / rel).parent.mkdir(parents=True, exist_ok=True)
        (task / rel).write_text(text)
    return task


@pytest.fixture(scope="module")
def tasks(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("harbor-compose")


def leftovers(owner: int | None = None) -> tuple[list[str], list[str]]:
    """The compose containers and networks on the daemon that process ``owner`` (default:
    this one) made."""
    from agentrl.sandbox._docker_api import OWNER_LABEL
    from agentrl.sandbox.docker import get_client

    client = get_client(None)
    mine = f"{OWNER_LABEL}={owner or os.getpid()}"
    containers = [c.name for c in client.containers.list(
        all=True, filters={"label": ["agentrl.compose.service", mine]})]
    networks = [n.name for n in client.networks.list(filters={"label": mine})
                if n.name.startswith("agentrl-compose-")]
    return containers, networks


@pytest.fixture()
def clean() -> Iterator[None]:
    yield
    assert leftovers() == ([], [])


def test_the_services_start_in_order_once_healthy_and_main_reaches_them_by_name(tasks: Path, clean: None) -> None:
    env = HarborEnv(path=write_task(tasks, "services"))
    try:
        reward, outputs, _ = play(env, [bash(
            "python3 /opt/probe.py api db; echo greeting=$GREETING; touch /app/ok; "
            # a private network: no route out of it
            "python3 -c \"import socket; s = socket.socket(); s.settimeout(3); "
            "print('out:', s.connect_ex(('192.0.2.1', 80)))\""), SUBMIT])
        # api's slow start was waited for (its healthcheck), after init finished
        assert "api api" in outputs[0] and "db db" in outputs[0] and "greeting=hello" in outputs[0]
        assert "out: 0" not in outputs[0]
        assert reward == 1.0
        assert "no network beyond the task's services, reached by name: init, api, db" in env.messages[0]["content"]
    finally:
        env.close()


@pytest.mark.skipif(egress_unsupported() is not None, reason=str(egress_unsupported()))
def test_an_allowlist_among_the_services_holds_per_phase(tasks: Path, clean: None) -> None:
    # the agent may reach db only; the verifier (the no-network baseline) reaches every service
    env = HarborEnv(path=write_task(tasks, "allow", extra='[agent]\nnetwork_mode = "allowlist"\nallowed_hosts = ["db"]'))
    try:
        reward, outputs, _ = play(env, [bash("python3 /opt/probe.py api db; touch /app/ok"), SUBMIT])
        assert "api blocked" in outputs[0] and "db db" in outputs[0]
        assert reward == 1.0, env.last_grade["output_tail"]
    finally:
        env.close()


def test_a_service_that_fails_its_healthcheck_is_named_with_its_log(tasks: Path, clean: None) -> None:
    broken = COMPOSE.replace("sleep 2; echo api", "echo api is broken >&2; exit 3; echo api")
    env = HarborEnv(path=write_task(tasks, "broken", compose=broken))
    try:
        with pytest.raises(HarborTaskError, match=r"service 'api' exited with 3; its log ends with: api is broken"):
            play(env, [SUBMIT])
    finally:
        env.close()


def test_more_than_the_services_is_refused_when_the_env_is_made(tasks: Path) -> None:
    task = write_task(tasks, "public", extra='[agent]\nnetwork_mode = "allowlist"\nallowed_hosts = ["pypi.org"]')
    with pytest.raises(HarborTaskError, match=r"agent.network_mode: a compose task's containers share a private "
                                              r"network .* \('pypi.org'\)"):
        HarborEnv(path=task)


KILLED_MID_EPISODE = """
import asyncio, json, sys, time
from agentrl_envs.harbor import HarborEnv

async def main():
    env = HarborEnv(path=sys.argv[1])
    await env.areset(options={"task": env.task_set()[0]})
    print(json.dumps({"network": env._services.network_name}), flush=True)
    time.sleep(600)

asyncio.run(main())
"""


def test_a_killed_runs_services_are_reclaimed(tasks: Path, clean: None) -> None:
    from agentrl.sandbox import reap_leftovers

    task = write_task(tasks, "killed")
    run = subprocess.Popen([sys.executable, "-c", KILLED_MID_EPISODE, str(task)], stdout=subprocess.PIPE, text=True)
    try:
        line = run.stdout.readline() if run.stdout else ""
        network = json.loads(line)["network"]
        assert network in leftovers(run.pid)[1] and len(leftovers(run.pid)[0]) == 3
    finally:
        run.send_signal(signal.SIGKILL)
        run.wait(timeout=30)
    reap_leftovers()  # what the next run does first (and agentrl's own exit hook otherwise)
    assert leftovers(run.pid) == ([], [])

