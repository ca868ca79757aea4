"""Harbor's verifier, run the way Harbor runs it, on a sandbox the agent no longer touches.

:func:`grade` is the whole hand-over from the agent to the grader (the steps are listed in
:class:`agentrl_envs.harbor.HarborEnv`'s docstring): stop every process of the sandbox, copy
``tests/`` in, remove the workspace's links into the grader's directories, run
``bash /tests/test.sh`` with :func:`verifier_environment`, and read the reward with
:func:`read_reward`. What it protects and what it cannot: ``docs/harbor-grading.md``.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import shutil
import stat
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from agentrl.errors import GradingError
from agentrl.sandbox import WORKSPACE
from agentrl.sandbox.egress import Egress
from agentrl_envs.harbor import artifacts
from agentrl_envs.harbor.images import SEED_DIR
from agentrl_envs.harbor.task import ARTIFACTS_DIR, HarborStep, HarborTask

TESTS, LOGS, SOLUTION = "/tests", "/logs/verifier", "/solution"
GRADER_DIRS = (TESTS, LOGS, SOLUTION)
OUTPUT_TAIL = 2000
VERIFIER_HOME = "/root"
VERIFIER_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
REWARD_MAX_BYTES = 1 << 20
MAX_LINK_HOPS = 40  # the kernel's limit on symbolic links followed in one path lookup
PROC_SELF = ("self", "thread-self")
OPEN_FILE_LINKS = ("/dev/stdin", "/dev/stdout", "/dev/stderr")


async def grade(sandbox: Any, task: HarborTask, step: HarborStep, workdir: str,
                egress: Egress | None = None) -> tuple[float, dict[str, Any]]:
    """Runs the verifier of ``task``'s ``step`` in ``sandbox`` (a DockerSandbox with
    HarborEnv's private dirs) and returns (reward, details), as the class docstring of
    :class:`HarborEnv` describes; ``egress``: the verifier phase's network (None: the
    sandbox's stays).

    Raises:
        GradingError: The verifier timed out or wrote no valid reward file.
    """
    await sandbox.stop_processes()
    if egress is not None:  # the verifier phase's network policy, once nothing of the agent runs
        await sandbox.set_egress(egress)
    cwd = workdir if workdir != "/" else WORKSPACE
    return await _run_tests(sandbox, task, step, cwd, copy_tests=True)


async def _run_tests(sandbox: Any, task: HarborTask, step: HarborStep, cwd: str,
                     copy_tests: bool) -> tuple[float, dict[str, Any]]:
    """Hands ``sandbox`` over (see :func:`_hand_over`), runs ``bash /tests/test.sh`` in
    ``cwd`` and reads the reward."""
    mounts = (WORKSPACE, *sandbox.workspace_aliases)
    as_root = os.geteuid() == 0  # only then can the agent's files be given to root
    removed = await asyncio.to_thread(_hand_over, sandbox, step, cwd, mounts, as_root, copy_tests)
    as_user = {"user": "root"} if as_root else {}
    result = await sandbox.exec(["bash", f"{TESTS}/test.sh"], timeout=step.verifier_timeout_s,
                                env=verifier_environment(step, mounts), cwd=cwd, **as_user)
    tail = (result.stdout + result.stderr)[-OUTPUT_TAIL:]
    details: dict[str, Any] = {"exit_code": result.exit_code, "output_tail": tail,
                               "seconds": round(result.duration_s, 3),
                               "user": "root" if as_root else str(sandbox.uid),
                               "removed_links": removed}
    where = f"Harbor task {task.name}: " + (f"step {step.name!r}: " if step.name else "") + "tests/test.sh"
    if result.timed_out:
        raise GradingError(f"{where} did not finish within {step.verifier_timeout_s:g} s "
                           "(task.toml [verifier].timeout_sec); its output ends with: " + tail[-500:])
    reward, rewards = read_reward(sandbox.host_dir(LOGS), where, result.exit_code, tail)
    details["rewards"] = rewards
    return reward, details


async def grade_separately(
    agent: Any, task: HarborTask, step: HarborStep, agent_workdir: str, verifier_tag: str,
    verifier_workdir: str, make_sandbox: Callable[[Mapping[str, Any]], Any],
) -> tuple[float, dict[str, Any]]:
    """Runs ``step``'s verifier in a container of its own (Harbor's ``separate`` mode): the
    agent's container never runs the tests and the verifier's never runs the agent's code.

    1. Every process of the agent's container is stopped; the ``[[verifier.collect]]``
       commands run in it, as the sandbox's uid (the container's default user; as root when
       ``user = "root"``), with the verifier's clean variables (best effort: each one's exit
       code and output are recorded).
    2. The artifacts (``artifacts`` of the task and step, then ``/logs/artifacts``) are copied
       out through a sanitising filter (see :mod:`agentrl_envs.harbor.artifacts`).
    3. A fresh container starts from the verifier's image (``make_sandbox(options)`` makes
       it, unstarted, with ``image``, ``private_dirs`` and ``workspace_aliases``); its working
       directory is filled from the image, the artifacts are restored at their paths, and the
       tests are copied into ``/tests`` unless the image holds them.
    4. ``bash /tests/test.sh`` runs there as root (every capability dropped) and the reward is
       read as in :func:`grade`. The container is removed afterwards.

    Raises:
        GradingError: The verifier timed out or wrote no valid reward file.
    """
    assert step.verifier_environment is not None
    await agent.stop_processes()
    agent_cwd = agent_workdir if agent_workdir != "/" else WORKSPACE
    collect = []
    for hook in step.collect:
        as_root = hook.user in ("root", "0") and os.geteuid() == 0
        result = await agent.exec(["bash", "-c", hook.command], timeout=hook.timeout_s,
                                  env=verifier_environment(step, (WORKSPACE, *agent.workspace_aliases)),
                                  cwd=agent_cwd, **({"user": "root"} if as_root else {}))
        collect.append({"command": hook.command, "exit_code": result.exit_code,
                        "output_tail": (result.stdout + result.stderr)[-500:]})
    staging = Path(tempfile.mkdtemp(prefix="agentrl-harbor-artifacts-"))
    try:
        taken = await artifacts.take(agent, step.artifacts, staging)
        cwd = verifier_workdir if verifier_workdir != "/" else WORKSPACE
        private = {LOGS: "rw", ARTIFACTS_DIR: "ro"}
        if not step.verifier_environment.bundled_tests:
            private[TESTS] = "ro"
        # fast_exec off: no command runner of the sandbox's uid lives beside the verifier
        sandbox = make_sandbox({"image": verifier_tag, "private_dirs": private, "fast_exec": False,
                                "workspace_aliases": [] if cwd == WORKSPACE else [cwd]})
        try:
            await sandbox.start()
            seeded = await sandbox.exec(f"cp -R {SEED_DIR}/. {WORKSPACE}/", timeout=300)
            if seeded.exit_code != 0:
                raise GradingError(f"Harbor task {task.name}: cannot fill the verifier's working "
                                   f"directory: {(seeded.stderr or seeded.stdout)[-500:]}")
            await asyncio.to_thread(artifacts.restore, staging, step.artifacts, taken, sandbox.workspace,
                                    cwd, sandbox.host_dir(ARTIFACTS_DIR))
            reward, details = await _run_tests(sandbox, task, step, cwd, copy_tests=TESTS in private)
        finally:
            await sandbox.close()
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    details.update(verifier="separate", collect=collect, artifacts=taken)
    return reward, details


def verifier_environment(step: HarborStep, mounts: Sequence[str] = (WORKSPACE,)) -> dict[str, str]:
    """The variables of ``bash /tests/test.sh`` on top of the image's own: ``HOME`` (``/root``),
    ``PATH`` (the system directories), ``PYTHONNOUSERSITE=1``, ``LANG`` and ``TMPDIR``, then
    the step's ``[verifier].env``. A directory under one of ``mounts`` (where the agent's
    workspace is mounted) is never among them."""
    home = VERIFIER_HOME if not _within_any(VERIFIER_HOME, mounts) else "/nonexistent"
    path = ":".join(d for d in VERIFIER_PATH.split(":") if not _within_any(d, mounts))
    return {"HOME": home, "PATH": path, "PYTHONNOUSERSITE": "1", "LANG": "C.UTF-8",
            "TMPDIR": "/tmp", **step.verifier_env}


def read_reward(logs: str, where: str, exit_code: int | None,
                tail: str = "") -> tuple[float, dict[str, float | int]]:
    """The reward a verifier wrote into ``logs``, read as Harbor reads it, and every entry.

    ``reward.json`` wins whenever it exists (``reward.txt`` is then not read). It must be a
    JSON object whose values are all numbers (``true``/``false`` count as 1.0/0.0, as Harbor's
    result model makes them) and finite; the episode's reward is its ``reward`` entry, else its
    only entry. ``reward.txt`` must hold one finite number as Python's ``float`` reads it
    (surrounding whitespace allowed). The files are UTF-8.

    Returns:
        (the reward, the entries as Harbor records them: ``{"reward": value}`` for
        ``reward.txt``; ints stay ints).

    Raises:
        GradingError: Neither file exists; the one read is empty, malformed, a symbolic link or
            not a regular file, larger than 1 MiB; a value is not a finite number; or
            ``reward.json`` has several entries and none named ``reward`` (or none at all),
            for which Harbor records no reward either.
    """
    json_path, txt_path = os.path.join(logs, "reward.json"), os.path.join(logs, "reward.txt")
    if os.path.lexists(json_path):
        text = _reward_text(json_path, where)
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise GradingError(f"{where} wrote a malformed /logs/verifier/reward.json: {exc}") from exc
        for value in data.values() if isinstance(data, dict) else [data]:
            if not isinstance(value, (int, float)) or (isinstance(value, float) and not math.isfinite(value)):
                raise GradingError(f"{where} wrote /logs/verifier/reward.json with a value that is "
                                   f"not a finite number: {str(value)[:200]}")
        if not isinstance(data, dict):
            raise GradingError(f"{where} wrote /logs/verifier/reward.json that is a bare number, "
                               f"not a JSON object of rewards: {text[:200]}")
        rewards = {k: float(v) if isinstance(v, bool) else v for k, v in data.items()}
        if "reward" in rewards:
            primary = rewards["reward"]
        elif len(rewards) == 1:
            primary = next(iter(rewards.values()))
        else:
            raise GradingError(f"{where} wrote /logs/verifier/reward.json with "
                               f"{len(rewards) or 'no'} entries and none named 'reward': "
                               f"{sorted(rewards)[:20]}")
        try:
            return float(primary), rewards
        except OverflowError:
            raise GradingError(f"{where} wrote /logs/verifier/reward.json with a reward too large "
                               "for a float") from None
    if os.path.lexists(txt_path):
        text = _reward_text(txt_path, where)
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not math.isfinite(value):
            raise GradingError(f"{where} wrote /logs/verifier/reward.txt that is not one finite "
                               f"number: {text.strip()[:200]!r}")
        return value, {"reward": value}
    raise GradingError(f"{where} wrote no /logs/verifier/reward.txt or reward.json (exit code "
                       f"{exit_code}); its output ends with: {tail[-500:]}")


def _reward_text(path: str, where: str) -> str:
    """The text of a reward file: a regular file (never followed through a symbolic link, which
    could point anywhere on this machine), not empty, at most REWARD_MAX_BYTES, UTF-8."""
    name = "/logs/verifier/" + os.path.basename(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as exc:
        kind = "a symbolic link" if os.path.islink(path) else f"unreadable ({exc.strerror})"
        raise GradingError(f"{where} wrote {name} that is {kind}") from exc
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise GradingError(f"{where} wrote {name} that is not a regular file")
        chunks: list[bytes] = []
        size = 0
        while size <= REWARD_MAX_BYTES and (chunk := os.read(fd, REWARD_MAX_BYTES + 1 - size)):
            chunks.append(chunk)
            size += len(chunk)
    finally:
        os.close(fd)
    data = b"".join(chunks)
    if not data:
        raise GradingError(f"{where} wrote an empty {name}")
    if len(data) > REWARD_MAX_BYTES:
        raise GradingError(f"{where} wrote {name} larger than {REWARD_MAX_BYTES} bytes")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise GradingError(f"{where} wrote {name} that is not UTF-8: {exc}") from exc


def _hand_over(sandbox: Any, step: HarborStep, cwd: str, mounts: Sequence[str],
               as_root: bool, copy_tests: bool = True) -> list[str]:
    """Readies the sandbox for the verifier once nothing of the agent runs any more: copies the
    step's tests in, empties the log directory, removes the workspace's symbolic links that lead into
    the grader's directories (see :func:`_leads_to_grader`), and gives every file of the
    workspace to root when ``as_root`` (else the log directory to the sandbox's uid, which then
    runs the verifier). Returns the removed links, as paths under ``cwd``."""
    if copy_tests:
        fill(sandbox.host_dir(TESTS), *step.tests_dirs)
    logs = sandbox.host_dir(LOGS)
    _empty(logs)
    removed = _clean_workspace(sandbox.workspace, mounts, cwd, owner=0 if as_root else None)
    if not as_root:
        try:
            os.chown(logs, sandbox.uid, sandbox.uid)
        except PermissionError:  # not root: the directory is ours, so open it up instead
            os.chmod(logs, 0o777)
    return removed


def _clean_workspace(root: str, mounts: Sequence[str], shown_under: str, owner: int | None) -> list[str]:
    """Removes the symbolic links of the host directory ``root`` (mounted in the container at
    each of ``mounts``) that lead to the grader's directories, and with ``owner`` gives every
    other file and directory (``root`` included) to that uid and gid. Returns the removed links
    as container paths under ``shown_under``."""
    links: list[str] = []
    stack = [root]
    while stack:
        try:
            entries = os.scandir(stack.pop())
        except PermissionError:  # not root, and the agent locked it: the verifier cannot enter either
            continue
        with entries:
            for entry in entries:
                if entry.is_symlink():
                    links.append(entry.path)
                    continue
                if owner is not None:
                    os.lchown(entry.path, owner, owner)
                if entry.is_dir(follow_symlinks=False):
                    stack.append(entry.path)
    if owner is not None:
        os.chown(root, owner, owner)

    doomed = {link for link in links
              if any(_leads_to_grader(mount + link[len(root):], root, mounts) for mount in mounts)}
    for link in doomed:
        os.unlink(link)
    for link in links:
        if owner is not None and link not in doomed:
            os.lchown(link, owner, owner)
    return sorted(shown_under.rstrip("/") + link[len(root):] for link in doomed)


def _host_path(path: str, root: str, mounts: Sequence[str]) -> str | None:
    """The host path of the container path ``path`` when it lies in the workspace (mounted at
    each of ``mounts``, backed by the host directory ``root``), else None."""
    for mount in sorted(mounts, key=len, reverse=True):
        if path == mount or path.startswith(mount + "/"):
            return root + path[len(mount):]
    return None


def _leads_to_grader(path: str, root: str, mounts: Sequence[str]) -> bool:
    """Whether resolving the container path ``path`` as the kernel would, following the
    symbolic links of the workspace (the host directory ``root``, mounted at each of
    ``mounts``), reaches one of the grader's directories (``/tests``, ``/logs/verifier``,
    ``/solution``), ends on a directory that holds one (``/``, ``/logs``), or goes through a
    process's own directory under ``/proc`` or an open-file link (``/dev/fd``, ``/dev/stdin``,
    ...), which reach any file a process has open, or its root or working directory.

    The image's own links are not visible from here, so a ``..`` taken outside the workspace
    (where one of them may have led: ``/var/run/..`` is ``/``, not ``/var``) counts as reaching
    the grader too."""
    pending = [part for part in path.split("/") if part]
    here: list[str] = []
    hops = 0
    while pending:
        part = pending.pop(0)
        current = "/" + "/".join(here)
        if part == ".":
            continue
        if part == "..":
            if here and _host_path(current, root, mounts) is None:
                return True
            if here:
                here.pop()
            continue
        here.append(part)
        current = "/" + "/".join(here)
        if (any(_within(current, d) for d in GRADER_DIRS) or current in OPEN_FILE_LINKS
                or _within(current, "/dev/fd")
                or (here[0] == "proc" and len(here) >= 2 and (here[1].isdigit() or here[1] in PROC_SELF))):
            return True
        host = _host_path(current, root, mounts)
        if host is not None and os.path.islink(host):
            hops += 1
            if hops > MAX_LINK_HOPS:  # the kernel gives up too (ELOOP)
                return False
            target = os.readlink(host)
            here.pop()
            if target.startswith("/"):
                here = []
            pending[:0] = [p for p in target.split("/") if p]
    final = "/" + "/".join(here)
    return any(_within(d, final) for d in GRADER_DIRS)


def _within(path: str, directory: str) -> bool:
    """Whether ``path`` is ``directory`` or lies under it (absolute, normalized paths)."""
    return path == directory or path.startswith(directory.rstrip("/") + "/")


def _within_any(path: str, directories: Sequence[str]) -> bool:
    return any(_within(path, d) for d in directories)


def fill(host_dir: str, *sources: Path) -> None:
    """Replaces ``host_dir``'s contents with a copy of ``sources``, in order (a later source's
    files replace an earlier one's)."""
    _empty(host_dir)
    for source in sources:
        if source.is_dir():
            shutil.copytree(source, host_dir, dirs_exist_ok=True, symlinks=False)


async def reopen(sandbox: Any, mounts: Sequence[str]) -> None:
    """Readies a graded sandbox for the agent's next step, leaving nothing of the grader: every
    process is stopped again (the container restarts, which also empties ``/tmp`` and
    ``/dev/shm``, where the verifier may have written what it read from the tests), the tests
    and the verifier's logs are removed, and when agentrl runs as root the workspace's files,
    given to root for grading, go back to the sandbox's uid."""
    await sandbox.stop_processes()

    def files() -> None:
        for directory in (TESTS, LOGS):
            _empty(sandbox.host_dir(directory))
        if os.geteuid() == 0:
            _clean_workspace(sandbox.workspace, mounts, "/", owner=sandbox.uid)

    await asyncio.to_thread(files)


def _empty(host_dir: str) -> None:
    for name in os.listdir(host_dir):
        path = os.path.join(host_dir, name)
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path)
        else:
            os.unlink(path)
