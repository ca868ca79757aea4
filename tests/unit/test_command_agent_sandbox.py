"""What a sandboxed command agent sees of the host: the programs its command runs (their
folders, read-only), never the current directory; and the flags that choose it."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from agentrl.errors import ConfigError
from agentrl.rollout.agents import python_dirs, sandboxed_command
from agentrl.rollout.config import RolloutConfig


@pytest.fixture
def project(tmp_path: Path) -> Path:
    (tmp_path / "agents").mkdir()
    (tmp_path / "agents" / "agent.py").write_text("print(1)\n")
    (tmp_path / "run.sh").write_text("echo hi\n")
    (tmp_path / "notes.txt").write_text("private\n")
    return tmp_path


def test_a_program_in_a_subfolder_is_bound_and_its_path_made_absolute(project):
    command, binds, hidden = sandboxed_command("python agents/agent.py --turns 3 | tee out", str(project))
    assert command == f"python {project}/agents/agent.py --turns 3 | tee out"
    assert binds == [f"{project}/agents"] and hidden == []


def test_only_the_programs_a_command_runs_are_made_visible(project):
    command, binds, hidden = sandboxed_command(
        f"cat {project}/notes.txt && bash run.sh; python3 -u agents/agent.py", str(project))
    # cat's argument is not a program: neither bound nor rewritten; run.sh lies in the
    # current directory itself: hidden; the interpreter's option comes before its program
    assert binds == [f"{project}/agents"] and hidden == ["run.sh"]
    assert command == f"cat {project}/notes.txt && bash run.sh; python3 -u {project}/agents/agent.py"
    _, binds, _ = sandboxed_command("python -m agents.agent -c x", str(project))
    assert binds == []  # a module, not a file: python finds it (installed) or says it cannot


def test_a_program_named_first_or_after_a_pipe_counts(project):
    command, binds, _ = sandboxed_command("agents/agent.py | agents/agent.py", str(project))
    assert binds == [f"{project}/agents"]
    assert command == f"{project}/agents/agent.py | {project}/agents/agent.py"


def test_this_pythons_folders_are_the_ones_it_runs_from():
    dirs = python_dirs()
    assert any(sys.executable.startswith(d) for d in dirs) and "/" not in dirs


def test_agent_on_host_needs_an_agent_command():
    with pytest.raises(ConfigError, match="--agent-on-host says where --agent-command runs"):
        RolloutConfig(env="calc", agent_on_host=True).validate()
    RolloutConfig(env="calc", agent_on_host=True, agent_command="true").validate()
