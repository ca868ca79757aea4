"""The built-in sandbox tools (bash, python, editor, search, run_tests, submit) driven through
``SandboxedToolEnv.step`` on a tiny buggy project, on the bwrap backend (and one episode on
docker)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import pytest

from agentrl import EpisodeState, SandboxedToolEnv
from agentrl.env import register_episode_resource
from agentrl.sandbox import Sandbox
from agentrl_tools._common import MAX_OUTPUT_CHARS
from agentrl_tools.bash import bash
from agentrl_tools.editor import editor
from agentrl_tools.python_tool import python
from agentrl_tools.run_tests import run_tests
from agentrl_tools.search import search
from agentrl_tools.submit import submit
from tests.support.sandboxes import backend_skip_reason

CALC = """\
def add(a, b):
    return a - b


def mul(a, b):
    return a * b
"""

TESTS = """\
from calc import add, mul


def test_add():
    assert add(1, 2) == 3


def test_mul():
    assert mul(2, 3) == 6
"""

CUT = "more characters cut ...]"


class ProjectEnv(SandboxedToolEnv):
    """Fix calc.py so that the tests pass."""

    tools = (bash, python, editor, search, run_tests, submit)
    default_max_turns = 100

    def sample_task(self) -> dict[str, Any]:
        return {"visible_tests": "tests"}

    def make_prompt(self, task: Mapping[str, Any]) -> list[dict[str, str]]:
        return [{"role": "user", "content": "Fix calc.py so that the tests pass, then submit."}]

    async def prepare_sandbox(self, sandbox: Sandbox, task: Mapping[str, Any]) -> None:
        await sandbox.write_file("calc.py", CALC)
        await sandbox.write_file("tests/test_calc.py", TESTS)

    async def compute_reward(
        self, task: Mapping[str, Any], final: Mapping[str, Any], state: EpisodeState
    ) -> float:
        assert self.sandbox is not None
        result = await self.sandbox.exec(
            ["python3", "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"], timeout=60
        )
        return 1.0 if result.ok else 0.0


def _make_env(backend: str) -> ProjectEnv:
    reason = backend_skip_reason(backend)
    if reason:
        pytest.skip(reason)
    return ProjectEnv(sandbox=backend)


@pytest.fixture(scope="module")
def module_env() -> Iterator[ProjectEnv]:
    env = _make_env("bwrap")
    yield env
    env.close()


@pytest.fixture
def env(module_env: ProjectEnv) -> ProjectEnv:
    module_env.reset()  # a fresh sandbox and project per test (closes the previous episode)
    return module_env


def step(env: ProjectEnv, name: str, **arguments: Any) -> tuple[str, float, bool]:
    """Plays one turn calling ``name``; returns (tool result, reward, terminated)."""
    action = {"role": "assistant", "content": "", "tool_calls": [{"name": name, "arguments": arguments}]}
    obs, reward, terminated, truncated, info = env.step(action)
    assert info["tool_errors"] == {}, obs  # model mistakes are results, never tool errors
    assert not truncated
    return obs[0]["content"], reward, terminated


def call(env: ProjectEnv, name: str, **arguments: Any) -> str:
    text, _, terminated = step(env, name, **arguments)
    assert not terminated
    assert len(text) <= MAX_OUTPUT_CHARS
    return text


def test_schemas_hide_injected_parameters() -> None:
    props = {t.name: set(t.parameters["properties"]) for t in ProjectEnv.tools}
    assert props == {
        "bash": {"command", "timeout"},
        "python": {"code", "timeout"},
        "editor": {"command", "path", "file_text", "old_str", "new_str", "insert_line", "view_range"},
        "search": {"pattern", "path", "glob", "files_only", "max_results"},
        "run_tests": {"path", "timeout"},
        "submit": set(),
    }
    assert editor.parameters["properties"]["command"]["enum"] == [
        "view", "create", "str_replace", "insert", "undo_edit"
    ]


def test_bash_state_persists_and_timeouts_are_reported(env: ProjectEnv) -> None:
    assert call(env, "bash", command="cd tests && export GREETING=hello") == "(no output)"
    assert call(env, "bash", command="pwd; echo $GREETING; ls") == (
        "/workspace/tests\nhello\ntest_calc.py"
    )
    assert call(env, "bash", command="echo oops >&2; (exit 3)") == "oops\n[exit code 3]"
    assert "the shell exited" in call(env, "bash", command="exit 3")
    assert call(env, "bash", command="echo $GREETING; pwd") == "/workspace"  # a new shell
    out = call(env, "bash", command="echo start; sleep 30", timeout=1)
    assert "timed out after" in out and "killed" in out
    assert call(env, "bash", command="pwd") == "/workspace"  # a fresh shell after the timeout
    assert call(env, "bash", command="true", timeout=0).startswith("Error: timeout must be")
    assert call(env, "bash", command="   ") == "Error: the command is empty"


def test_python_output_errors_and_timeout(env: ProjectEnv) -> None:
    out = call(env, "python", code="import sys\nprint('to out')\nprint('to err', file=sys.stderr)")
    assert out == "to out\nto err"
    out = call(env, "python", code="from calc import add\nprint(add(2, 2))\n1 / 0")
    assert out.startswith("0\n") and "ZeroDivisionError" in out and "[exit code 1]" in out
    assert "SyntaxError" in call(env, "python", code="def (:")
    assert "timed out" in call(env, "python", code="import time\ntime.sleep(30)", timeout=1)
    assert call(env, "python", code="x = 1") == "(no output)"


def test_editor_view_file_range_and_directory(env: ProjectEnv) -> None:
    out = call(env, "editor", command="view", path="calc.py")
    assert out.splitlines()[:2] == ["     1\tdef add(a, b):", "     2\t    return a - b"]
    assert call(env, "editor", command="view", path="/workspace/calc.py", view_range=[5, 6]) == (
        "     5\tdef mul(a, b):\n     6\t    return a * b"
    )
    assert call(env, "editor", command="view", path="calc.py", view_range=[6, -1]) == (
        "     6\t    return a * b"
    )
    out = call(env, "editor", command="view", path="calc.py", view_range=[9, 12])
    assert out.startswith("Error: view_range start 9 is out of range") and "1 to 6" in out
    call(env, "bash", command="mkdir -p a/b/c .hidden && touch a/b/c/deep.py a/top.py .hidden/x")
    listing = call(env, "editor", command="view", path=".")
    entries = listing.splitlines()[1:]
    assert entries == ["a/", "a/b/", "a/top.py", "calc.py", "tests/", "tests/test_calc.py"]
    assert "Error" in call(env, "editor", command="view", path="tests", view_range=[1, 2])
    assert "does not exist" in call(env, "editor", command="view", path="nope.py")


def test_editor_create_insert_and_undo(env: ProjectEnv) -> None:
    assert call(env, "editor", command="create", path="pkg/new.py", file_text="x = 1\n") == (
        "Created pkg/new.py (1 lines)."
    )
    assert call(env, "bash", command="cat pkg/new.py") == "x = 1"
    out = call(env, "editor", command="create", path="pkg/new.py", file_text="x = 2\ny = 3\n")
    assert out.startswith("Overwrote the existing file pkg/new.py")
    out = call(env, "editor", command="insert", path="pkg/new.py", insert_line=0, new_str="# top")
    assert "     1\t# top" in out
    call(env, "editor", command="insert", path="pkg/new.py", insert_line=3, new_str="z = 4\n")
    assert call(env, "bash", command="cat pkg/new.py") == "# top\nx = 2\ny = 3\nz = 4"
    out = call(env, "editor", command="insert", path="pkg/new.py", insert_line=9, new_str="w")
    assert out.startswith("Error: insert_line 9 is out of range") and "0 to 4" in out
    assert call(env, "editor", command="insert", path="pkg/new.py", new_str="w").startswith("Error")

    for expected in ("# top\nx = 2\ny = 3", "x = 2\ny = 3", "x = 1"):
        assert call(env, "editor", command="undo_edit", path="pkg/new.py").startswith("Reverted")
        assert call(env, "bash", command="cat pkg/new.py") == expected
    out = call(env, "editor", command="undo_edit", path="pkg/new.py")
    assert out == "Undid the creation of pkg/new.py: the file was removed."
    assert "No such file" in call(env, "bash", command="cat pkg/new.py")
    assert call(env, "editor", command="undo_edit", path="pkg/new.py").startswith(
        "Error: there is no edit of pkg/new.py to undo"
    )
    assert "file_text" in call(env, "editor", command="create", path="y.py")


def test_editor_str_replace_unique_none_and_multiple(env: ProjectEnv) -> None:
    out = call(env, "editor", command="str_replace", path="calc.py", old_str="a", new_str="x")
    assert out.startswith("Error: old_str occurs 5 times in calc.py (on lines 1, 2, 5, 6)")
    out = call(env, "editor", command="str_replace", path="calc.py", old_str="return a  - b",
               new_str="return a + b")
    assert out.startswith("Error: no match for old_str in calc.py") and "line 2" in out
    out = call(env, "editor", command="str_replace", path="calc.py", old_str="return a - b ",
               new_str="")
    assert "occurs on line(s) 2" in out
    assert call(env, "bash", command="cat calc.py") == CALC.rstrip("\n")  # nothing changed

    out = call(env, "editor", command="str_replace", path="calc.py", old_str="    return a - b",
               new_str="    return a + b")
    assert out.startswith("Edited calc.py.") and "     2\t    return a + b" in out
    assert "     1\tdef add(a, b):" in out  # context around the edited region
    assert "return a + b" in call(env, "bash", command="cat calc.py")
    call(env, "editor", command="undo_edit", path="calc.py")
    assert call(env, "bash", command="cat calc.py") == CALC.rstrip("\n")


def test_editor_refuses_paths_outside_the_workspace(env: ProjectEnv) -> None:
    for path in ("/etc/passwd", "../etc/passwd", "/workspace/../etc/passwd", "/tmp/x.py"):
        out = call(env, "editor", command="view", path=path)
        assert out.startswith("Error:") and "outside /workspace" in out, out
        out = call(env, "editor", command="create", path=path, file_text="x")
        assert out.startswith("Error:") and "outside /workspace" in out, out
    call(env, "bash", command="ln -s /etc/hostname link.txt && ln -s /etc linkdir")
    assert "symbolic link" in call(env, "editor", command="view", path="link.txt")
    out = call(env, "editor", command="create", path="linkdir/evil", file_text="x")
    assert out.startswith("Error:") and "symbolic link" in out


def test_search_contents_files_glob_and_caps(env: ProjectEnv) -> None:
    call(env, "bash", command="mkdir -p .git __pycache__ && echo 'def add' > .git/x.py "
         "&& echo 'def add' > __pycache__/c.py && echo 'def add(): pass' > notes.txt")
    out = call(env, "search", pattern=r"def (add|mul)\(")
    assert out.splitlines() == [
        "3 matches for `def (add|mul)\\(` in .:",
        "calc.py:1:def add(a, b):",
        "calc.py:5:def mul(a, b):",
        "notes.txt:1:def add(): pass",
    ]
    out = call(env, "search", pattern="def add", glob="*.py")
    assert out.splitlines()[1:] == ["calc.py:1:def add(a, b):"]
    assert call(env, "search", pattern="def add", path="tests") == "No matches for `def add` in tests."
    out = call(env, "search", pattern="test_", files_only=True)
    assert out.splitlines() == ["1 file for `test_` in .:", "tests/test_calc.py"]
    out = call(env, "search", pattern=r"\.py$", files_only=True, glob="c*")
    assert out.splitlines()[1:] == ["calc.py"]
    out = call(env, "search", pattern="a", max_results=2)
    lines = out.splitlines()
    assert lines[0].endswith("; the first 2:") and len(lines) == 4
    assert lines[-1].startswith("[... ") and "more matches not shown" in lines[-1]
    assert call(env, "search", pattern="(").startswith("Error: grep: Unmatched (")
    assert "No such file" in call(env, "search", pattern="x", path="missing")
    assert call(env, "search", pattern="x", max_results=0).startswith("Error: max_results")


def test_run_tests_fix_and_submit(env: ProjectEnv) -> None:
    out = call(env, "run_tests")
    lines = out.splitlines()
    assert lines[0] == "1 failed, 1 passed"  # no wall time: the same run reads the same
    assert lines[2] == "FAILED tests/test_calc.py::test_add"
    assert "E   assert -1 == 3" in out
    out = call(env, "editor", command="str_replace", path="calc.py", old_str="return a - b",
               new_str="return a + b")
    assert out.startswith("Edited")
    assert call(env, "run_tests") == "2 passed"
    assert call(env, "run_tests", path="tests/test_calc.py::test_mul").startswith("1 passed")
    assert "not found: nope" in call(env, "run_tests", path="nope")
    assert call(env, "run_tests", path="-x").startswith("Error: path takes test paths")

    text, reward, terminated = step(env, "submit")
    assert (text, reward, terminated) == ("Submitted.", 1.0, True)


def test_submit_without_fix_scores_zero(env: ProjectEnv) -> None:
    assert step(env, "submit") == ("Submitted.", 0.0, True)


def test_run_tests_many_failures_collection_errors_and_timeout(env: ProjectEnv) -> None:
    call(env, "editor", command="create", path="more/test_many.py", file_text=(
        "import pytest\n\n\n@pytest.mark.parametrize('n', range(12))\n"
        "def test_n(n):\n    print('captured', n)\n    assert n < 0\n"
    ))
    out = call(env, "run_tests", path="more/test_many.py")
    assert out.startswith("12 failed\n")
    assert out.count("FAILED more/test_many.py::test_n[") == 10
    assert "[... 2 more failures/errors not shown]" in out
    assert "captured 0" in out  # the end of the captured output is kept

    call(env, "editor", command="create", path="broken/test_broken.py", file_text="import nosuchmod\n")
    out = call(env, "run_tests", path="broken")
    assert out.startswith("1 error (the run was interrupted") and " in 0." not in out
    assert "ERROR broken/test_broken.py" in out and "No module named 'nosuchmod'" in out

    call(env, "editor", command="create", path="slow/test_slow.py", file_text=(
        "import time\n\n\ndef test_slow():\n    time.sleep(60)\n"
    ))
    out = call(env, "run_tests", path="slow", timeout=2)
    assert out.startswith("Timed out: the tests of slow did not finish within 2 s")


def test_outputs_are_bounded(env: ProjectEnv) -> None:
    call(env, "bash", command="seq 1 300000 > big.txt")
    out = call(env, "editor", command="view", path="big.txt")
    assert CUT in out and "use view_range" in out and out.startswith("     1\t1\n")
    assert call(env, "editor", command="view", path="big.txt", view_range=[299999, -1]) == (
        "299999\t299999\n300000\t300000"
    )
    out = call(env, "bash", command="head -n 10000 big.txt")  # 48 KB: the end is kept too
    assert CUT in out and out.startswith("1\n2\n") and out.endswith("\n10000")
    out = call(env, "bash", command="cat big.txt")  # beyond the sandbox's own output cap
    assert CUT in out and out.startswith("1\n2\n") and out.endswith("more bytes not shown ...]")
    out = call(env, "python", code="print('x' * 100000)")
    assert CUT in out
    call(env, "python", code="open('wide.txt', 'w').write(('x' * 250 + '\\n') * 1000)")
    out = call(env, "search", pattern="x", path="wide.txt", max_results=1000)
    lines = out.splitlines()
    assert lines[0].startswith("1000 matches for `x` in wide.txt; the first ")
    shown = int(lines[0].rsplit(" ", 1)[1].rstrip(":"))
    assert 10 < shown < 1000 and len(lines) == shown + 2
    assert lines[-1] == (
        f"[... {1000 - shown} more matches not shown: narrow the pattern, path or glob, "
        "or raise max_results]"
    )


def test_shell_is_closed_before_the_sandbox_is_released(env: ProjectEnv) -> None:
    class Probe:
        """Registered before the shell, so closed after it (newest first)."""

        def __init__(self, sandbox: Sandbox) -> None:
            self.sandbox = sandbox
            self.processes: str | None = None
            self.sandbox_open_at_close: bool | None = None

        async def close(self) -> None:
            self.sandbox_open_at_close = not self.sandbox.closed
            result = await self.sandbox.exec(["ps", "-eo", "stat=,args="], timeout=10)
            live = [line for line in result.stdout.splitlines() if not line.lstrip().startswith("Z")]
            self.processes = "\n".join(live)  # zombies wait to be reaped; they run nothing

    class Broken:
        async def close(self) -> None:
            raise RuntimeError("a failing close must not keep the sandbox from being released")

    assert env.state is not None and env.sandbox is not None
    sandbox = env.sandbox
    probe = register_episode_resource(env.state, Probe(sandbox))
    register_episode_resource(env.state, Broken())
    with pytest.raises(TypeError):
        register_episode_resource(env.state, object())
    call(env, "bash", command="sleep 300 > /dev/null 2>&1 &")
    assert "sleep 300" in call(env, "bash", command="ps -eo args")
    shell = env.state.data["agentrl.shell"]

    env.close()
    assert probe.sandbox_open_at_close is True
    assert probe.processes is not None
    assert "bash" not in probe.processes and "sleep 300" not in probe.processes
    assert sandbox.closed and env.sandbox is None
    assert getattr(shell, "_closed", True)


def test_one_episode_on_docker() -> None:
    env = _make_env("docker")
    try:
        env.reset()
        call(env, "bash", command="cd tests && export MODE=docker")
        assert call(env, "bash", command="echo $MODE; pwd") == "docker\n/workspace/tests"
        assert call(env, "python", code="print(6 * 7)") == "42"
        assert call(env, "search", pattern="return a - b").splitlines()[1] == "calc.py:2:    return a - b"
        assert call(env, "run_tests").startswith("1 failed, 1 passed")
        call(env, "editor", command="str_replace", path="calc.py", old_str="a - b", new_str="a + b")
        assert call(env, "editor", command="view", path="calc.py", view_range=[2, 2]) == (
            "     2\t    return a + b"
        )
        assert "outside /workspace" in call(env, "editor", command="view", path="/etc/passwd")
        assert call(env, "run_tests").startswith("2 passed")
        assert step(env, "submit") == ("Submitted.", 1.0, True)
    finally:
        env.close()


def test_every_builtin_tool_is_importable_by_name_from_the_package():
    import agentrl_tools
    from agentrl.tools import Tool
    from agentrl_tools import bash as bash_tool
    from agentrl_tools import calculator

    assert bash_tool is bash and isinstance(calculator, Tool)
    exported = {name: getattr(agentrl_tools, name) for name in agentrl_tools.__all__}
    assert {name: t.name for name, t in exported.items()} == {
        "bash": "bash", "calculator": "calculator", "editor": "editor", "python": "python",
        "run_tests": "run_tests", "search": "search", "submit": "submit",
    }
