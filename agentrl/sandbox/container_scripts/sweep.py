"""The timeout sweep, run inside a Docker sandbox as ``python3 -c <this file> MODE TOKEN...``.

It runs as the sandbox uid, as the exec'd process itself (no fork needed, so it works while a
fork bomb fills the pids limit, whenever runc manages to start it; when runc cannot, the host
restarts the container instead). MODE is ``sweep`` or ``probe``; the TOKENs are the
``AGENTRL_EXEC`` values whose processes must survive (running commands, the command runner,
open shells). ``sweep`` first SIGSTOPs every other process of the sandbox uid (stopped
processes cannot fork), repeating until no new one appears, then SIGKILLs them all.
docker-init and the container's ``sleep`` run as another uid and are never touched.

It prints one line, ``agentrl-sweep ok=0|1 oom=N pids=N`` (``None`` for a counter the cgroup
does not have): whether the sweep worked, and the cgroup's OOM-kill and pids-limit counters.
Only python3-minimal modules may be used (no json).
"""

import os
import signal
import sys
import time

MARK = "agentrl-sweep"
TOKEN_VAR = "AGENTRL_EXEC"  # names the processes that survive: TOKEN_VAR=<token>
OOM_FILES = ["/sys/fs/cgroup/memory/memory.oom_control", "/sys/fs/cgroup/memory.events"]
PIDS_FILES = ["/sys/fs/cgroup/pids/pids.events", "/sys/fs/cgroup/pids.events"]


def state(pid):
    with open(f"/proc/{pid}/stat", "rb") as f:
        s = f.read()
    return s[s.rindex(b")") + 2 :].split()[0]


def kept(pid, keep):
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return bool(keep.intersection(f.read().split(b"\0")))
    except OSError:
        return False


def victims(keep):
    """Live processes of this uid, except this one and those carrying a kept token."""
    me, uid = os.getpid(), os.getuid()
    out = set()
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == me:
            continue
        try:
            if os.stat("/proc/" + name).st_uid != uid or state(int(name)) == b"Z":
                continue
        except (OSError, ValueError, IndexError):
            continue
        if not kept(int(name), keep):
            out.add(int(name))
    return out


def signal_all(pids, sig):
    for pid in pids:
        try:
            os.kill(pid, sig)
        except OSError:
            pass


def sweep(keep):
    """Stops, then kills, every victim; True once none is left."""
    seen = set()
    for _ in range(300):
        vs = victims(keep)
        new = vs - seen
        signal_all(new, signal.SIGSTOP)
        seen |= vs
        if new:
            time.sleep(0.002)
            continue
        signal_all(vs, signal.SIGKILL)
        time.sleep(0.02)
        if not victims(keep):
            return True
        seen = set()
    return False


def counter(paths, key):
    """The value of ``key`` in the first readable of the cgroup files ``paths``, or None."""
    for path in paths:
        try:
            with open(path) as f:
                for line in f:
                    k, _, v = line.partition(" ")
                    if k == key:
                        return int(v)
        except (OSError, ValueError):
            pass
    return None


def main():
    mode = sys.argv[1]
    keep = {f"{TOKEN_VAR}={t}".encode() for t in sys.argv[2:]}
    ok = sweep(keep) if mode == "sweep" else True
    oom, pids = counter(OOM_FILES, "oom_kill"), counter(PIDS_FILES, "max")
    print(f"{MARK} ok={ok:d} oom={oom} pids={pids}")


def parse_answer(output):
    """On the host: the answer printed by :func:`main` as a dict (``ok``, ``oom``, ``pids``:
    ints, or None for a counter the cgroup lacks), or None when there is none."""
    words = output.split()
    if MARK not in words:
        return None
    answer = {}
    for word in words[words.index(MARK) + 1 :]:
        key, _, value = word.partition("=")
        answer[key] = int(value) if value.isdigit() else None
    return answer


if __name__ == "__main__":
    main()
