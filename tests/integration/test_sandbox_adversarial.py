"""Adversarial sandbox tests: one property per test, for every backend that claims it.

A backend missing on this machine is skipped with the reason (for Docker, the daemon's own
error). After every test the host is checked unchanged: a canary process still runs, canary
files are intact, nothing new appeared in /etc or /, and no process of the sandbox's uid is left.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agentrl.sandbox import Limits, SandboxError, create_sandbox
from tests.support.sandboxes import backend_skip_reason

IS_ROOT = os.geteuid() == 0
REPO = Path(__file__).resolve().parents[2]

# Which backend claims which property (see each backend's docstring).
ISOLATING = ("bwrap", "docker")
ALL = ("bwrap", "docker", "process")
ROOT_ONLY_PROCESS = ALL if IS_ROOT else ISOLATING


@pytest.fixture(scope="module")
def canary(tmp_path_factory):
    """A host process and files that sandboxed code must not be able to touch."""
    proc = subprocess.Popen(["sleep", "3600"])
    directory = tmp_path_factory.mktemp("canary")
    files = {directory / "secret.txt": "host secret\n", Path("/root/.agentrl-canary"): "root canary\n"}
    for path, text in files.items():
        path.write_text(text)
    yield proc, files
    proc.kill()
    for path in files:
        path.unlink(missing_ok=True)


@pytest.fixture
def host_unchanged(canary):
    proc, files = canary
    etc_before, root_before = sorted(os.listdir("/etc")), sorted(os.listdir("/"))
    yield
    assert proc.poll() is None, "the canary host process was killed"
    for path, text in files.items():
        assert path.read_text() == text, f"{path} changed"
    assert sorted(os.listdir("/etc")) == etc_before
    assert sorted(os.listdir("/")) == root_before


def params(backends):
    return [
        pytest.param(b, marks=pytest.mark.skipif(bool(r := backend_skip_reason(b)), reason=r or ""))
        for b in backends
    ]


class Box:
    """One started sandbox for a test, closed (and checked for leftovers) afterwards."""

    def __init__(self, backend: str, **limits):
        self.loop = asyncio.new_event_loop()  # a sandbox lives in one event loop
        self.sandbox = create_sandbox(backend, Limits(**{"timeout_s": 20, **limits}))
        self.run(self.sandbox.start())

    def run(self, coro):
        return self.loop.run_until_complete(coro)

    def exec(self, command, **kwargs):
        return self.run(self.sandbox.exec(command, **kwargs))

    def close(self):
        self.run(self.sandbox.close())
        self.loop.close()
        uid = getattr(self.sandbox, "uid", None)
        if IS_ROOT and uid is not None and uid >= 200_000:
            owned = [p for p in os.listdir("/proc") if p.isdigit() and _owner(p) == uid]
            assert not owned, f"processes of sandbox uid {uid} survived close: {owned}"
        workspace = getattr(self.sandbox, "workspace", None)
        if workspace:
            assert not os.path.exists(workspace), "workspace left behind"


def _owner(pid: str) -> int | None:
    try:
        return os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return None


@pytest.fixture
def box_factory(host_unchanged):
    boxes = []

    def make(backend, **limits):
        box = Box(backend, **limits)
        boxes.append(box)
        return box

    yield make
    for box in boxes:
        box.close()


PY = "python3 -c"


@pytest.mark.parametrize("backend", params(ISOLATING))
def test_no_network(box_factory, backend):
    box = box_factory(backend)
    code = "import socket; s = socket.socket(); s.settimeout(3); s.connect(('1.1.1.1', 53))"
    result = box.exec(f'{PY} "{code}"')
    assert result.exit_code != 0
    assert "unreachable" in result.stderr.lower() or "Errno" in result.stderr
    result = box.exec(f'{PY} "import socket; print(socket.if_nameindex())"')
    assert "eth" not in result.stdout


@pytest.mark.parametrize("backend", params(ISOLATING))
def test_host_filesystem_not_writable(box_factory, backend):
    box = box_factory(backend)
    for command in ("touch /agentrl-escape", "touch /etc/agentrl-escape", "touch /usr/agentrl-escape",
                    "echo x >> /etc/passwd", "mount -o remount,rw /usr", "mount -o remount,rw /"):
        assert box.exec(command).exit_code != 0, command
    assert box.exec("touch /usr/agentrl-escape; ls /usr/agentrl-escape").exit_code != 0


@pytest.mark.parametrize("backend", params(ISOLATING))
def test_host_secrets_not_readable(box_factory, backend, canary, monkeypatch):
    monkeypatch.setenv("AGENTRL_TEST_SECRET", "s3cret-token")
    box = box_factory(backend)
    _, files = canary
    assert "s3cret-token" not in box.exec("env").stdout
    for path in files:
        assert box.exec(f"cat {path}").exit_code != 0, path
    assert box.exec(f"ls {REPO}").exit_code != 0
    assert box.exec("cat /etc/shadow").exit_code != 0
    assert box.exec("ls /root").stdout.strip() == ""


@pytest.mark.parametrize("backend", params(ROOT_ONLY_PROCESS))
def test_fork_bomb_contained(box_factory, backend):
    box = box_factory(backend, pids=64)
    start = time.perf_counter()
    box.exec("bomb() { bomb | bomb & }; bomb", timeout=3)
    assert time.perf_counter() - start < 20
    after = box.exec("echo alive")
    assert after.stdout.strip() == "alive", after
    assert subprocess.run(["true"]).returncode == 0  # the host can still fork


@pytest.mark.parametrize("backend", params(ALL))
def test_memory_bomb_killed(box_factory, backend):
    box = box_factory(backend, memory_mb=256)
    result = box.exec(f'{PY} "x = bytearray(2 * 1024**3); print(len(x))"', timeout=20)
    assert result.exit_code != 0 and not result.timed_out
    assert "2147483648" not in result.stdout
    assert box.exec("echo alive").stdout.strip() == "alive"


@pytest.mark.parametrize("backend", params(ALL))
def test_cpu_time_limit(box_factory, backend):
    box = box_factory(backend, cpu_s=1)
    start = time.perf_counter()
    result = box.exec(f'{PY} "while True: pass"', timeout=30)
    assert not result.timed_out and result.limit_hit == "cpu"
    assert time.perf_counter() - start < 15


@pytest.mark.parametrize("backend", params(ISOLATING if not IS_ROOT else ALL))
def test_disk_fill_stopped(box_factory, backend):
    box = box_factory(backend, workspace_mb=32, file_size_mb=1024)
    result = box.exec("for i in $(seq 100); do head -c 1048576 /dev/zero > f$i || exit 1; done", timeout=30)
    assert result.exit_code != 0
    assert "No space left" in result.stderr or "File too large" in result.stderr
    used = box.exec("du -sm . | cut -f1").stdout.strip()
    assert int(used) <= 33


@pytest.mark.parametrize("backend", params(ROOT_ONLY_PROCESS))
def test_timeout_kills_setsid_grandchild_holding_the_pipe(box_factory, backend):
    box = box_factory(backend)
    start = time.perf_counter()
    result = box.exec("setsid sh -c 'sleep 300' & while true; do :; done", timeout=1.5)
    elapsed = time.perf_counter() - start
    assert result.timed_out and result.exit_code is None
    assert elapsed < 8, f"took {elapsed:.1f} s"
    assert "sleep 300" not in box.exec("ps ax -o args 2>/dev/null || true").stdout


@pytest.mark.parametrize("backend", params(ALL))
def test_output_flood_capped(box_factory, backend):
    box = box_factory(backend, output_bytes=10_000)
    result = box.exec("head -c 50000000 /dev/zero | tr '\\0' 'a'; echo done >&2", timeout=30)
    assert result.truncated and len(result.stdout) < 11_000
    assert "output truncated" in result.stdout
    assert "done" in result.stderr


@pytest.mark.parametrize("backend", params(ALL))
def test_symlink_and_dotdot_escapes_refused(box_factory, backend):
    box = box_factory(backend)
    box.exec("ln -s /etc/passwd passwd_link; ln -s / root_link; mkdir d; ln -s /etc d/etc_link")
    for path in ("passwd_link", "root_link/etc/passwd", "d/etc_link/passwd", "../../etc/passwd",
                 "/etc/passwd", "/workspace/../etc/passwd"):
        with pytest.raises(SandboxError):
            box.run(box.sandbox.read_file(path))
    before = Path("/etc/passwd").read_bytes()
    for path in ("passwd_link", "root_link/tmp/agentrl-escape", "d/etc_link/agentrl", "../escape"):
        with pytest.raises(SandboxError):
            box.run(box.sandbox.write_file(path, "pwned"))
    assert Path("/etc/passwd").read_bytes() == before
    assert not Path("/tmp/agentrl-escape").exists()
    box.run(box.sandbox.write_file("ok/inside.txt", "fine"))
    assert box.run(box.sandbox.read_file("/workspace/ok/inside.txt")) == b"fine"
    assert box.exec("cat ok/inside.txt").stdout == "fine"


@pytest.mark.parametrize("backend", params(ROOT_ONLY_PROCESS))
def test_kill_all_inside_harms_nothing_outside(box_factory, backend):
    box = box_factory(backend)
    box.exec("kill -9 -1; sleep 1", timeout=10)
    assert box.exec("echo alive").stdout.strip() == "alive"
    # host_unchanged checks the canary process; this process is alive by construction.
    assert os.getpid() > 0 and sys.executable


@pytest.mark.parametrize("backend", params(ISOLATING))
def test_runs_unprivileged_without_capabilities(box_factory, backend):
    box = box_factory(backend)
    status = box.exec("grep -E '^(Uid|CapEff)' /proc/self/status").stdout
    uid_line, cap_line = status.splitlines()
    assert uid_line.split()[1] != "0"
    assert cap_line.split()[1] == "0000000000000000"


@pytest.mark.parametrize("backend", params(ALL))
def test_stateful_shell_session(box_factory, backend):
    box = box_factory(backend)

    async def scenario():
        shell = await box.sandbox.open_shell()
        try:
            await shell.run("mkdir -p sub && cd sub && export GREETING=hi")
            state = await shell.run("echo $GREETING; basename $PWD")
            bad = await shell.run("if then fi")  # a syntax error must not kill the session
            after = await shell.run("echo $GREETING")
            slow = await shell.run("sleep 30", timeout=1)
            fresh = await shell.run("echo ${GREETING:-unset}")
            return state, bad, after, slow, fresh
        finally:
            await shell.close()

    state, bad, after, slow, fresh = box.run(scenario())
    assert state.stdout.split() == ["hi", "sub"]
    assert bad.exit_code != 0 and after.stdout.strip() == "hi"
    assert slow.timed_out and fresh.stdout.strip() == "unset"
