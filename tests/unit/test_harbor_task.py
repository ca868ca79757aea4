"""Reading Harbor task directories (task.toml schema 1.x): every malformed input is an error
naming the task, the file and the field. Reward files: tests/unit/test_harbor_rewards.py."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from agentrl_envs.harbor import SHIPPED_TASKS, HarborTaskError, load_task, load_tasks
from agentrl_envs.harbor.images import from_lines, image_tag
from agentrl_envs.harbor.task import NetworkPolicy

TOML = """\
schema_version = "1.4"

[task]
name = "acme/sum-csv"
version = "2.1"
description = "Sum a column."

[verifier]
timeout_sec = 45.0
env = { MODE = "strict" }

[agent]
timeout_sec = 300

[environment]
build_timeout_sec = 120
cpus = 2
memory_mb = 2048
storage_mb = 512
network_mode = "no-network"
workdir = "/app"

[[environment.mcp_servers]]
name = "files"
transport = "stdio"
command = "mcp-files"
args = ["--root", "/app"]

[[environment.mcp_servers]]
name = "search"
transport = "http"
url = "http://127.0.0.1:9/mcp"
"""


def make_task(root: Path, toml: str = TOML, *, name: str = "t", files: dict[str, str] | None = None) -> Path:
    task = root / name
    defaults = {
        "task.toml": toml,
        "instruction.md": "<!-- canary GUID 123 -->\n\nSum the column.\n",
        "environment/Dockerfile": "FROM agentrl-base:bookworm-py3-v2\nWORKDIR /app\n",
        "tests/test.sh": "echo 1 > /logs/verifier/reward.txt\n",
        "solution/solve.sh": "true\n",
    }
    for rel, text in {**defaults, **(files or {})}.items():
        if text is None:
            continue
        (task / rel).parent.mkdir(parents=True, exist_ok=True)
        (task / rel).write_text(text)
    return task


def test_every_field_is_read(tmp_path: Path) -> None:
    task = load_task(make_task(tmp_path))
    assert (task.name, task.version, task.schema_version) == ("acme/sum-csv", "2.1", "1.4")
    assert task.instruction == "Sum the column."  # the canary line is dropped, as Harbor does
    assert (task.agent_timeout_s, task.verifier_timeout_s, task.build_timeout_s) == (300, 45.0, 120)
    assert dict(task.verifier_env) == {"MODE": "strict"}
    assert (task.cpus, task.memory_mb, task.storage_mb) == (2, 2048, 512)
    assert (task.network_mode, task.network_mode_set, task.workdir) == ("no-network", True, "/app")
    stdio, http = task.mcp_servers
    assert (stdio.name, stdio.transport, stdio.command, stdio.args) == ("files", "stdio", "mcp-files", ("--root", "/app"))
    assert (http.transport, http.url) == ("streamable-http", "http://127.0.0.1:9/mcp")
    assert task.has_solution
    assert task.row()["id"] == "acme/sum-csv"


def test_defaults_follow_harbor(tmp_path: Path) -> None:
    task = load_task(make_task(tmp_path, "[task]\nname = \"a/b\"\n"))
    assert task.schema_version == "1.4"
    assert task.verifier_timeout_s == 600.0 and task.build_timeout_s == 600.0
    assert task.agent_timeout_s is None
    assert (task.network_mode, task.network_mode_set) == ("public", False)  # Harbor's default
    legacy = load_task(make_task(tmp_path, "version = \"1.0\"\n[environment]\nallow_internet = false\n", name="l"))
    assert (legacy.schema_version, legacy.network_mode, legacy.name) == ("1.0", "no-network", "l")


@pytest.mark.parametrize(("toml", "files", "expected"), [
    ('schema_version = "2.0"\n', {}, "task.toml: schema_version: unknown schema version '2.0'"),
    ("schema_version = [\n", {}, "task.toml is not valid TOML"),
    ('[task]\nname = "no-org"\n', {}, "task.toml: task.name: 'no-org' is not in 'org/name' form"),
    ("[agent]\ntimeout_sec = -1\n", {}, "task.toml: agent.timeout_sec: must be a positive number"),
    ("[environment]\nmemory_mb = 1.5\n", {}, "environment.memory_mb: must be a positive integer"),
    ('[environment]\nnetwork_mode = "lan"\n', {}, "environment.network_mode: 'lan' is not one of"),
    ('[environment]\nworkdir = "app"\n', {}, "environment.workdir: must be an absolute path"),
    ('[verifier]\nenvironment_mode = "apart"\n', {}, "verifier.environment_mode: 'apart' is not 'shared' or 'separate'"),
    ('[verifier]\nenvironment_mode = "shared"\n[verifier.environment]\ncpus = 1\n', {},
     "verifier.environment: a verifier environment needs environment_mode"),
    ('[verifier.environment]\ngpus = 1\n', {}, "verifier.environment.gpus: GPU tasks are not supported"),
    ('artifacts = ["relative/path"]\n', {}, "artifacts[0].source: 'relative/path' must be an absolute path"),
    ('[[artifacts]]\nsource = "/a"\nservice = "db"\n', {}, "artifacts[0].service: artifacts of another"),
    ('[[verifier.collect]]\ncommand = "x"\nservice = "db"\n', {}, "verifier.collect[0].service: collect hooks"),
    ('[[verifier.collect]]\ntimeout_sec = 3\n', {}, "verifier.collect[0].command: is required"),
    ('[environment]\nos = "Windows"\n', {}, "environment.os: Windows tasks are not supported"),
    ("[environment]\ngpus = 1\n", {}, "environment.gpus: GPU tasks are not supported"),
    ("[[steps]]\nname = \"one\"\n", {}, "steps/one/ is missing"),
    ('[[steps]]\nname = "one"\n', {"steps/one/tests/x": ""}, "steps/one/instruction.md is missing"),
    ('[[steps]]\nname = "a/b"\n', {}, "task.toml: steps[0].name: 'a/b' is not a portable directory name"),
    ('[[steps]]\nname = "One"\n[[steps]]\nname = "one"\n', {"steps/One/instruction.md": "x"},
     "steps[1].name: 'one' repeats step 'One'"),
    ('[[steps]]\nname = "one"\nmin_reward = "high"\n', {"steps/one/instruction.md": "x"},
     "steps[0].min_reward: must be a number or a table of numbers"),
    ('multi_step_reward_strategy = "max"\n', {}, "multi_step_reward_strategy: 'max' is not one of"),
    ('[[steps]]\nname = "one"\n', {"steps/one/instruction.md": "x", "tests/test.sh": None, "tests/a": ""},
     "steps/one/tests/test.sh is missing, and so is tests/test.sh"),
    ("steps = 3\n", {}, "task.toml: steps: must be an array of tables"),
    ("[environment.healthcheck]\ninterval_sec = 1\n", {}, "environment.healthcheck.command: is required"),
    ('[environment.healthcheck]\ncommand = "true"\nretries = 0\n', {}, "environment.healthcheck.retries: must be"),
    ('[environment]\nallowed_hosts = ["a.com"]\n', {}, "environment.allowed_hosts: is only valid with network_mode"),
    ('[agent]\nallowed_hosts = ["a.com"]\n', {}, "agent.allowed_hosts: is only valid with network_mode"),
    ('[verifier]\nnetwork_mode = "allowlist"\nallowed_hosts = ["https://a.com/x"]\n', {},
     "verifier.allowed_hosts: 'https://a.com/x': entries are hostnames, IP addresses or CIDR blocks"),
    ('[agent]\nnetwork_mode = "allowlist"\nallowed_hosts = ["a.com:443"]\n', {}, "not URLs, ports or paths"),
    ('[agent]\nnetwork_mode = "allowlist"\nallowed_hosts = ["*.10.0.0.1"]\n', {}, "a wildcard names hostnames"),
    ('[agent]\nnetwork_mode = "allowlist"\nallowed_hosts = ["a_b.com"]\n', {}, "'a_b.com' is not a hostname"),
    ('[agent]\nnetwork_mode = "intranet"\n', {}, "agent.network_mode: 'intranet' is not one of"),
    ('[[environment.mcp_servers]]\nname = "x"\ntransport = "stdio"\n', {},
     "environment.mcp_servers[0].command: is required for transport 'stdio'"),
    ('[[environment.mcp_servers]]\nname = "x"\n', {}, "environment.mcp_servers[0].url: is required for transport 'sse'"),
    ("", {"instruction.md": None}, "instruction.md is missing"),
    ("", {"tests/test.sh": None, "tests/other": "x"}, "tests/test.sh is missing"),
    ("", {"environment/Dockerfile": None, "environment/x": ""}, "environment/Dockerfile is missing"),
    ("", {"environment/docker-compose.yaml": "services: {}\n"},
     "environment/docker-compose.yaml: needs a 'services' mapping"),
    ("", {"environment/docker-compose.yaml": "services:\n  db:\n    image: x\n"},
     "docker-compose.yaml: services: the agent's service must be named 'main'"),
    ("", {"environment/docker-compose.yaml": "services:\n  main: {}\n  db:\n    image: x\n    privileged: true\n"},
     "services.db.privileged: extra privileges are not granted"),
    ("", {"environment/docker-compose.yaml": "services:\n  main: {}\n  db:\n    image: x\n    volumes: [/:/host]\n"},
     "services.db.volumes: volumes and host binds are not supported"),
    ("", {"environment/docker-compose.yaml": "services:\n  main: {}\n  db:\n    image: x\n    ports: ['80:80']\n"},
     "services.db.ports: no port is published on the host"),
    ("", {"environment/docker-compose.yaml": "services:\n  main:\n    image: other\n"},
     "services.main.image: main is agentrl's sandbox"),
    ("", {"environment/docker-compose.yaml": "services:\n  main: {}\n  db:\n    image: pg\n"
          "    environment: [\"PASSWORD=${SECRET}\"]\n"}, "services.db: variable interpolation"),
    ("", {"environment/docker-compose.yaml": "services:\n  main:\n    depends_on: [db]\n  db:\n    image: x\n"
          "    depends_on: [api]\n  api:\n    image: x\n    depends_on:\n      db: {condition: service_healthy}\n"},
     "depends_on has a cycle: db -> api -> db"),
    ("", {"environment/docker-compose.yaml": "services:\n  main: {}\n  db:\n    build: ../..\n"},
     "services.db.build: '../..' leaves environment/"),
    ("", {"environment/docker-compose.yaml": "services:\n  main: {}\n  db:\n    image: x\n"
          "    healthcheck: {test: [CMD, echo], interval: soon}\n"}, "healthcheck.interval: 'soon' is not a duration"),
    ("", {"instruction.md": "<!-- canary -->\n\n"}, "instruction.md is empty"),
])
def test_bad_tasks_name_task_file_and_field(tmp_path: Path, toml: str, files: dict[str, str | None], expected: str) -> None:
    task = make_task(tmp_path, toml, files=files)
    with pytest.raises(HarborTaskError) as error:
        load_task(task)
    assert expected in str(error.value)
    assert str(task) in str(error.value)


MULTI_STEP = """\
schema_version = "1.4"
multi_step_reward_strategy = "final"
[task]
name = "acme/two-steps"
[environment]
network_mode = "allowlist"
allowed_hosts = ["PyPI.org.", "*.example.com", "10.1.0.0/16", "2001:DB8::1"]
[agent]
timeout_sec = 300
network_mode = "no-network"
[verifier]
timeout_sec = 45.0
env = { MODE = "strict", LEVEL = "1" }

[environment.healthcheck]
command = "test -f /app/ready"
interval_sec = 0.5
retries = 5

[[steps]]
name = "first"
min_reward = { reward = 1.0, style = 0.5 }
healthcheck = { command = "true", start_period_sec = 2 }
[steps.agent]
timeout_sec = 60
[steps.verifier]
env = { LEVEL = "2" }

[[steps]]
name = "second"
[steps.agent]
network_mode = "allowlist"
allowed_hosts = ["api.internal"]
[steps.verifier]
timeout_sec = 30
network_mode = "public"
[steps.verifier.environment]
docker_image = "agentrl-base:bookworm-py3-v2"
memory_mb = 512
"""


def test_multi_step_tasks_are_read(tmp_path: Path) -> None:
    task = load_task(make_task(tmp_path, MULTI_STEP, files={
        "instruction.md": None,  # a multi-step task has none at the root
        "steps/first/instruction.md": "<!-- canary -->\nDo one.\n",
        "steps/first/tests/test_one.py": "", "steps/first/solution/solve.sh": "true\n",
        "steps/first/workdir/setup.sh": "touch ready\n",
        "steps/second/instruction.md": "Do two.\n",
    }))
    root = tmp_path / "t"
    assert (task.multi_step, task.reward_strategy, task.instruction) == (True, "final", "Do one.")
    first, second = task.steps
    assert (first.name, first.instruction, second.instruction) == ("first", "Do one.", "Do two.")
    # the step's own tests go over the root ones; the root solution serves a step without one
    assert first.tests_dirs == (root / "tests", root / "steps/first/tests")
    assert second.tests_dirs == (root / "tests",)
    assert (first.solution_dir, second.solution_dir) == (root / "steps/first/solution", root / "solution")
    assert (first.workdir_dir, first.has_setup, second.workdir_dir) == (root / "steps/first/workdir", True, None)
    assert (first.agent_timeout_s, second.agent_timeout_s) == (60, 300)  # else the task's [agent]
    assert (first.verifier_timeout_s, second.verifier_timeout_s) == (600.0, 30)  # Harbor's default
    assert dict(first.verifier_env) == {"MODE": "strict", "LEVEL": "2"}
    assert (first.min_reward, second.min_reward) == ({"reward": 1.0, "style": 0.5}, None)
    assert task.has_solution
    assert (task.healthcheck.command, task.healthcheck.interval_s, task.healthcheck.retries) == ("test -f /app/ready", 0.5, 5)
    assert (first.healthcheck.start_period_s, first.healthcheck.timeout_s, second.healthcheck) == (2.0, 30.0, None)
    # network: the environment's baseline, normalised as Harbor does; a phase table overrides
    # it, a step's table overrides the task's
    baseline = NetworkPolicy("allowlist", ("pypi.org", "*.example.com", "10.1.0.0/16", "2001:db8::1"))
    assert (task.network_mode, task.allowed_hosts) == (baseline.mode, baseline.allowed_hosts)
    assert (first.agent_network, first.verifier_network) == (NetworkPolicy("no-network"), baseline)
    assert second.agent_network == NetworkPolicy("allowlist", ("api.internal",))
    assert second.verifier_network == NetworkPolicy("public")
    assert first.passes({"reward": 1.0, "style": 0.5}) and not first.passes({"reward": 1.0})
    assert second.passes({}) and not dataclasses.replace(second, min_reward=0.5).passes({"reward": 0.25})


def test_a_single_step_task_is_one_step_of_the_root_files(tmp_path: Path) -> None:
    task = load_task(make_task(tmp_path))
    (step,) = task.steps
    assert (task.multi_step, step.name, step.instruction) == (False, "", task.instruction)
    assert (step.tests_dirs, step.solution_dir) == ((task.tests_dir,), task.solution_dir)
    assert (step.agent_timeout_s, step.verifier_timeout_s, step.min_reward) == (300, 45.0, None)


def test_a_folder_of_tasks(tmp_path: Path) -> None:
    for name in ("b", "a"):
        make_task(tmp_path, f'[task]\nname = "org/{name}"\n', name=name)
    (tmp_path / "notes").mkdir()  # no task.toml: not a task
    assert [t.name for t in load_tasks(tmp_path)] == ["org/a", "org/b"]
    assert [t.name for t in load_tasks(tmp_path / "a")] == ["org/a"]
    make_task(tmp_path, '[task]\nname = "org/a"\n', name="c")
    with pytest.raises(HarborTaskError, match="are both named 'org/a'"):
        load_tasks(tmp_path)
    with pytest.raises(HarborTaskError, match="no task in"):
        load_tasks(tmp_path / "notes")
    with pytest.raises(HarborTaskError, match="is not a directory"):
        load_tasks(tmp_path / "missing")


def test_shipped_tasks_load() -> None:
    tasks = load_tasks(SHIPPED_TASKS)
    assert len(tasks) >= 12
    for task in tasks:
        assert task.name.startswith("agentrl/")
        assert task.network_mode == "no-network" and task.has_solution
        assert from_lines((task.environment_dir / "Dockerfile").read_text())[0][1] == "agentrl-base:bookworm-py3-v2"


def test_image_tag_follows_the_environment_folder(tmp_path: Path) -> None:
    task_dir = make_task(tmp_path)
    first = image_tag(load_task(task_dir))
    assert first == image_tag(load_task(task_dir))
    assert first != image_tag(load_task(task_dir), base_image="other:1")
    assert first.startswith("agentrl-harbor-acme-sum-csv:")
    (task_dir / "tests" / "test.sh").write_text("echo changed\n")  # tests are not in the image
    assert image_tag(load_task(task_dir)) == first
    (task_dir / "environment" / "data.txt").write_text("x")
    with_data = image_tag(load_task(task_dir))
    assert with_data != first
    (task_dir / "environment" / "data.txt").chmod(0o755)  # the execute bits count too
    assert image_tag(load_task(task_dir)) not in (first, with_data)


def test_from_lines() -> None:
    text = "FROM --platform=linux/amd64 python:3.12 AS build\nRUN x\nfrom build\nFROM scratch\n"
    assert from_lines(text) == [(1, "python:3.12", "build"), (3, "build", None), (4, "scratch", None)]


def test_env_options_are_checked_when_it_is_made(tmp_path: Path) -> None:
    from agentrl_envs.harbor import HarborEnv

    task = make_task(tmp_path)
    assert HarborEnv(path=task, tools="bash,submit", sandbox="docker").toolbox.names == ["bash", "submit"]
    assert HarborEnv(path=task, sandbox="docker").toolbox.names == ["bash", "editor", "search", "submit"]
    with pytest.raises(ValueError, match="unknown tool 'shell' for harbor-v0"):
        HarborEnv(path=task, tools=["shell"], sandbox="docker")
    with pytest.raises(ValueError, match="network must be one of"):
        HarborEnv(path=task, network="lan", sandbox="docker")
    with pytest.raises(ValueError, match="use sandbox='docker'"):
        HarborEnv(path=task, sandbox="process")
    sse = make_task(tmp_path, TOML + '\n[[environment.mcp_servers]]\nname = "s"\nurl = "http://127.0.0.1:9/sse"\n', name="sse")
    with pytest.raises(HarborTaskError, match="the 'sse' transport .* is not supported"):
        HarborEnv(path=sse, sandbox="docker")


def test_step_rewards_combine_as_harbor_combines_them(tmp_path: Path) -> None:
    from agentrl.errors import GradingError
    from agentrl_envs.harbor.env import combine_steps

    task = load_task(make_task(tmp_path))
    graded = [{"reward": 1.0, "rewards": {"reward": 1.0, "style": 0.5}},
              {"reward": 0.0, "rewards": {"reward": 0.0}}]
    # mean: per entry over the graded steps, an entry a step lacks counting 0
    assert combine_steps(task, graded) == (0.5, {"reward": 0.5, "style": 0.25})
    final = dataclasses.replace(task, reward_strategy="final")
    assert combine_steps(final, graded) == (0.0, {"reward": 0.0})
    assert combine_steps(task, [{"reward": 3, "rewards": {"score": 3}}]) == (3.0, {"score": 3.0})
    with pytest.raises(GradingError, match="no entry named 'reward'"):
        combine_steps(task, [{"reward": 1, "rewards": {"a": 1}}, {"reward": 1, "rewards": {"b": 1}}])


def test_a_separate_verifier_is_resolved_as_harbor_resolves_it(tmp_path: Path) -> None:
    from agentrl_envs.harbor.task import ARTIFACTS_DIR, Artifact

    plain = load_task(make_task(tmp_path, 'artifacts = ["/app/out"]\n[verifier]\nenvironment_mode = "separate"\n'
                                "[environment]\ncpus = 2\nnetwork_mode = \"no-network\"\n"))
    (step,) = plain.steps
    verifier = step.verifier_environment
    # no image of its own: built from environment/, with the tests copied in; [environment]'s settings
    assert (verifier.context_label, verifier.bundled_tests, verifier.settings.cpus) == ("environment", False, 2)
    assert step.artifacts == (Artifact("/app/out"), Artifact(ARTIFACTS_DIR))
    assert step.verifier_network == NetworkPolicy("no-network")

    table = load_task(make_task(tmp_path, '[verifier.environment]\nmemory_mb = 256\nnetwork_mode = "allowlist"\n'
                                'allowed_hosts = ["grader.db"]\n[[verifier.collect]]\ncommand = "ls"\nuser = 0\n',
                                name="b", files={"tests/Dockerfile": "FROM agentrl-base:bookworm-py3-v2\n"}))
    (step,) = table.steps
    verifier = step.verifier_environment
    # a [verifier.environment] table means separate; a Dockerfile in tests/ holds the tests
    assert (verifier.context_label, verifier.bundled_tests, verifier.settings.memory_mb) == ("tests", True, 256)
    assert step.verifier_network == NetworkPolicy("allowlist", ("grader.db",))  # its own baseline
    assert step.collect[0].command == "ls" and step.collect[0].user == "0"
    shared = load_task(make_task(tmp_path, '[verifier]\nenvironment_mode = "shared"\n', name="c"))
    assert shared.steps[0].verifier_environment is None and shared.steps[0].artifacts == ()


def test_a_compose_file_is_read(tmp_path: Path) -> None:
    compose = """\
services:
  main:
    build: .
    environment: {API_URL: "http://api:8000", DEBUG: true}
    depends_on:
      api: {condition: service_healthy}
  api:
    build: {context: api, dockerfile: Dockerfile.api}
    command: ["python3", "-m", "http.server", "8000"]
    environment: [MODE=test, COST=$$5]
    healthcheck:
      test: python3 -c 'print(1)'
      interval: 1s
      timeout: 1m30s
      retries: 3
    depends_on: [seed]
  seed:
    image: agentrl-base:bookworm-py3-v2
    command: "true"
"""
    task = load_task(make_task(tmp_path, files={"environment/docker-compose.yaml": compose,
                                                "environment/api/Dockerfile.api": "FROM agentrl-base:bookworm-py3-v2\n"}))
    spec = task.compose
    assert dict(spec.main_environment) == {"API_URL": "http://api:8000", "DEBUG": "true"}
    assert dict(spec.main_depends_on) == {"api": "service_healthy"}
    api, seed = spec.services
    assert (api.build_context, api.dockerfile, api.image) == (task.environment_dir / "api", "Dockerfile.api", None)
    assert dict(api.environment) == {"MODE": "test", "COST": "$5"}  # $$ is a literal $
    assert api.healthcheck == {"test": ["CMD-SHELL", "python3 -c 'print(1)'"], "interval": 1_000_000_000,
                               "timeout": 90_000_000_000, "retries": 3}
    assert (dict(api.depends_on), seed.image, seed.command) == ({"seed": "service_started"},
                                                                "agentrl-base:bookworm-py3-v2", "true")
    from agentrl_envs.harbor.compose import start_order

    assert [s.name for s in start_order(spec)] == ["seed", "api"]
