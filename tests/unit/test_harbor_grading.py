"""The host side of Harbor grading, without Docker: which symbolic links of the workspace are
removed before the verifier runs, the files given to the verifier's uid, and the verifier's
environment. tests/integration/test_harbor_grading_adversarial.py plays the same attacks in
real containers."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from agentrl_envs.harbor.task import load_task
from agentrl_envs.harbor.verifier import VERIFIER_PATH, _clean_workspace, verifier_environment
from tests.unit.test_harbor_task import make_task

MOUNTS = ("/workspace", "/app")

# link (relative to the workspace) -> target, and whether it must go
LINKS = {
    "answer.txt": ("/tests/expected.txt", True),
    "relative": ("../tests/expected.txt", True),
    "beyond-root": ("../../../../tests", True),
    "sub/deep": ("../../tests/expected.txt", True),
    "reward": ("/logs/verifier/reward.json", True),
    "solution": ("/solution/solve.sh", True),
    "logs": ("/logs", True),
    "root": ("/", True),
    "via-root": ("root/tests/expected.txt", True),
    "proc-root": ("/proc/self/root/tests/expected.txt", True),
    "proc-pid": ("/proc/1/cwd", True),
    "thread-self": ("/proc/thread-self/root", True),
    "open-fd": ("/dev/fd/3", True),
    "stdin": ("/dev/stdin", True),
    "chain-a": ("chain-b", True),
    "chain-b": ("dir/t/expected.txt", True),
    "dir/t": ("../../tests", True),
    "alias-a": ("/app/alias-b", True),
    "alias-b": ("/workspace/relative", True),
    "dot-dots": ("./sub/../relative", True),
    "var-run": ("/var/run/../tests/expected.txt", True),  # /var/run -> /run in the image
    "up-outside": ("/usr/lib/../share/doc", True),  # a '..' we cannot resolve: refused
    # legitimate links stay
    ".venv/bin/python3": ("../../../usr/bin/python3", False),  # as `ln -sr` makes it
    ".venv/bin/python": ("/usr/bin/python3", False),
    ".venv/lib64": ("lib", False),
    "to-tmp": ("/tmp/out.txt", False),
    "to-file": ("sub/file.txt", False),
    "to-logs-sibling": ("/logs/other", False),
    "cpuinfo": ("/proc/cpuinfo", False),
    "null": ("/dev/null", False),
    "dangling": ("missing/file", False),
    "loop-a": ("loop-b", False),
    "loop-b": ("loop-a", False),
}


@pytest.fixture()
def workspace(tmp_path: Path) -> Path:
    root = tmp_path / "ws"
    (root / "sub").mkdir(parents=True)
    (root / "sub" / "file.txt").write_text("mine\n")
    (root / "dir").mkdir()
    (root / ".venv" / "bin").mkdir(parents=True)
    (root / ".venv" / "lib").mkdir()
    for name, (target, _) in LINKS.items():
        (root / name).symlink_to(target)
    return root


def test_links_that_lead_to_the_grader_are_removed(workspace: Path) -> None:
    removed = _clean_workspace(str(workspace), MOUNTS, "/app", owner=None)
    doomed = sorted(f"/app/{name}" for name, (_, goes) in LINKS.items() if goes)
    assert removed == doomed
    for name, (target, goes) in LINKS.items():
        assert (workspace / name).is_symlink() is not goes, name
        if not goes:
            assert os.readlink(workspace / name) == target
    assert (workspace / "sub" / "file.txt").read_text() == "mine\n"


def test_the_links_are_judged_under_every_mount_of_the_workspace(tmp_path: Path) -> None:
    # ../tests from /srv/app/x is /srv/tests, harmless; from /workspace/x it is /tests.
    root = tmp_path / "ws"
    root.mkdir()
    (root / "x").symlink_to("../tests/expected.txt")
    assert _clean_workspace(str(root), ("/workspace", "/srv/app"), "/srv/app", owner=None) == ["/srv/app/x"]


def test_every_file_is_given_to_the_owner_links_included(workspace: Path) -> None:
    uid = os.geteuid()  # as root the grader gives them to 0; any user may give them to itself
    _clean_workspace(str(workspace), MOUNTS, "/app", owner=uid)
    for path in [workspace, *workspace.rglob("*")]:
        assert path.lstat().st_uid == uid and path.lstat().st_gid == uid, path


def test_the_verifier_environment(tmp_path: Path) -> None:
    task = load_task(make_task(tmp_path))  # [verifier].env = { MODE = "strict" }
    assert verifier_environment(task) == {
        "HOME": "/root", "PATH": VERIFIER_PATH, "PYTHONNOUSERSITE": "1", "LANG": "C.UTF-8",
        "TMPDIR": "/tmp", "MODE": "strict"}
    # a task whose working directory is /root or a PATH directory: the agent wrote there
    odd = verifier_environment(task, ("/workspace", "/root", "/usr/local/bin"))
    assert odd["HOME"] == "/nonexistent"
    assert odd["PATH"] == "/usr/local/sbin:/usr/sbin:/usr/bin:/sbin:/bin"
