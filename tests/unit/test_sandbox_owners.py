"""Whose leftovers are reclaimed: an owner is gone when its pid is free, a zombie, or a later
process's (agentrl.sandbox._procs.owner_alive), and reap_leftovers removes only those."""

from __future__ import annotations

import os
import signal
import subprocess
import time

import pytest

from agentrl.sandbox import _procs, reap_leftovers

pytestmark = pytest.mark.unit


def test_a_running_owner_is_alive_and_a_killed_one_is_gone_before_it_is_waited_for():
    child = subprocess.Popen(["sleep", "30"])
    try:
        made = time.time()
        assert _procs.owner_alive(child.pid, made)
        # something made an hour before the process started cannot be its: the pid was reused
        assert not _procs.owner_alive(child.pid, made - 3600)
        child.send_signal(signal.SIGKILL)
        deadline = time.monotonic() + 10
        while (_procs._stat_fields(str(child.pid)) or ("", "Z"))[1] != "Z" and time.monotonic() < deadline:
            time.sleep(0.01)
        assert _procs._stat_fields(str(child.pid))[1] == "Z"  # not waited for yet: a zombie
        assert not _procs.owner_alive(child.pid, made)
    finally:
        child.kill()
        child.wait()
    assert not _procs.owner_alive(child.pid, made)


def test_reaping_removes_the_workspaces_and_claims_of_gone_owners_only(tmp_path, monkeypatch):
    monkeypatch.setenv("AGENTRL_SANDBOX_ROOT", str(tmp_path))
    dead = subprocess.Popen(["true"])
    dead.wait()
    zombie = subprocess.Popen(["sleep", "30"])
    zombie.send_signal(signal.SIGKILL)
    try:
        while (_procs._stat_fields(str(zombie.pid)) or ("", "Z"))[1] != "Z":
            time.sleep(0.01)
        for owner in (dead.pid, zombie.pid, os.getpid()):
            (tmp_path / f"ws-{owner}-abc").mkdir()
        claims = tmp_path / "uids"
        claims.mkdir()
        (claims / "1500001").write_text(str(zombie.pid))
        (claims / "1500002").write_text(str(os.getpid()))
        removed = reap_leftovers(docker_hosts=[])
    finally:
        zombie.wait()
    assert removed["workspaces"] == 2
    assert sorted(p.name for p in tmp_path.glob("ws-*")) == [f"ws-{os.getpid()}-abc"]
    if _procs.IS_ROOT:  # claims are released only where their processes can be killed
        assert sorted(p.name for p in claims.iterdir()) == ["1500002"]
