"""Reading Harbor task directories (task.toml schema 1.x): every malformed input is an error
naming the task, the file and the field. Reward files: tests/unit/test_harbor_rewards.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from agentrl_envs.harbor import SHIPPED_TASKS, HarborTaskError, load_task, load_tasks
from agentrl_envs.harbor.images import from_lines, image_tag

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
    ('[verifier]\nenvironment_mode = "separate"\n', {}, "verifier.environment_mode: a separate verifier"),
    ('[environment]\nos = "Windows"\n', {}, "environment.os: Windows tasks are not supported"),
    ("[environment]\ngpus = 1\n", {}, "environment.gpus: GPU tasks are not supported"),
    ("[[steps]]\nname = \"one\"\n", {}, "task.toml: steps: multi-step tasks are not supported"),
    ('[[environment.mcp_servers]]\nname = "x"\ntransport = "stdio"\n', {},
     "environment.mcp_servers[0].command: is required for transport 'stdio'"),
    ('[[environment.mcp_servers]]\nname = "x"\n', {}, "environment.mcp_servers[0].url: is required for transport 'sse'"),
    ("", {"instruction.md": None}, "instruction.md is missing"),
    ("", {"tests/test.sh": None, "tests/other": "x"}, "tests/test.sh is missing"),
    ("", {"environment/Dockerfile": None, "environment/x": ""}, "environment/Dockerfile is missing"),
    ("", {"environment/docker-compose.yaml": "services: {}\n"}, "docker-compose.yaml: multi-container"),
    ("", {"instruction.md": "<!-- canary -->\n\n"}, "instruction.md is empty"),
])
def test_bad_tasks_name_task_file_and_field(tmp_path: Path, toml: str, files: dict[str, str | None], expected: str) -> None:
    task = make_task(tmp_path, toml, files=files)
    with pytest.raises(HarborTaskError) as error:
        load_task(task)
    assert expected in str(error.value)
    assert str(task) in str(error.value)


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
