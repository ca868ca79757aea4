"""Host-process bookkeeping for the local backends: sandbox uids, kills, reaping."""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import random
import signal
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator

UID_BASE = 200_000
"""First uid handed to sandboxes when running as root (one uid per live sandbox)."""
UID_COUNT = 1 << 20
"""Sandbox uids are ``UID_BASE .. UID_BASE + UID_COUNT - 1``, claimed through lock files."""
IS_ROOT = os.geteuid() == 0

_own_children: set[int] = set()
_spawning = 0
_PR_SET_CHILD_SUBREAPER = 36
_subreaper_set = False


def sandbox_root() -> str:
    """Host directory holding every sandbox workspace (``$AGENTRL_SANDBOX_ROOT`` or
    ``<tmp>/agentrl-sandboxes``)."""
    return os.environ.get("AGENTRL_SANDBOX_ROOT") or os.path.join(tempfile.gettempdir(), "agentrl-sandboxes")


def _claims_dir() -> str:
    path = os.path.join(sandbox_root(), "uids")
    os.makedirs(path, mode=0o700, exist_ok=True)
    return path


def allocate_uid() -> int:
    """Claims a sandbox uid no other live sandbox on this machine uses (any process).

    A claim is a file ``<root>/uids/<uid>`` holding the owner pid, created with O_EXCL; claims
    of dead owners are taken over.
    """
    claims = _claims_dir()
    start = random.randrange(UID_COUNT)
    for offset in range(UID_COUNT):
        uid = UID_BASE + (start + offset) % UID_COUNT
        path = os.path.join(claims, str(uid))
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
        except FileExistsError:
            if claim_owner_alive(path):
                continue
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)  # stale: its owner died; retried on the next pass
            continue
        with os.fdopen(fd, "w") as f:
            f.write(str(os.getpid()))
        return uid
    raise RuntimeError("no free sandbox uid")


def release_uid(uid: int) -> None:
    """Drops this process's claim on ``uid``."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(os.path.join(_claims_dir(), str(uid)))


def claim_owner_alive(path: str, gone: Callable[[int, float], bool] | None = None) -> bool:
    """Whether the process that claimed the uid at ``path`` still runs (unreadable: assume so).
    ``gone(pid, since)`` decides instead of :func:`owner_alive` when given (``since``: when the
    claim was made)."""
    try:
        with open(path) as f:
            pid = int(f.read().strip() or "0")
        since = os.stat(path).st_mtime
    except (OSError, ValueError):
        return True
    return not gone(pid, since) if gone is not None else owner_alive(pid, since)


def stale_claims(gone: Callable[[int, float], bool] | None = None) -> list[int]:
    """Uids claimed by processes that no longer run (:func:`owner_alive`, or that
    ``gone(pid, since)`` says are gone)."""
    claims = _claims_dir()
    return [int(name) for name in os.listdir(claims)
            if name.isdigit() and not claim_owner_alive(os.path.join(claims, name), gone)]


def become_subreaper() -> None:
    """Makes this process the reaper of its orphaned descendants (once per process).

    bwrap's outer process can exit before the namespace's init does, and a killed command's
    grandchildren outlive their parent; such orphans go to pid 1, which on minimal VMs and
    containers never reaps them, leaving zombies. As a subreaper we get them and reap them
    (:func:`reap_orphans`).
    """
    global _subreaper_set
    if _subreaper_set:
        return
    _subreaper_set = True
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


@contextlib.contextmanager
def spawning() -> Iterator[None]:
    """Marks a spawn in progress: between fork and :func:`track_child` a new child is not yet
    known, so :func:`reap_orphans` stands back until no spawn is in flight."""
    global _spawning
    _spawning += 1
    try:
        yield
    finally:
        _spawning -= 1


def track_child(process: asyncio.subprocess.Process) -> None:
    """Records a child this process started itself until asyncio has waited for it, so that
    :func:`reap_orphans` never steals its exit status."""
    _own_children.add(process.pid)
    waiter = asyncio.ensure_future(process.wait())
    waiter.add_done_callback(lambda _: _own_children.discard(process.pid))


def owner_alive(pid: int, since: float) -> bool:
    """Whether the process ``pid`` that made something at time ``since`` (seconds since the
    epoch: a workspace's or a claim's time) still runs.

    It does not when no process has that pid, when the process is a zombie (killed, not yet
    waited for: a killed Ray node's workers linger so under a subreaper), or when the process
    with that pid started after ``since``: the maker died and another process got its pid.
    Where ``/proc`` cannot tell, a process with that pid counts as alive.
    """
    fields = _stat_fields(str(pid))
    if fields is None:
        return pid_alive(pid)  # no /proc entry to read: gone, or not Linux
    if fields[1] == "Z":
        return False
    started = _start_time(pid)
    return started is None or started <= since + START_SLACK_S


START_SLACK_S = 2.0
"""How far a process's start time, read in clock ticks since boot, may be after the time of
something it made before it counts as another process."""


def _start_time(pid: int) -> float | None:
    """When process ``pid`` started, in seconds since the epoch (None when unknown)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/stat") as f:
            boot = next(int(line.split()[1]) for line in f if line.startswith("btime "))
    except (OSError, IndexError, ValueError, StopIteration):
        return None
    return boot + ticks / os.sysconf("SC_CLK_TCK")


def _stat_fields(pid: str) -> tuple[str, str, str] | None:
    """(name, state, ppid) of a process, or None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            head, tail = f.read().rsplit(")", 1)
        state, ppid = tail.split()[:2]
        return head.split("(", 1)[1], state, ppid
    except (OSError, IndexError, ValueError):
        return None


def owner_uid(pid: str) -> int | None:
    """The uid owning process ``pid``, or None when it is gone."""
    try:
        return os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return None


def _pids() -> list[str]:
    return [entry for entry in os.listdir("/proc") if entry.isdigit()]


def reap_orphans(uid: int) -> None:
    """Reaps zombies re-parented to this process that ran as a sandbox's ``uid`` (as root) or
    are ``bwrap`` processes; never other children, whose exit status belongs to their owner."""
    if _spawning:
        return  # a child being spawned is not tracked yet; the next close reaps instead
    me = str(os.getpid())
    for pid in _pids():
        fields = _stat_fields(pid)
        if fields is None or fields[1] != "Z" or fields[2] != me or int(pid) in _own_children:
            continue
        if fields[0] == "bwrap" or (IS_ROOT and uid >= UID_BASE and owner_uid(pid) == uid):
            # Checked again right before reaping: a spawn that began after the scan started
            # may have produced this very pid.
            if _spawning or int(pid) in _own_children:
                return
            with contextlib.suppress(ChildProcessError):
                os.waitpid(int(pid), os.WNOHANG)


def kill_uid(uid: int) -> None:
    """SIGKILLs every process owned by ``uid`` (a sandbox's own uid; root only)."""
    if not IS_ROOT or uid < UID_BASE:
        return
    for _ in range(3):  # a process forking during the sweep is caught by the next one
        pids = [int(p) for p in _pids() if owner_uid(p) == uid and (_stat_fields(p) or "xZ")[1] != "Z"]
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.01)


def _pipe_holders(wanted: set[str], uid: int | None, me: str) -> set[int]:
    holders = set()
    for pid in _pids():
        if pid == me or (uid is not None and owner_uid(pid) != uid):
            continue
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(f"/proc/{pid}/fd/{fd}") in wanted:
                    holders.add(int(pid))
                    break
            except OSError:
                continue
    return holders


def kill_pipe_holders(inodes: Iterable[int], uid: int | None) -> int:
    """SIGKILLs every process (of ``uid``, when given) holding one of the pipes ``inodes``.

    This is how a timeout reaches a grandchild that left the process group with ``setsid`` but
    still holds the command's output pipe. Holders are first stopped (SIGSTOP), scan after scan
    until no new one appears, so a fork bomb cannot outrun the sweep; then all are killed.
    This process itself is never touched.
    """
    wanted = {f"pipe:[{inode}]" for inode in inodes}
    me = str(os.getpid())
    stopped: set[int] = set()
    for _ in range(50):
        new = _pipe_holders(wanted, uid, me) - stopped
        if not new:
            break
        for pid in new:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGSTOP)
        stopped |= new
    for pid in stopped:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    # Until their parents reap them, killed processes still count against the process limit:
    # wait (briefly) so the next command of the sandbox can fork.
    deadline = time.monotonic() + 2.0
    remaining = stopped
    while remaining and time.monotonic() < deadline:
        remaining = {pid for pid in remaining if os.path.exists(f"/proc/{pid}")}
        time.sleep(0.005)
    return len(stopped)


def pid_alive(pid: int) -> bool:
    """Whether a process with this pid exists."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
