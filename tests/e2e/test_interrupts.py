"""Stopping ``train.py`` and ``agentrl eval`` with SIGINT / SIGTERM at chosen moments, on the
bwrap and Docker sandboxes: each stop leaves no mount, workspace, uid claim, container or
process behind, exits with the signal's status and says in one line what was interrupted and
how to continue."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

from agentrl.models import build_tiny_model
from agentrl.sandbox._procs import sandbox_root
from tests.support.sandboxes import backend_skip_reason

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]


def tiny() -> list[str]:
    """The random tiny model (not swe-tools' shipped warm start): its long, tool-less responses
    keep the episodes waiting on the model, where the signals below are meant to land."""
    return ["--hf-checkpoint", str(build_tiny_model())]


def swe_run() -> list[str]:
    return ["--env", "swe-tools", *tiny(), "--max-turns", "3", "--rollout-batch-size", "2",
            "--n-samples-per-prompt", "2", "--no-progress"]


SLEEPY_PLUGIN = '''\
import asyncio

from agentrl.rollout.custom import aexecute_tool


async def custom_generate(args, samples, evaluation=False):
    call = {"name": "bash", "arguments": {"command": "sleep 300", "timeout": 300}}
    await asyncio.gather(*(aexecute_tool(call, sample) for sample in samples))
    return samples
'''
"""A plug-in whose episodes all sit in a sandbox command when the signal comes."""
STUBBORN_PLUGIN = SLEEPY_PLUGIN.replace(
    "import asyncio\n", "import asyncio\nimport os\nimport signal\nimport time\n").replace(
    "    await asyncio.gather(*(aexecute_tool(call, sample) for sample in samples))\n",
    "    try:\n"
    "        await asyncio.gather(*(aexecute_tool(call, sample) for sample in samples))\n"
    "    finally:  # the clean stop is under way: the second signal comes, and this never returns\n"
    "        os.kill(os.getpid(), signal.SIGINT)\n"
    "        time.sleep(300)\n")
"""A plug-in that sends the run its second signal as soon as the first signal's clean stop
reaches it (its sandbox commands are stopped then), while the clean stop is still closing the
sandboxes: a signal from outside could land only after the clean stop ended."""

DEAF_PLUGIN = STUBBORN_PLUGIN.replace("        os.kill(os.getpid(), signal.SIGINT)\n", "")
"""A plug-in that ignores the stop: once its sandbox commands are stopped it sleeps on."""


def _backend(name: str) -> list[str]:
    reason = backend_skip_reason(name)
    if reason is not None:
        pytest.skip(reason)
    return ["--env-kwarg", f"sandbox={name}"]


_STARTED: list[Run] = []
"""Runs started by the test going on; killed after it, so that a failed test's run (its
sandbox commands included) cannot outlive it and fail the tests after it."""


@pytest.fixture(autouse=True)
def _no_run_outlives_its_test():
    yield
    while _STARTED:
        run = _STARTED.pop()
        if run.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(run.pid, signal.SIGKILL)
            run.process.wait(30)


class Run:
    """A ``train.py`` / ``agentrl`` process in a session of its own. Its sandboxes are told
    apart from others' by its pid (in workspace names, uid claims and container labels)."""

    def __init__(self, argv: list[str], tmp_path: Path) -> None:
        self.root = Path(sandbox_root())  # sandbox uids must reach it: not under pytest's 0700 tmp
        self.started = time.time()
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        self.stderr_path = tmp_path / "stderr.txt"
        self.process = subprocess.Popen(argv, cwd=tmp_path, env=env, stdout=subprocess.DEVNULL,
                                        stderr=self.stderr_path.open("w"), start_new_session=True)
        self.pid = self.process.pid
        _STARTED.append(self)

    def wait_for(self, condition: Callable[[], bool], what: str, timeout: float = 300) -> None:
        deadline = time.monotonic() + timeout
        while not condition():
            if self.process.poll() is not None:
                pytest.fail(f"the run ended before {what}: {self.stderr()[-3000:]}")
            if time.monotonic() > deadline:
                self.process.kill()
                pytest.fail(f"no {what} within {timeout} s: {self.stderr()[-3000:]}")
            time.sleep(0.1)

    def signal(self, signum: int, *, group: bool = False) -> None:
        if group:  # as a scheduler stopping a job, or Ctrl-C in a terminal
            os.killpg(self.pid, signum)
        else:
            os.kill(self.pid, signum)

    def finish(self, timeout: float = 120) -> tuple[int, str]:
        try:
            code = self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            pytest.fail(f"the run did not stop within {timeout} s: {self.stderr()[-3000:]}")
        return code, self.stderr()

    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")

    # -- what a run leaves behind ------------------------------------------------------------

    def mounts(self) -> list[str]:
        return [line for line in Path("/proc/mounts").read_text().splitlines()
                if f"ws-{self.pid}-" in line]

    def workspaces(self) -> list[str]:
        return sorted(p.name for p in self.root.glob(f"ws-{self.pid}-*")) if self.root.exists() else []

    def uid_claims(self) -> list[str]:
        claims = self.root / "uids"
        if not claims.is_dir():
            return []
        return [p.name for p in claims.iterdir() if p.read_text().strip() == str(self.pid)]

    def containers(self) -> list[str]:
        if backend_skip_reason("docker") is not None:
            return []
        from agentrl.sandbox._docker_api import get_client

        client = get_client()  # the daemon agentrl uses (DOCKER_HOST, or the private one)
        # ignore_removed: a container removed between the listing and its inspection is gone
        found = client.containers.list(all=True, ignore_removed=True,
                                       filters={"label": f"agentrl.owner_pid={self.pid}"})
        return [c.name for c in found]

    def processes(self) -> list[str]:
        """Processes of the run's session (Ray's included) and sandbox commands still alive:
        the ``sleep 300`` the tests' episodes run, started after the run itself (one that an
        earlier test or another program started is not this run's)."""
        left = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                stat = (entry / "stat").read_text()
                cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
            except OSError:
                continue
            fields = stat.rsplit(")", 1)[1].split()
            if fields[0] == "Z":
                continue
            if int(fields[3]) == self.pid or (cmdline == "sleep 300" and _started_after(entry.name, self.started)):
                left.append(f"{entry.name}: {cmdline[:120]}")
        return left

    def sandboxes_live(self) -> bool:
        return bool(self.mounts() or self.containers())

    def assert_nothing_left(self) -> None:
        deadline = time.monotonic() + 20  # Ray's processes follow the driver within seconds
        while self.processes() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert self.processes() == []
        assert self.mounts() == []
        assert self.workspaces() == []
        assert self.uid_claims() == []
        assert self.containers() == []


def train(*flags: str, tmp_path: Path) -> Run:
    return Run([sys.executable, str(REPO / "train.py"), *flags,
                "--output-dir", str(tmp_path / "run")], tmp_path)


def _started_after(pid: str, moment: float) -> bool:
    """Whether process ``pid`` started at or after ``moment`` (seconds since the epoch); a
    process that is gone did not."""
    try:
        return psutil.Process(int(pid)).create_time() >= moment - 1.0
    except psutil.Error:
        return False


def commands_running() -> bool:
    return any((p / "cmdline").read_bytes() == b"sleep\x00300\x00"
               for p in Path("/proc").iterdir() if p.name.isdigit() and _readable(p))


def _readable(path: Path) -> bool:
    try:
        (path / "cmdline").read_bytes()
    except OSError:
        return False
    return True


# While episodes wait on the model: each signal and each backend once (a Ray run each, the
# costly kind). While sandboxes run a command, where a backend's clean-up races the signal:
# every signal on every backend.
BOTH = [(signal.SIGINT, "bwrap"), (signal.SIGTERM, "docker")]
EVERY = [(signum, backend) for signum in (signal.SIGINT, signal.SIGTERM) for backend in ("bwrap", "docker")]


def _name(signum: int) -> str:
    return signal.Signals(signum).name


@pytest.mark.parametrize(("signum", "backend"), BOTH)
def test_a_signal_while_episodes_wait_on_the_model_leaks_nothing(signum, backend, tmp_path):
    # long responses: the episodes spend their time waiting on the model
    run = train(*swe_run(), *_backend(backend), "--rollout-max-response-len", "2048",
                "--num-rollout", "2", tmp_path=tmp_path)
    run.wait_for(run.sandboxes_live, "live sandboxes")
    run.signal(signum, group=True)  # Ctrl-C reaches the whole foreground group
    code, stderr = run.finish()
    assert code == 128 + signum, stderr[-3000:]
    assert f"train.py: interrupted by {_name(signum)} during rollout 0" in stderr
    assert "no complete checkpoint under" in stderr
    assert "Traceback" not in stderr
    run.assert_nothing_left()


@pytest.mark.parametrize(("signum", "backend"), EVERY)
def test_a_signal_while_sandboxes_run_a_command_leaks_nothing(signum, backend, tmp_path):
    plugin = tmp_path / "sleepy.py"
    plugin.write_text(SLEEPY_PLUGIN)
    run = train(*swe_run(), *_backend(backend), "--no-use-ray", "--custom-generate-function-path",
                str(plugin), "--num-rollout", "1", tmp_path=tmp_path)
    # its own sandboxes up and their commands running: a "sleep 300" of another run (containers
    # of the test before being torn down) must not start the signal early
    run.wait_for(lambda: run.sandboxes_live() and commands_running(), "sandbox commands running")
    run.signal(signum)
    code, stderr = run.finish()
    assert code == 128 + signum, stderr[-3000:]
    assert f"train.py: interrupted by {_name(signum)} during rollout 0" in stderr
    assert "Traceback" not in stderr
    run.assert_nothing_left()


# SIGTERM only: SIGINT to the process group reaches the same handler (see BOTH above), and a
# save cut short is the same whichever signal cut it.
@pytest.mark.parametrize("signum", [pytest.param(signal.SIGTERM, id="SIGTERM")])
def test_a_signal_to_the_process_group_during_a_save_names_a_complete_checkpoint(signum, tmp_path):
    from agentrl.run.checkpoints import checkpoint_problem

    saves = tmp_path / "run" / "checkpoints"
    run = train(*swe_run(), *_backend("bwrap"), "--num-rollout", "3", "--save-interval", "1",
                tmp_path=tmp_path)
    # the second save has begun: the first is sealed, the second being written (in its
    # staging folder, renamed to rollout_00002 once complete)
    run.wait_for(lambda: (saves / ".rollout_00002.partial").exists(), "the second save", timeout=600)
    run.signal(signum, group=True)  # Ray's own processes get it too
    code, stderr = run.finish()
    assert code == 128 + signum, stderr[-3000:]
    assert f"train.py: interrupted by {_name(signum)} during rollout 1" in stderr
    named = re.search(r"newest complete checkpoint: (\S+); continue with: (.+)", stderr)
    assert named, stderr[-3000:]
    assert checkpoint_problem(Path(named.group(1))) is None
    assert Path(named.group(1)).name in ("rollout_00001", "rollout_00002")
    assert named.group(2).endswith(f"--load {saves}")
    assert "--num-rollout 3" in named.group(2)
    run.assert_nothing_left()


def test_a_second_signal_exits_at_once_and_still_removes_the_sandboxes(tmp_path):
    plugin = tmp_path / "stubborn.py"
    plugin.write_text(STUBBORN_PLUGIN)
    assert "os.kill(os.getpid(), signal.SIGINT)" in STUBBORN_PLUGIN
    run = train(*swe_run(), *_backend("bwrap"), "--no-use-ray", "--custom-generate-function-path",
                str(plugin), "--num-rollout", "1", tmp_path=tmp_path)
    run.wait_for(lambda: run.sandboxes_live() and commands_running(), "sandbox commands running")
    run.signal(signal.SIGINT)
    code, stderr = run.finish(timeout=30)
    assert "stopping rollout 0" in stderr  # the first signal's notice
    assert code == 130, stderr[-3000:]
    assert "a second SIGINT ended the clean-up" in stderr
    run.assert_nothing_left()


def test_a_plugin_that_ignores_the_stop_does_not_keep_the_run_alive(tmp_path):
    plugin = tmp_path / "deaf.py"
    plugin.write_text(DEAF_PLUGIN)
    assert "os.kill" not in DEAF_PLUGIN and "time.sleep(300)" in DEAF_PLUGIN
    run = train(*swe_run(), *_backend("bwrap"), "--no-use-ray", "--custom-generate-function-path",
                str(plugin), "--num-rollout", "1", tmp_path=tmp_path)
    run.wait_for(lambda: run.sandboxes_live() and commands_running(), "sandbox commands running")
    run.signal(signal.SIGINT)
    code, stderr = run.finish(timeout=60)  # one signal is enough: its thread does not hold exit
    assert code == 130, stderr[-3000:]
    assert "train.py: interrupted by SIGINT during rollout 0" in stderr
    assert "Traceback" not in stderr
    run.assert_nothing_left()


def test_agentrl_eval_stopped_by_sigint_leaks_nothing(tmp_path):
    run = Run([sys.executable, "-m", "agentrl", "eval", "--env", "swe-tools", "--policy", "model",
               *tiny(), "--max-turns", "3", "--max-response-len", "2048", "--limit", "4",
               *_backend("bwrap")], tmp_path)
    run.wait_for(run.sandboxes_live, "live sandboxes")
    run.signal(signal.SIGINT, group=True)
    code, stderr = run.finish()
    assert code == 130, stderr[-3000:]
    assert "agentrl: interrupted by SIGINT during the evaluation of model" in stderr
    assert "Traceback" not in stderr
    run.assert_nothing_left()


def test_a_signal_while_a_large_prompt_file_is_read_stops_the_run_there(tmp_path):
    """Reading a prompt file holds the event loop (no await between its rows): the signal
    stops it mid-read instead of waiting until the whole file is parsed."""
    rows = tmp_path / "tasks.jsonl"
    with rows.open("w") as f:
        for i in range(1_000_000):  # seconds of parsing on any machine
            f.write(f'{{"question": "What is {i} * 3?", "expression": "{i} * 3", "answer": {3 * i}}}\n')
    out = tmp_path / "run"
    process = subprocess.Popen([sys.executable, str(REPO / "train.py"), "--env", "calc", "--prompt-data",
                                str(rows), "--num-rollout", "1", "--no-use-ray", "--no-progress",
                                "--output-dir", str(out)], cwd=tmp_path, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not out.is_dir() and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)  # the run's folder is made just before the prompts are read
    time.sleep(0.3)
    process.send_signal(signal.SIGINT)
    signalled = time.monotonic()
    _, stderr = process.communicate(timeout=120)
    assert time.monotonic() - signalled < 30
    assert process.returncode == 130, stderr[-3000:]
    assert "train.py: interrupted by SIGINT during start-up" in stderr and "Traceback" not in stderr
    assert not (out / "run.json").exists()  # stopped inside the read, before the launch record


COUNTING_RM = '''\
import os


def rm(args, sample):
    with open(os.environ["AGENTRL_TEST_MARKS"], "a") as marks:
        marks.write("graded\\n")
    return float(len(sample.response) % 2)
'''
"""A reward that leaves one line per graded sample: once all are there, the rollout is over
and the trainer's step is under way."""


def test_a_signal_during_the_trainers_step_stops_the_run_within_seconds(tmp_path):
    rm = tmp_path / "rm.py"
    rm.write_text(COUNTING_RM)
    marks = tmp_path / "marks.txt"
    os.environ["AGENTRL_TEST_MARKS"] = str(marks)  # inherited by the run started below
    try:
        # 32 samples of up to 512 tokens, one optimizer step each: the step takes a while
        run = train("--env", "calc", "--rollout-batch-size", "8", "--n-samples-per-prompt", "4",
                    "--max-turns", "1", "--rollout-max-response-len", "512", "--custom-rm-path", str(rm),
                    "--num-steps-per-rollout", "32", "--num-rollout", "1", "--no-progress",
                    tmp_path=tmp_path)
    finally:
        del os.environ["AGENTRL_TEST_MARKS"]
    run.wait_for(lambda: marks.is_file() and len(marks.read_text().splitlines()) >= 32, "the rollout's end")
    time.sleep(1.0)  # 32 optimizer steps: the trainer is well inside them
    run.signal(signal.SIGINT, group=True)
    signalled = time.monotonic()
    code, stderr = run.finish()
    assert time.monotonic() - signalled < 30
    assert code == 130, stderr[-3000:]
    assert "train.py: interrupted by SIGINT during rollout 0 (training)" in stderr
    assert "Traceback" not in stderr


def test_a_wait_on_an_unreachable_server_says_so_and_a_sigterm_ends_it_in_one_line(tmp_path):
    """--rollout-engine-urls naming nothing: the run says every few seconds what it waits on;
    a SIGTERM then (after Ray started, which installs a SIGTERM handler of its own) ends it
    with the one-line message and the shell's status, not a silent exit or tracebacks."""
    run = train("--env", "calc", "--num-rollout", "1", "--rollout-backend", "vllm",
                "--rollout-engine-urls", "http://127.0.0.1:9", "--no-progress", tmp_path=tmp_path)
    run.wait_for(lambda: "waiting for vLLM server http://127.0.0.1:9 to answer" in run.stderr(),
                 "the line saying what the run waits on", timeout=120)
    assert "(is it running, and is the URL right?)" in run.stderr()
    run.signal(signal.SIGTERM)
    code, stderr = run.finish()
    assert code == 143, stderr[-3000:]
    assert "train.py: interrupted by SIGTERM during start-up" in stderr
    assert "Traceback" not in stderr
    run.assert_nothing_left()
    # it recorded nothing but its launch: the folder it made is taken back (no run.json-only
    # folder for agentrl view or runs/latest to point at)
    assert not (tmp_path / "run").exists()
