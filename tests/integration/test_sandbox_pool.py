"""SandboxPool: admission control with backpressure, pre-warming, reaping, no leaks; and
SandboxPools, the pools a run's envs share."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import time

import gymnasium
import pytest

from agentrl import SandboxedToolEnv
from agentrl.sandbox import (
    Limits,
    Sandbox,
    SandboxPool,
    SandboxPools,
    create_sandbox,
    reap_leftovers,
    resolve_backend,
)
from agentrl.sandbox._procs import allocate_uid, sandbox_root
from agentrl.sandbox.base import SandboxUnavailableError
from tests.support.sandboxes import backend_skip_reason

needs_bwrap = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed")
IS_ROOT = os.geteuid() == 0


def bwrap_pool(**kwargs) -> SandboxPool:
    return SandboxPool(lambda: create_sandbox("bwrap", Limits(timeout_s=10)), **kwargs)


ALLOCATED_UIDS: set[int] = set()
"""Uids handed to this process's sandboxes during a test (recorded by ``record_uids``)."""


def _owner(pid: str) -> int | None:
    try:
        return os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return None


def _live_processes_of(uid: int, wait_s: float = 5.0) -> list[str]:
    """Processes of ``uid`` that are not zombies (killed ones whose parent has not reaped them
    yet), once they had ``wait_s`` to go."""
    deadline = time.monotonic() + wait_s
    while True:
        live = []
        for pid in (p for p in os.listdir("/proc") if p.isdigit()):
            if _owner(pid) != uid:
                continue
            try:
                state = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0]
            except OSError:
                continue
            if state != "Z":
                live.append(pid)
        if not live or time.monotonic() > deadline:
            return live
        time.sleep(0.1)


@pytest.fixture
def record_uids(monkeypatch):
    from agentrl.sandbox import _procs

    real = _procs.allocate_uid

    def recording() -> int:
        uid = real()
        ALLOCATED_UIDS.add(uid)
        return uid

    monkeypatch.setattr(_procs, "allocate_uid", recording)
    yield ALLOCATED_UIDS
    ALLOCATED_UIDS.clear()


def _descends_from(pid: str, ancestor: str) -> bool:
    """Whether process ``pid`` is a descendant of ``ancestor`` (False once either is gone)."""
    for _ in range(64):
        try:
            with open(f"/proc/{pid}/stat") as f:
                pid = f.read().rsplit(")", 1)[1].split()[1]
        except (OSError, IndexError):
            return False
        if pid == ancestor:
            return True
        if pid in ("0", "1"):
            return False
    return False


def _snapshot() -> dict[str, set]:
    """What this process's sandboxes could leak: workspaces, mounts (tmpfs, loop), uid claims,
    processes of sandbox uids, and containers labelled with this pid. Only this process's own
    things count, so sandboxes of other programs running at the same time do not matter: a
    process counts when it runs under a uid this test claimed and descends from this process
    (a sandbox's orphans come back to it, a subreaper), never because another program claimed
    the uid after this test released it. A container's processes count through its container."""
    me = str(os.getpid())
    root = sandbox_root()
    workspaces = {n for n in os.listdir(root) if n.startswith(f"ws-{me}-")} if os.path.isdir(root) else set()
    with open("/proc/self/mounts") as f:
        mounts = {line.split()[1] for line in f if f"/ws-{me}-" in line}
    claims_dir = os.path.join(root, "uids")
    claims = set()
    for name in os.listdir(claims_dir) if os.path.isdir(claims_dir) else ():
        try:
            with open(os.path.join(claims_dir, name)) as f:
                if f.read().strip() == me:
                    claims.add(int(name))
        except OSError:
            pass
    procs = {entry for entry in os.listdir("/proc")
             if entry.isdigit() and _owner(entry) in ALLOCATED_UIDS and _descends_from(entry, me)}
    containers = set()
    if backend_skip_reason("docker") is None:
        from agentrl.sandbox.docker import get_client

        containers = {c.id for c in get_client().containers.list(
            all=True, ignore_removed=True,
            filters={"label": ["agentrl.sandbox=1", f"agentrl.owner_pid={me}"]})}
    return {"workspaces": workspaces, "mounts": mounts, "uid claims": claims,
            "processes": procs, "containers": containers}


@needs_bwrap
def test_admission_control_waits_instead_of_failing():
    pool = bwrap_pool(max_concurrent=2)
    peak = 0
    in_use = 0

    async def episode(i):
        nonlocal peak, in_use
        async with pool.sandbox() as sandbox:
            in_use += 1
            peak = max(peak, in_use)
            result = await sandbox.exec(f"sleep 0.2; echo {i}")
            in_use -= 1
            return result.stdout.strip()

    async def main():
        async with pool:
            return await asyncio.gather(*(episode(i) for i in range(6)))

    start = time.perf_counter()
    assert asyncio.run(main()) == [str(i) for i in range(6)]
    assert peak == 2
    assert time.perf_counter() - start >= 0.55  # three waves of 0.2 s


@needs_bwrap
def test_prewarmed_sandboxes_are_ready_and_refilled():
    pool = bwrap_pool(max_concurrent=4, prewarm=2)

    async def main():
        async with pool:
            assert pool.stats["warm"] == 2
            start = time.perf_counter()
            sandbox = await pool.acquire()
            acquire_s = time.perf_counter() - start
            assert sandbox.workspace and os.path.isdir(sandbox.workspace)
            await pool.release(sandbox)
            await asyncio.sleep(0.3)
            return acquire_s, pool.stats

    acquire_s, stats = asyncio.run(main())
    assert acquire_s < 0.05
    assert stats == {"in_use": 0, "waiting": 0, "warm": 2}


@needs_bwrap
def test_episodes_get_fresh_workspaces():
    pool = bwrap_pool(max_concurrent=1)

    async def main():
        async with pool:
            async with pool.sandbox() as first:
                await first.write_file("note.txt", "from episode 1")
            async with pool.sandbox() as second:
                return (await second.exec("ls")).stdout

    assert asyncio.run(main()) == ""


@needs_bwrap
def test_release_of_foreign_sandbox_rejected():
    async def main():
        async with bwrap_pool() as pool:
            with pytest.raises(ValueError, match="not acquired from this pool"):
                await pool.release(create_sandbox("bwrap"))

    asyncio.run(main())


@needs_bwrap
@pytest.mark.skipif(not IS_ROOT, reason="leftover mounts and uids exist only when running as root")
def test_reaper_removes_leftovers_of_a_dead_run(tmp_path):
    # A dead run: a process that exited, whose workspace (a tmpfs mount), uid claim and a
    # process under that uid were left behind, as after a SIGKILL of the trainer.
    dead = subprocess.Popen(["true"])
    dead.wait()
    workspace = os.path.join(sandbox_root(), f"ws-{dead.pid}-crashed")
    os.makedirs(workspace)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "agentrl-ws", workspace], check=True)
    uid = allocate_uid()
    claim = os.path.join(sandbox_root(), "uids", str(uid))
    with open(claim, "w") as f:
        f.write(str(dead.pid))
    orphan = subprocess.Popen(["sleep", "300"], user=uid, group=uid, start_new_session=True)
    removed = reap_leftovers()
    orphan.wait(timeout=5)
    assert removed["workspaces"] >= 1 and removed["uids"] >= 1
    assert not os.path.exists(workspace) and not os.path.exists(claim)
    assert orphan.returncode == -9


EXITS_WITH_OPEN_SANDBOXES = """
import asyncio, json, os, sys
from agentrl.sandbox import Limits, create_sandbox

async def main():
    sandboxes = [create_sandbox(sys.argv[1], Limits(timeout_s=10)) for _ in range(2)]
    for sandbox in sandboxes:
        await sandbox.start()
        await sandbox.exec("setsid sleep 300 > /dev/null 2>&1 < /dev/null &")
    print(json.dumps({"pid": os.getpid(),
                      "workspaces": [getattr(s, "workspace", None) for s in sandboxes],
                      "uids": [getattr(s, "uid", None) for s in sandboxes]}), flush=True)
    # exits without closing them, as a run does when an exception ends it mid-rollout

asyncio.run(main())
"""


@pytest.mark.parametrize("backend", [
    pytest.param(b, marks=pytest.mark.skipif(bool(r := backend_skip_reason(b)), reason=r or ""))
    for b in ("bwrap", "docker")
])
def test_a_process_exiting_with_open_sandboxes_removes_them_at_exit(backend):
    import json
    import sys

    done = subprocess.run([sys.executable, "-c", EXITS_WITH_OPEN_SANDBOXES, backend],
                          capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    made = json.loads(done.stdout.splitlines()[-1])
    pid = str(made["pid"])
    for workspace in made["workspaces"]:
        if workspace is not None:
            assert not os.path.exists(workspace)
            assert workspace not in open("/proc/mounts").read()
    claims = os.path.join(sandbox_root(), "uids")
    for uid in made["uids"]:
        if IS_ROOT and uid is not None and uid >= 200_000:
            assert not os.path.exists(os.path.join(claims, str(uid)))
            assert _live_processes_of(uid) == []
    if backend == "bwrap":
        assert [n for n in os.listdir(sandbox_root()) if n.startswith(f"ws-{pid}-")] == []
    if backend == "docker":
        from agentrl.sandbox._docker_api import get_client

        left = get_client().containers.list(all=True, ignore_removed=True, filters={"label": "agentrl.sandbox=1"})
        assert [c.name for c in left if c.labels.get("agentrl.owner_pid") == pid] == []


EPISODES = {"bwrap": 500, "docker": 150, "process": 500}
"""Episodes per backend; a docker episode costs a container start (0.4 s here), and 150 (6 of
them leaving processes behind) leak the same things 500 would."""


@pytest.mark.parametrize("backend", [
    pytest.param(b, marks=pytest.mark.skipif(bool(r := backend_skip_reason(b)), reason=r or ""))
    for b in ("bwrap", "docker", "process")
])
def test_many_episodes_leave_nothing_behind(backend, record_uids):
    before = _snapshot()
    pool = SandboxPool(lambda: create_sandbox(backend, Limits(timeout_s=10)), max_concurrent=8, prewarm=2)

    async def episode(i):
        async with pool.sandbox() as sandbox:
            await sandbox.write_file("x.txt", str(i))
            if i % 25 == 0:  # some episodes leave background processes running
                await sandbox.exec("setsid sleep 300 > /dev/null 2>&1 < /dev/null & echo started")
                shell = await sandbox.open_shell()
                await shell.run("sleep 300 > /dev/null 2>&1 &")

    async def main():
        async with pool:
            await asyncio.gather(*(episode(i) for i in range(EPISODES[backend])))

    asyncio.run(main())
    after = _snapshot()
    for kind in ("workspaces", "mounts", "uid claims", "processes", "containers"):
        assert after[kind] <= before[kind], f"leaked {kind}: {after[kind] - before[kind]}"


def test_auto_backend_explains_how_to_fix(monkeypatch):
    import agentrl.sandbox as sandbox_pkg

    monkeypatch.setattr(sandbox_pkg, "_docker_reason", lambda: "connection refused")
    monkeypatch.setattr(sandbox_pkg.shutil, "which", lambda name: None)
    with pytest.raises(SandboxUnavailableError) as excinfo:
        resolve_backend("auto")
    message = str(excinfo.value)
    assert "apt-get install bubblewrap" in message and "scripts/dockerd.sh start" in message
    assert "--env-kwarg sandbox=process" in message and "connection refused" in message
    with pytest.raises(ValueError, match="unknown sandbox backend"):
        resolve_backend("vm")


class FakeSandbox(Sandbox):
    """Records the options it was made with: the pool and env tests below only acquire and
    release sandboxes, so running anything in one is a test bug, said as such."""

    backend = "fake"

    def __init__(self, limits=None, **options):
        super().__init__(limits)
        self.options = options
        self.started = False

    async def start(self):
        self.started = True

    def _unused(self):
        raise AssertionError("FakeSandbox runs nothing: these tests only acquire and release")

    async def exec(self, command, *, timeout=None, stdin=None, env=None, cwd="/workspace"):
        self._unused()

    async def open_shell(self):
        self._unused()

    async def read_file(self, path, *, max_bytes=None):
        self._unused()

    async def write_file(self, path, data):
        self._unused()

    async def close(self):
        self.closed = True


class ImageEnv(SandboxedToolEnv):
    """One sandbox per episode, of the task's image."""

    def sample_task(self):
        return {"image": "base"}

    def make_prompt(self, task):
        return [{"role": "user", "content": "go"}]

    def compute_reward(self, task, final, state):
        return 0.0

    def sandbox_options_for(self, task):
        return {**self.sandbox_options, "image": task["image"]}


def fake_pools() -> tuple[SandboxPools, list[FakeSandbox]]:
    made: list[FakeSandbox] = []

    def creator(backend, limits, **options):
        made.append(FakeSandbox(limits, **options))
        return made[-1]

    return SandboxPools(reap=False, creator=creator), made


@pytest.mark.parametrize("images", [("a", "a"), ("a", "b")], ids=["same image", "two images"])
def test_envs_sharing_pools_wait_for_one_slot_together(images):
    pools, made = fake_pools()
    envs = [ImageEnv(sandbox="process", max_concurrent_sandboxes=1, sandbox_pools=pools,
                     sandbox_options={"tag": "t"}) for _ in images]

    async def main():
        await envs[0].areset(options={"task": {"image": images[0]}})
        second = asyncio.ensure_future(envs[1].areset(options={"task": {"image": images[1]}}))
        for _ in range(20):  # let the second episode run as far as it can
            await asyncio.sleep(0)
        waited = not second.done() and envs[1].sandbox is None
        await envs[0].astep("done")  # a final answer: the episode ends, its sandbox is released
        await second
        got = envs[1].sandbox
        for env in envs:
            await env.aclose()
        await pools.aclose()
        return waited, got

    waited, second_sandbox = asyncio.run(main())
    assert waited
    assert [sb.options for sb in made] == [{"tag": "t", "image": image} for image in images]
    # the env's tools see the lent sandbox through the recording wrapper
    assert second_sandbox.inner is made[1] and all(sb.closed for sb in made)


class RecordingPools(SandboxPools):
    closed: list[SandboxPools] = []

    async def aclose(self):
        RecordingPools.closed.append(self)
        await super().aclose()


class PlainEnv(ImageEnv):
    def sandbox_options_for(self, task):
        return self.sandbox_options


def test_env_without_pools_closes_its_own(monkeypatch):
    monkeypatch.setattr(RecordingPools, "closed", [])
    monkeypatch.setattr("agentrl.env.sandboxed.SandboxPools", RecordingPools)
    env = PlainEnv(sandbox="process")
    env.reset()
    env.close()
    assert RecordingPools.closed == [env.sandbox_pools]


def test_env_leaves_shared_pools_to_their_owner(monkeypatch):
    monkeypatch.setattr(RecordingPools, "closed", [])
    env = PlainEnv(sandbox="process", sandbox_pools=RecordingPools())
    env.reset()
    env.close()
    assert RecordingPools.closed == []


def test_gymnasium_remake_from_spec_shares_the_pools():
    pools, _ = fake_pools()
    env = gymnasium.make("agentrl/math-python-v0", sandbox="process", sandbox_pools=pools)
    again = env.unwrapped.spec.make()
    assert again.unwrapped.sandbox_pools is pools


def test_episode_ending_after_the_run_closed_its_pools_is_quiet():
    pools, made = fake_pools()
    env = PlainEnv(sandbox="process", sandbox_pools=pools)

    async def main():
        await env.areset()
        await pools.aclose()  # closes the episode's sandbox with the pool
        await env.aclose()  # the release of a sandbox the pool already closed does nothing

    asyncio.run(main())
    assert made[0].closed and env.sandbox is None
