"""harbor-v0 on the private Docker daemon: images built offline and cached, isolation of the
tests and the reward file, agent-side cheats, network and resource settings, and every way a
grade can fail. The tasks here are written into tmp_path; the shipped ones are evaluated in
tests/e2e/test_harbor_eval.py."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agentrl.errors import GradingError
from agentrl.sandbox.egress import egress_unsupported
from agentrl_envs.harbor import HarborEnv, HarborTaskError
from agentrl_envs.harbor.images import HarborImageError, ensure_task_image
from agentrl_envs.harbor.task import load_task
from tests.support.sandboxes import backend_skip_reason

DOCKER_SKIP = backend_skip_reason("docker")
pytestmark = pytest.mark.skipif(DOCKER_SKIP is not None, reason=DOCKER_SKIP or "")

BASE = "agentrl-base:bookworm-py3-v2"
TOML = """\
schema_version = "1.4"
[task]
name = "test/{name}"
[verifier]
timeout_sec = {verifier_timeout}
[agent]
timeout_sec = {agent_timeout}
[environment]
memory_mb = 768
cpus = 0.5
network_mode = "{network}"
"""
# The answer is in tests/expected.txt: a verifier that only compares files, so that copying
# the expected file would pass if the agent could reach it.
TEST_SH = """\
if cmp -s /app/answer.txt /tests/expected.txt; then echo 1 > /logs/verifier/reward.txt
else echo 0 > /logs/verifier/reward.txt; fi
"""


def write_task(root: Path, name: str, *, dockerfile: str | None = None, test_sh: str = TEST_SH,
               network_mode: str = "no-network", verifier_timeout: float = 30, agent_timeout: float = 600) -> Path:
    task = root / name
    files = {
        "task.toml": TOML.format(name=name, network=network_mode, verifier_timeout=verifier_timeout,
                                 agent_timeout=agent_timeout),
        "instruction.md": "Write the sum of the numbers in /app/numbers.txt to /app/answer.txt.\n",
        "environment/Dockerfile": dockerfile or f"FROM {BASE}\nWORKDIR /app\nCOPY numbers.txt /app/\n",
        "environment/numbers.txt": "1\n2\n39\n",
        "tests/test.sh": test_sh,
        "tests/expected.txt": "42\n",
        "solution/solve.sh": "cd /app && awk '{s += $1} END {print s}' numbers.txt > answer.txt\n",
    }
    for rel, text in files.items():
        (task / rel).parent.mkdir(parents=True, exist_ok=True)
        (task / rel).write_text(text)
    return task


def bash(command: str) -> dict[str, Any]:
    return {"role": "assistant", "content": "", "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "bash", "arguments": json.dumps({"command": command})}}]}


SUBMIT = {"role": "assistant", "content": "", "tool_calls": [
    {"id": "s", "type": "function", "function": {"name": "submit", "arguments": "{}"}}]}


def play(env: HarborEnv, actions: list[dict[str, Any]]) -> tuple[float, list[str], dict[str, Any]]:
    """Plays ``actions`` on the env's only task; returns (reward, tool outputs, last info)."""
    async def run() -> tuple[float, list[str], dict[str, Any]]:
        await env.areset(options={"task": env.task_set()[0]})
        outputs: list[str] = []
        for action in actions:
            observation, reward, terminated, truncated, info = await env.astep(action)
            outputs += [m["content"] for m in observation]
            if terminated or truncated:
                return reward, outputs, info
        raise AssertionError("the episode did not end")
    return asyncio.run(run())


def oracle(env: HarborEnv, task: dict[str, Any] | None = None) -> float:
    """Plays the env's oracle on ``task`` (default: its first); returns the reward."""
    task = task or env.task_set()[0]

    async def run() -> float:
        await env.areset(options={"task": task})
        while True:
            _, reward, terminated, truncated, _ = await env.astep(env.oracle_action(task, env.messages))
            if terminated or truncated:
                return reward
    return asyncio.run(run())


@pytest.fixture(scope="module")
def tasks(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("harbor")


@pytest.fixture()
def env_of(tasks: Path) -> Iterator[Any]:
    made: list[HarborEnv] = []

    def make(name: str, **kwargs: Any) -> HarborEnv:
        task_kwargs = {k: kwargs.pop(k) for k in ("dockerfile", "test_sh", "network_mode", "verifier_timeout",
                                                 "agent_timeout") if k in kwargs}
        path = tasks / name
        if not path.exists():
            write_task(tasks, name, **task_kwargs)
        made.append(HarborEnv(path=path, **kwargs))
        return made[-1]

    yield make
    for env in made:
        env.close()


def test_oracle_scores_1_and_the_tests_are_invisible_until_grading(env_of: Any) -> None:
    env = env_of("sum")
    probe = bash("ls -A /tests /solution /logs/verifier; cat /app/numbers.txt; touch /app/x; id -u")
    reward, outputs, _ = play(env, [probe, SUBMIT])
    assert reward == 0.0
    assert "expected.txt" not in outputs[0] and "solve.sh" not in outputs[0]  # empty until needed
    assert "39" in outputs[0] and "65534" in outputs[0]  # the image's /app, as an unprivileged uid
    assert env.last_grade["rewards"] == {"reward": 0.0} and env.last_grade["exit_code"] == 0
    assert oracle(env) == 1.0


def test_cheat_writing_the_reward_file_early_scores_0(env_of: Any) -> None:
    env = env_of("sum")
    reward, outputs, _ = play(env, [bash("echo 1 > /logs/verifier/reward.txt; echo 1 > /logs/verifier/reward.json"), SUBMIT])
    assert "Permission denied" in outputs[0]
    assert reward == 0.0


def test_cheat_editing_the_tests_before_grading_scores_0(env_of: Any) -> None:
    env = env_of("sum")
    cheat = ("mkdir -p /tests; printf 'echo 1 > /logs/verifier/reward.txt' > /tests/test.sh; "
             "cp /app/numbers.txt /tests/expected.txt; cp /app/numbers.txt /app/answer.txt")
    reward, outputs, _ = play(env, [bash(cheat), SUBMIT])
    assert "Read-only file system" in outputs[0] or "Permission denied" in outputs[0]
    assert reward == 0.0


def test_cheat_a_background_process_during_grading_scores_0(env_of: Any) -> None:
    env = env_of("sum")
    # It would copy the expected answer the moment the tests appear, and rewrite the answer file.
    cheat = ("nohup sh -c 'while :; do cp /tests/expected.txt /app/answer.txt 2>/dev/null; sleep 0.01; done' "
             ">/dev/null 2>&1 & loop=$!; sleep 0.3; kill -0 $loop && echo cheat-running")
    reward, outputs, _ = play(env, [bash(cheat), SUBMIT])
    assert "cheat-running" in outputs[0]  # it was running when the agent submitted
    assert reward == 0.0


def test_a_missing_from_image_is_named_and_base_image_rebases(env_of: Any) -> None:
    dockerfile = "FROM python:3.99-agentrl-missing\nWORKDIR /app\nCOPY numbers.txt /app/\n"
    env = env_of("missing-from", dockerfile=dockerfile)
    with pytest.raises(HarborImageError) as error:
        env.reset(options={"task": env.task_set()[0]})
    message = str(error.value)
    assert "environment/Dockerfile line 1" in message and "'python:3.99-agentrl-missing'" in message
    assert "docker load" in message and f"--env-kwarg base_image={BASE}" in message
    rebased = env_of("missing-from", base_image=BASE)
    task = rebased.task_set()[0]

    async def oracle() -> float:
        await rebased.areset(options={"task": task})
        await rebased.astep(rebased.oracle_action(task, rebased.messages))
        return (await rebased.astep(rebased.oracle_action(task, rebased.messages)))[1]
    assert asyncio.run(oracle()) == 1.0


def test_images_are_cached_by_the_environment_folder(tasks: Path) -> None:
    from agentrl.sandbox.docker import get_client

    task = load_task(write_task(tasks, "cache"))
    client = get_client()
    first = asyncio.run(ensure_task_image(client, task))
    again = asyncio.run(ensure_task_image(client, task))
    assert again.tag == first.tag and again.built is False and first.workdir == "/app"
    (task.environment_dir / "numbers.txt").write_text("5\n")
    changed = asyncio.run(ensure_task_image(client, load_task(task.path)))
    assert changed.tag != first.tag and changed.built is True
    client.images.remove(changed.tag, force=True)


def test_public_network_is_refused_unless_granted(env_of: Any, tasks: Path) -> None:
    write_task(tasks, "public", network_mode="public")
    with pytest.raises(HarborTaskError, match="asks for public network .*--env-kwarg network=public"):
        HarborEnv(path=tasks / "public")
    granted = env_of("public", network="public")
    offline = env_of("public", network="offline")
    from agentrl.sandbox.docker import get_client

    client = get_client()
    for env, expected in ((granted, "bridge"), (offline, "none")):
        async def inspect(env: HarborEnv = env) -> dict[str, Any]:
            await env.areset(options={"task": env.task_set()[0]})
            return client.api.inspect_container(env.sandbox.container_id)["HostConfig"]
        host = asyncio.run(inspect())
        assert host["NetworkMode"] == expected
        assert host["Memory"] == 768 * 1024 * 1024 and host["NanoCpus"] == 500_000_000  # task.toml


def test_a_verifier_without_a_reward_file_fails_the_grade(env_of: Any) -> None:
    env = env_of("no-reward", test_sh="echo checking; exit 3\n")
    with pytest.raises(GradingError, match=r"wrote no /logs/verifier/reward.txt or reward.json \(exit code 3\).*checking"):
        play(env, [SUBMIT])
    malformed = env_of("bad-reward", test_sh="echo lots > /logs/verifier/reward.txt\n")
    with pytest.raises(GradingError, match="reward.txt that is not one finite number: 'lots'"):
        play(malformed, [SUBMIT])


def test_verifier_and_agent_timeouts(env_of: Any) -> None:
    slow = env_of("slow-verifier", test_sh="sleep 30\n", verifier_timeout=1)
    with pytest.raises(GradingError, match=r"did not finish within 1 s \(task.toml \[verifier\].timeout_sec\)"):
        play(slow, [SUBMIT])
    hurried = env_of("agent-timeout", agent_timeout=1)
    reward, _, info = play(hurried, [bash("sleep 1.5"), SUBMIT])
    assert info["truncated_by"].startswith("agent timeout (1 s")
    assert reward == 0.0


def test_check_env_passes_on_a_harbor_task(env_of: Any) -> None:
    from agentrl.env import check_env

    check_env(env_of("sum"), oracle_episodes=1)


def test_a_tasks_mcp_servers_run_in_its_container(tasks: Path) -> None:
    """[[environment.mcp_servers]] of a task: the stdio server runs inside the episode's
    container; its tools are the episode's tools, and only that task's."""
    root = tasks / "mcp-folder"
    with_server = write_task(root, "with-mcp", dockerfile=(
        f"FROM {BASE}\nWORKDIR /app\nCOPY numbers.txt /app/\nCOPY server.py /opt/mcp/server.py\n"))
    (with_server / "environment" / "server.py").write_text(
        (Path(__file__).parents[1] / "support" / "stdlib_mcp_server.py").read_text())
    with (with_server / "task.toml").open("a") as toml:
        toml.write('\n[[environment.mcp_servers]]\nname = "files"\ntransport = "stdio"\n'
                   'command = "python3"\nargs = ["/opt/mcp/server.py"]\n')
    write_task(root, "without-mcp")
    env = HarborEnv(path=root)

    def call(name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        return {"role": "assistant", "content": "", "tool_calls": [
            {"id": "m", "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}]}

    async def run() -> tuple[list[str], list[str], list[str]]:
        rows = {row["id"]: row for row in env.task_set()}
        _, info = await env.areset(options={"task": rows["test/with-mcp"]})
        tools = [t["function"]["name"] for t in info["tools"]]
        outputs = []
        for name, arguments in [("whoami", {}), ("read_text", {"path": "numbers.txt"}), ("read_text", {})]:
            observation, *_ = await env.astep(call(name, arguments))
            outputs.append(observation[0]["content"])
        _, info = await env.areset(options={"task": rows["test/without-mcp"]})
        return tools, outputs, [t["function"]["name"] for t in info["tools"]]

    try:
        tools, outputs, other_tools = asyncio.run(run())
    finally:
        env.close()
    assert tools == ["bash", "editor", "search", "submit", "whoami", "read_text"]
    assert outputs[0] == "uid=65534 host=sandbox cwd=/workspace"  # in the container, unprivileged
    assert outputs[1] == "1\n2\n39\n"
    assert outputs[2].startswith("Error (schema_violation)")  # validated before any call
    assert other_tools == ["bash", "editor", "search", "submit"]


STEPS_TOML = """\
schema_version = "1.4"
multi_step_reward_strategy = "{strategy}"
[task]
name = "test/{name}"
[environment]
network_mode = "no-network"
[[steps]]
name = "one"
min_reward = 1.0
[[steps]]
name = "two"
"""
# Each step's verifier compares a file with the step's own expected file and leaves a marker
# of itself in /tests, to show that the next step's agent cannot see either.
STEP_TEST_SH = """\
cp /tests/expected.txt /tmp/verifier-leftover; cp /tests/expected.txt /dev/shm/verifier-leftover
chmod 644 /tmp/verifier-leftover /dev/shm/verifier-leftover
nohup sh -c 'sleep 300' > /dev/null 2>&1 &
if cmp -s /app/$(cat /tests/target) /tests/expected.txt; then echo 1 > /logs/verifier/reward.txt
else echo 0 > /logs/verifier/reward.txt; fi
"""


def write_steps_task(root: Path, name: str, strategy: str = "mean") -> Path:
    task = root / name
    files = {
        "task.toml": STEPS_TOML.format(name=name, strategy=strategy),
        "environment/Dockerfile": f"FROM {BASE}\nWORKDIR /app\nCOPY numbers.txt /app/\n",
        "environment/numbers.txt": "1\n2\n39\n",
        "tests/test.sh": STEP_TEST_SH,
        "steps/one/instruction.md": "Write the sum of /app/numbers.txt to /app/sum.txt.\n",
        "steps/one/tests/target": "sum.txt", "steps/one/tests/expected.txt": "42\n",
        "steps/one/solution/solve.sh": "cd /app && awk '{s += $1} END {print s}' numbers.txt > sum.txt\n",
        "steps/two/instruction.md": "Write twice the number in /app/sum.txt to /app/double.txt.\n",
        "steps/two/workdir/setup.sh": "echo staged > note.txt\n",
        "steps/two/workdir/data/extra.txt": "from step two\n",
        "steps/two/tests/target": "double.txt", "steps/two/tests/expected.txt": "84\n",
        "steps/two/solution/solve.sh": "cd /app && echo $(( $(cat sum.txt) * 2 )) > double.txt\n",
    }
    for rel, text in files.items():
        (task / rel).parent.mkdir(parents=True, exist_ok=True)
        (task / rel).write_text(text)
    return task


def play_steps(env: HarborEnv, actions: list[dict[str, Any]]) -> tuple[float, list[list[dict[str, Any]]]]:
    """Plays ``actions``; returns (reward, each step's observation)."""
    async def run() -> tuple[float, list[list[dict[str, Any]]]]:
        await env.areset(options={"task": env.task_set()[0]})
        observations = []
        for action in actions:
            observation, reward, terminated, truncated, _ = await env.astep(action)
            observations.append(observation)
            if terminated or truncated:
                return reward, observations
        raise AssertionError("the episode did not end")
    return asyncio.run(run())


def test_a_multi_step_task_goes_on_after_each_submit_in_one_sandbox(tasks: Path) -> None:
    env = HarborEnv(path=write_steps_task(tasks, "steps"))
    try:
        reward, observations = play_steps(env, [
            bash("cd /app && echo 42 > sum.txt && chmod 600 sum.txt"), SUBMIT,
            # step two: the files stay (and are the agent's again after grading), the step's
            # workdir was copied in and its setup.sh ran; the graded step's tests are gone
            bash("cd /app && ls -A /tests /logs/verifier /tmp /dev/shm; cat note.txt data/extra.txt; "
                 "echo 84 > double.txt && cat sum.txt && stat -c %u sum.txt; "
                 "echo sleeping=$(ps -eo comm | grep -c '^sleep$')"), SUBMIT])
        assert reward == 1.0
        assert observations[1][-1] == {"role": "user", "content": "Write twice the number in /app/sum.txt "
                                       "to /app/double.txt."}
        second = observations[2][0]["content"]
        assert "staged" in second and "from step two" in second and "42\n65534" in second
        assert "target" not in second and "expected" not in second and "reward" not in second
        # nothing the step's verifier left (files in /tmp or /dev/shm, processes) is there
        assert "verifier-leftover" not in second and "sleeping=1" in second  # the sandbox's own sleep
        grade = env.last_grade
        assert [(s["step"], s["reward"]) for s in grade["steps"]] == [("one", 1.0), ("two", 1.0)]
        assert (grade["strategy"], grade["rewards"], grade["steps_total"]) == ("mean", {"reward": 1.0}, 2)

        # a step below its min_reward ends the episode; mean counts only the graded steps
        reward, observations = play_steps(env, [SUBMIT])
        assert reward == 0.0 and [s["step"] for s in env.last_grade["steps"]] == ["one"]

        # the oracle plays every step
        assert oracle(env) == 1.0
        assert [s["reward"] for s in env.last_grade["steps"]] == [1.0, 1.0]
    finally:
        env.close()


def test_multi_step_final_strategy_takes_the_last_step(tasks: Path) -> None:
    env = HarborEnv(path=write_steps_task(tasks, "steps-final", strategy="final"))
    try:
        reward, _ = play_steps(env, [bash("echo 42 > /app/sum.txt"), SUBMIT,
                                     bash("echo 85 > /app/double.txt"), SUBMIT])
        assert reward == 0.0 and env.last_grade["rewards"] == {"reward": 0.0}
        assert [s["reward"] for s in env.last_grade["steps"]] == [1.0, 0.0]
    finally:
        env.close()


@pytest.fixture(scope="module")
def egress_network() -> Iterator[tuple[str, dict[str, str]]]:
    """A Docker network with two HTTP servers on it: (network, server name -> address)."""
    import secrets

    from agentrl.sandbox.docker import get_client

    client = get_client(None)
    suffix = secrets.token_hex(3)
    network = client.networks.create(f"agentrl-test-egress-{suffix}", labels={"agentrl.test": "1"})
    servers = []
    try:
        for side in ("agentside", "verifierside"):
            servers.append(client.containers.run(
                BASE, ["python3", "-m", "http.server", "8000"], name=f"{side}-{suffix}", detach=True,
                network=network.name, labels={"agentrl.test": "1"}, cap_drop=["ALL"]))
        addresses = {}
        for server in servers:
            server.reload()
            addresses[server.name] = server.attrs["NetworkSettings"]["Networks"][network.name]["IPAddress"]
        yield network.name, addresses
    finally:
        for server in servers:
            server.remove(force=True)
        network.remove()


PHASES_TOML = """\
schema_version = "1.4"
[task]
name = "test/phases"
[environment]
network_mode = "no-network"
[agent]
network_mode = "allowlist"
allowed_hosts = ["{agent_host}"]
[verifier]
network_mode = "allowlist"
allowed_hosts = ["{verifier_host}"]
[[steps]]
name = "only"
"""
# Prints "<target> ok" or "<target> blocked" for each host name or address given.
PROBE = """\
import sys, urllib.request
for target in sys.argv[1:]:
    try:
        urllib.request.urlopen(f"http://{target}:8000/", timeout=5)
        print(target, "ok")
    except Exception:
        print(target, "blocked")
"""


@pytest.mark.skipif(egress_unsupported() is not None, reason=str(egress_unsupported()))
@pytest.mark.parametrize("verifier_mode", ["shared", "separate"])
def test_each_phase_reaches_only_its_own_allowed_hosts(tasks: Path, egress_network: tuple[str, dict[str, str]],
                                                       verifier_mode: str) -> None:
    network, addresses = egress_network
    agent_host, verifier_host = sorted(addresses)  # agentside-..., verifierside-...
    targets = " ".join([agent_host, verifier_host, addresses[agent_host], addresses[verifier_host]])
    verifier_expects = "\\n".join([f"{agent_host} blocked", f"{verifier_host} ok",
                                    f"{addresses[agent_host]} blocked", f"{addresses[verifier_host]} ok"])
    task = tasks / f"phases-{verifier_mode}"
    toml = PHASES_TOML.format(agent_host=agent_host, verifier_host=verifier_host)
    if verifier_mode == "separate":  # the verifier's own container is held to its allowlist
        toml = toml.replace("[verifier]\n", '[verifier]\nenvironment_mode = "separate"\n')
    files = {
        "task.toml": toml,
        "environment/Dockerfile": f"FROM {BASE}\nWORKDIR /app\nCOPY probe.py /opt/probe.py\n",
        "environment/probe.py": PROBE,
        # the verifier passes when it reaches its host and not the agent's, by name or address
        "tests/test.sh": f"python3 /opt/probe.py {targets} > /tmp/seen\n"
                         f"if [ \"$(cat /tmp/seen)\" = \"$(printf '{verifier_expects}')\" ]; then "
                         "echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; "
                         "cat /tmp/seen; fi\n",
        # setup.sh runs under [environment]: no network at all
        "steps/only/workdir/setup.sh": f"python3 /opt/probe.py {targets} > setup-seen.txt\n",
        "steps/only/instruction.md": "Probe the network.\n",
        "steps/only/solution/solve.sh": "true\n",
    }
    for rel, text in files.items():
        (task / rel).parent.mkdir(parents=True, exist_ok=True)
        (task / rel).write_text(text)
    env = HarborEnv(path=task, egress_network=network)
    try:
        reward, outputs, _ = play(env, [
            bash(f"cat /app/setup-seen.txt; echo ---; python3 /opt/probe.py {targets}"), SUBMIT])
        setup_seen, agent_seen = outputs[0].split("---")
        assert setup_seen.split() == [agent_host, "blocked", verifier_host, "blocked",
                                      addresses[agent_host], "blocked", addresses[verifier_host], "blocked"]
        assert agent_seen.split() == [agent_host, "ok", verifier_host, "blocked",
                                      addresses[agent_host], "ok", addresses[verifier_host], "blocked"]
        assert reward == 1.0, env.last_grade["output_tail"]
        assert env.last_grade["steps"][0].get("verifier", "shared") == verifier_mode
        assert "network access only to " + agent_host in env.messages[0]["content"]
    finally:
        env.close()


def test_the_environment_healthcheck_is_waited_for_and_a_failing_one_is_named(tasks: Path) -> None:
    ready = write_task(tasks, "healthy")
    # fails until its second run (it leaves a mark on the first), as a slow start would
    toml = (ready / "task.toml").read_text() + (
        '[environment.healthcheck]\ncommand = "test -f /app/.up || { touch /app/.up; false; }"\n'
        "interval_sec = 0.1\nretries = 3\n")
    (ready / "task.toml").write_text(toml)
    env = HarborEnv(path=ready)
    try:
        _, outputs, _ = play(env, [bash("ls -A /app"), SUBMIT])
        assert ".up" in outputs[0]
    finally:
        env.close()
    broken = write_task(tasks, "unhealthy")
    (broken / "task.toml").write_text((broken / "task.toml").read_text() + (
        '[environment.healthcheck]\ncommand = "echo not yet >&2; false"\ninterval_sec = 0.1\nretries = 2\n'))
    env = HarborEnv(path=broken)
    try:
        with pytest.raises(HarborTaskError, match=r"environment.healthcheck: 'echo not yet >&2; false' failed 2 "
                                                  r"times in a row \(exit 1\): not yet"):
            play(env, [SUBMIT])
    finally:
        env.close()
