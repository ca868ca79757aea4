"""``Sandbox.spawn`` (long-running processes with pipes) on every backend, and the bwrap
``ro_binds`` option."""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile

import pytest

from agentrl.sandbox import Sandbox, SandboxError, create_sandbox
from agentrl.sandbox._procs import IS_ROOT, owner_uid
from tests.support.sandboxes import backend_skip_reason


def _backends(*names: str) -> list:
    return [pytest.param(n, marks=pytest.mark.skipif(bool(r := backend_skip_reason(n)), reason=r or ""))
            for n in names]


def _uid_processes(uid: int) -> list[str]:
    return [p for p in os.listdir("/proc") if p.isdigit() and owner_uid(p) == uid]


@pytest.mark.parametrize("backend", _backends("process", "bwrap", "docker"))
def test_spawn_pipes(backend):
    async def main() -> None:
        sandbox = create_sandbox(backend)
        await sandbox.start()
        try:
            cat = await sandbox.spawn(["cat"])
            cat.stdin.write(b"ping\n")
            await cat.stdin.drain()
            assert await asyncio.wait_for(cat.stdout.readline(), 30) == b"ping\n"
            assert cat.returncode is None
            await cat.kill()
            status = await asyncio.wait_for(cat.wait(), 30)
            assert status == cat.returncode and status != 0
            await cat.kill()  # idempotent

            noisy = await sandbox.spawn(["sh", "-c", "echo err >&2; echo $HOME; cat"],
                                        env={"AGENTRL_X": "1"})
            assert await asyncio.wait_for(noisy.stderr.readline(), 30) == b"err\n"
            home = (await asyncio.wait_for(noisy.stdout.readline(), 30)).decode().strip()
            assert home == (sandbox.workspace if backend == "process" else "/workspace")
            noisy.stdin.close()  # cat sees EOF and exits
            assert await asyncio.wait_for(noisy.wait(), 30) == 0

            sleeper = await sandbox.spawn(["sh", "-c", "echo $$; exec sleep 1000"])
            inner_pid = int(await asyncio.wait_for(sleeper.stdout.readline(), 30))
        finally:
            await sandbox.close()
        await asyncio.wait_for(sleeper.wait(), 30)  # the sandbox's close killed it
        if backend == "process":
            assert not os.path.exists(f"/proc/{inner_pid}") or _zombie(inner_pid)
        if IS_ROOT:
            assert _uid_processes(sandbox.uid) == []

    asyncio.run(main())


def _zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def test_spawn_default_raises_sandbox_error():
    class Minimal(Sandbox):
        backend = "minimal"

        async def start(self): ...
        async def exec(self, command, *, timeout=None, stdin=None, env=None, cwd="/workspace"): ...
        async def open_shell(self): ...
        async def read_file(self, path, *, max_bytes=None): ...
        async def write_file(self, path, data): ...
        async def close(self): ...

    with pytest.raises(SandboxError, match="minimal sandbox cannot spawn"):
        asyncio.run(Minimal().spawn(["cat"]))


@pytest.mark.skipif(bool(backend_skip_reason("bwrap")), reason=backend_skip_reason("bwrap") or "")
def test_bwrap_ro_binds():
    shared = tempfile.mkdtemp(prefix="agentrl-ro-bind-")
    try:
        os.chmod(shared, 0o755)  # the sandbox's uid must be able to read it
        with open(os.path.join(shared, "data.txt"), "w") as f:
            f.write("visible\n")
        os.chmod(os.path.join(shared, "data.txt"), 0o644)

        async def main() -> None:
            sandbox = create_sandbox("bwrap", ro_binds=[shared])
            await sandbox.start()
            try:
                read = await sandbox.exec(f"cat {shared}/data.txt")
                assert read.ok and read.stdout == "visible\n", read.to_text()
                write = await sandbox.exec(f"echo x > {shared}/new.txt")
                assert not write.ok
                assert not os.path.exists(os.path.join(shared, "new.txt"))
            finally:
                await sandbox.close()
            plain = create_sandbox("bwrap")
            await plain.start()
            try:
                assert not (await plain.exec(f"cat {shared}/data.txt")).ok  # not bound: invisible
            finally:
                await plain.close()

        asyncio.run(main())
    finally:
        shutil.rmtree(shared, ignore_errors=True)
    with pytest.raises(ValueError, match="absolute"):
        create_sandbox("bwrap", ro_binds=["relative/dir"])
    with pytest.raises(ValueError, match="absolute"):
        create_sandbox("process", ro_binds=["/nonexistent/agentrl-dir"])
