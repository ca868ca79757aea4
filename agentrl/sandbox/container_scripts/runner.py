"""The command runner, run inside a Docker sandbox as ``python3 -u -c <this file>``.

One long-lived process per sandbox (started by one ``docker exec`` with its stdin attached,
running as the sandbox uid) that forks the commands itself, so a command costs a fork instead
of a runc exec (~100 ms of CPU each on our machines).

Frames both ways are a 9-byte header (kind, request id, payload length) and the payload.
Host -> runner: START (payload: NUL-joined cwd, output cap, has-stdin, number of env entries,
env, argv), STDIN (data; empty = EOF), KILL. Runner -> host: OUT, ERR (at most ``cap`` bytes
each), EXIT (``"status dropped-out dropped-err"``), FAIL (could not fork: the host falls back
to docker exec), HELLO. A child that exited is reported once its pipes close, or 1 s later
(like docker). When the host's end of stdin closes, every command is killed and the runner
exits.

Only python3-minimal modules may be used. The host imports this module for the constants
below (importing it runs nothing).
"""

import errno
import os
import selectors
import signal
import struct
import subprocess
import sys
import time

HEADER = struct.Struct(">BII")
START, STDIN, KILL = 1, 2, 3  # host -> runner
OUT, ERR, EXIT, FAIL, HELLO = 1, 2, 3, 4, 9  # runner -> host
GREETING = b"agentrl-runner 1"
LINGER_S = 1.0  # how long an exited command's pipes may stay open (held by its descendants)

sel = selectors.DefaultSelector()
jobs = {}


def send(kind, rid, data=b""):
    view = memoryview(HEADER.pack(kind, rid, len(data)) + data)
    while view:
        view = view[os.write(1, view) :]


def killpg(job):
    try:
        os.killpg(job["p"].pid, signal.SIGKILL)
    except OSError:
        pass


def close_fd(job, fd):
    try:
        sel.unregister(fd)
    except (KeyError, ValueError):
        pass
    os.close(fd)
    job["fds"].discard(fd)


def finish(job, report=True):
    for fd in list(job["fds"]):
        close_fd(job, fd)
    if job["stdin"] is not None:
        if job["wreg"]:
            sel.unregister(job["stdin"])
        os.close(job["stdin"])
        job["stdin"] = None
    code = job["p"].poll()
    if code is not None and code < 0:
        code = 128 - code
    jobs.pop(job["rid"], None)
    if report:
        send(EXIT, job["rid"], f"{code} {job['drop'][0]} {job['drop'][1]}".encode())


def start(rid, payload):
    f = payload.split(b"\0")
    cwd, cap, has_stdin, nenv = f[0].decode(), int(f[1]), f[2] == b"1", int(f[3])
    env = dict(e.split(b"=", 1) for e in f[4 : 4 + nenv])
    argv = f[4 + nenv :]
    try:
        p = subprocess.Popen(argv, stdin=subprocess.PIPE if has_stdin else subprocess.DEVNULL,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=cwd, env=env,
                             start_new_session=True)
    except OSError as e:
        if e.errno in (errno.EAGAIN, errno.ENOMEM, errno.EMFILE, errno.ENFILE):
            send(FAIL, rid, str(e).encode())
            return
        send(ERR, rid, f"agentrl: cannot run the command: {e}\n".encode())
        send(EXIT, rid, f"{126 if e.filename == cwd else 127} 0 0".encode())
        return
    job = {"rid": rid, "p": p, "cap": cap, "kept": [0, 0], "drop": [0, 0], "fds": set(),
           "stdin": None, "wreg": False, "buf": bytearray(), "eof": False, "exited": None}
    for i, pipe in enumerate((p.stdout, p.stderr)):
        fd = os.dup(pipe.fileno())
        pipe.close()
        os.set_blocking(fd, False)
        job["fds"].add(fd)
        sel.register(fd, selectors.EVENT_READ, (job, i))
    if has_stdin:
        fd = os.dup(p.stdin.fileno())
        p.stdin.close()
        os.set_blocking(fd, False)
        job["stdin"] = fd
    jobs[rid] = job


def pump_stdin(job):
    fd = job["stdin"]
    if fd is None:
        return
    try:
        while job["buf"]:
            del job["buf"][: os.write(fd, job["buf"][:65536])]
    except BlockingIOError:
        pass
    except OSError:
        job["buf"].clear()
        job["eof"] = True
    if job["buf"]:
        if not job["wreg"]:
            sel.register(fd, selectors.EVENT_WRITE, ("in", job))
            job["wreg"] = True
        return
    if job["wreg"]:
        sel.unregister(fd)
        job["wreg"] = False
    if job["eof"]:
        os.close(fd)
        job["stdin"] = None


def on_request(kind, rid, payload):
    if kind == START:
        start(rid, payload)
        return
    job = jobs.get(rid)
    if job is None:
        return
    if kind == STDIN:
        if payload:
            job["buf"] += payload
        else:
            job["eof"] = True
        pump_stdin(job)
    elif kind == KILL:
        killpg(job)
        job["p"].wait()
        finish(job, report=False)


def reap_exited():
    """Reports the commands that exited and whose pipes closed (or lingered too long); returns
    how long to wait at most for the next one to be due (None: no limit)."""
    now = time.monotonic()
    wait = None
    for job in list(jobs.values()):
        if job["exited"] is None and job["p"].poll() is not None:
            job["exited"] = now
        if job["exited"] is not None:
            if not job["fds"] or now - job["exited"] >= LINGER_S:
                finish(job)
            else:
                left = job["exited"] + LINGER_S - now
                wait = left if wait is None else min(wait, left)
    return wait


def on_output(job, i, fd):
    try:
        chunk = os.read(fd, 65536)
    except BlockingIOError:
        return
    except OSError:
        chunk = b""
    if not chunk:
        close_fd(job, fd)
        return
    room = max(0, job["cap"] - job["kept"][i])
    if room:
        send(OUT + i, job["rid"], chunk[:room])
        job["kept"][i] += min(room, len(chunk))
    job["drop"][i] += max(0, len(chunk) - room)


def main():
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *a: None)
    os.set_blocking(0, False)
    sel.register(0, selectors.EVENT_READ, "host")
    sel.register(wake_r, selectors.EVENT_READ, "wake")
    inbuf = bytearray()
    send(HELLO, 0, GREETING)
    while True:
        for key, _ in sel.select(reap_exited()):
            tag = key.data
            if tag == "wake":
                try:
                    while os.read(wake_r, 4096):
                        pass
                except BlockingIOError:
                    pass
            elif tag == "host":
                try:
                    chunk = os.read(0, 262144)
                except BlockingIOError:
                    continue
                if not chunk:
                    for job in list(jobs.values()):
                        killpg(job)
                    sys.exit(0)
                inbuf += chunk
                while len(inbuf) >= HEADER.size:
                    kind, rid, size = HEADER.unpack_from(inbuf)
                    if len(inbuf) < HEADER.size + size:
                        break
                    payload = bytes(inbuf[HEADER.size : HEADER.size + size])
                    del inbuf[: HEADER.size + size]
                    on_request(kind, rid, payload)
            elif tag[0] == "in":
                pump_stdin(tag[1])
            else:
                on_output(*tag, key.fd)


if __name__ == "__main__":
    main()
