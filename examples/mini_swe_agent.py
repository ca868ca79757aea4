"""mini-swe-agent as a black-box agent for ``swe-tools``: its shell commands run in the episode's
agentrl sandbox, its model is agentrl's OpenAI-compatible endpoint.

    agentrl eval --env swe-tools --agent examples/mini_swe_agent.py:run ...
    python train.py --env swe-tools --agent-function-path examples/mini_swe_agent.py:run ...

agentrl calls :func:`run` once per episode. It builds mini-swe-agent's ``DefaultAgent`` from the
package's own ``mini.yaml`` (OpenAI function calling with one ``bash`` tool; the agent ends by
running ``echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT``), with

* ``LitellmModel`` on ``openai/<endpoint.model>`` at ``endpoint.base_url`` (litellm's generic
  OpenAI-compatible provider), cost tracking off (a local model has no price),
* :class:`SandboxEnvironment`, which runs each command in ``endpoint.sandbox`` (never on the
  host), in ``/workspace`` where swe-tools puts the project,
* a step limit of ``AGENTRL_MSWEA_STEP_LIMIT`` model calls (default 8) and no cost limit.

mini-swe-agent is synchronous, so the agent runs in a thread of its own; each command is handed back
to the episode's event loop (``endpoint.loop``), where the sandbox's coroutines must run. The
function returns ``None``: agentrl then grades the episode with the env's ``compute_reward``
(swe-tools runs the project's tests, hidden ones included, in the same sandbox).

Requires ``pip install mini-swe-agent`` (tested with 2.4.6).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import os
import threading
from collections.abc import Coroutine, Mapping, Sequence
from typing import Any, Protocol, TypeVar

# mini-swe-agent and litellm read these when they are imported, so they are set first. They keep
# both offline and quiet: no first-run set-up wizard or banner, no download of litellm's price
# list (a model served by agentrl has no price; a missing one must not be an error), litellm's
# offline mode for everything else it would fetch. ``setdefault`` leaves a caller's choice alone.
os.environ.setdefault("MSWEA_CONFIGURED", "true")
os.environ.setdefault("MSWEA_SILENT_STARTUP", "true")
os.environ.setdefault("MSWEA_COST_TRACKING", "ignore_errors")
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("LITELLM_OFFLINE_MODE", "true")
# mini-swe-agent retries a failed model call 10 times with waits of up to a minute; against
# agentrl's local endpoint a failure is not transient, so a few quick tries are enough.
os.environ.setdefault("MSWEA_MODEL_RETRY_STOP_AFTER_ATTEMPT", "3")

import litellm
import yaml
from minisweagent.agents.default import DefaultAgent
from minisweagent.config import builtin_config_dir
from minisweagent.exceptions import InterruptAgentFlow, Submitted
from minisweagent.models.litellm_model import LitellmModel

from agentrl.sandbox import WORKSPACE, Sandbox

# litellm prints a provider-list banner whenever it cannot price a response (agentrl's model
# names have no provider prefix); the price is not used, so the banner is noise.
litellm.suppress_debug_info = True

STEP_LIMIT = int(os.environ.get("AGENTRL_MSWEA_STEP_LIMIT", "8"))
"""Most model calls per episode (mini-swe-agent's ``step_limit``)."""

CONFIG_FILE = builtin_config_dir / "mini.yaml"
"""mini-swe-agent's default config. Its benchmark config (``benchmarks/swebench.yaml``) is not
used: it tells the agent the code is in ``/testbed`` and to submit a ``git diff``, and a
swe-tools workspace is neither (the env grades the files in place)."""

SUBMIT_MARKER = "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"
"""First output line by which a command ends the run (mini-swe-agent's submit command is
``echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT``)."""

log = logging.getLogger(__name__)

T = TypeVar("T")


class Endpoint(Protocol):
    """What agentrl passes to an agent function (the attributes this agent uses)."""

    base_url: str
    api_key: str
    model: str
    sandbox: Sandbox | None
    messages: Sequence[Mapping[str, Any]]
    loop: asyncio.AbstractEventLoop


class Stopped(InterruptAgentFlow):
    """The episode stopped waiting for the agent (it was cancelled); the thread ends the run."""


class SandboxEnvironment:
    """mini-swe-agent's Environment protocol over an agentrl sandbox.

    ``execute`` runs one command with ``bash -c`` in the sandbox, on the episode's loop, and
    answers as mini-swe-agent's own environments do: ``output`` (stdout and stderr together, in
    order), ``returncode``, ``exception_info`` (why it did not finish normally). A command whose
    first output line is the submit marker raises :class:`~minisweagent.exceptions.Submitted`,
    which ends the agent's run.

    Args:
        sandbox: The episode's sandbox.
        loop: The loop the sandbox's coroutines run on.
        stop: Set when the episode is cancelled; the next command ends the run instead.
        env: Environment variables for every command (the config's ``environment.env``).
        cwd: Working directory of every command.
        system_info: ``system``, ``release``, ``version``, ``machine`` of the sandbox (for
            the config's templates).
        timeout: Seconds per command; ``None``: the sandbox's own limit.
    """

    def __init__(
        self,
        sandbox: Sandbox,
        loop: asyncio.AbstractEventLoop,
        stop: threading.Event,
        *,
        env: Mapping[str, str] | None = None,
        cwd: str = WORKSPACE,
        system_info: Mapping[str, str] | None = None,
        timeout: float | None = None,
    ) -> None:
        self.sandbox = sandbox
        self.loop = loop
        self.stop = stop
        self.system_info = dict(system_info or {})
        # mini-swe-agent's agents read ``config`` only through serialize(); a dict suffices.
        self.config: dict[str, Any] = {"cwd": cwd, "env": dict(env or {}), "timeout": timeout}

    def _on_loop(self, coroutine: Coroutine[Any, Any, T]) -> T:
        """Runs ``coroutine`` on the episode's loop and waits for it (from the agent's thread)."""
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result()

    def execute(self, action: dict, cwd: str = "", *, timeout: int | None = None) -> dict[str, Any]:
        """Runs ``action["command"]`` in the sandbox; see the class docstring."""
        if self.stop.is_set():
            raise Stopped({"role": "exit", "content": "Stopped",
                           "extra": {"exit_status": "Stopped", "submission": ""}})
        command = action.get("command", "")
        # ``exec 2>&1`` on the command's own first line: one stream in the order it was written
        # (as mini-swe-agent's local and docker environments give), with bash's line numbers
        # in error messages unchanged.
        result = self._on_loop(self.sandbox.exec(
            ["bash", "-c", f"exec 2>&1; {command}"],
            timeout=timeout or self.config["timeout"],
            env=self.config["env"],
            cwd=cwd or self.config["cwd"],
        ))
        output = result.stdout + result.stderr
        exception_info = ""
        if result.timed_out:
            exception_info = (f"The command timed out after {result.duration_s:.0f} s and was "
                              "killed, with everything it started.")
        elif result.limit_hit:
            exception_info = f"The command was stopped: the sandbox's {result.limit_hit} limit."
        if result.truncated:
            exception_info = (exception_info + " The output was cut at the sandbox's limit.").strip()
        returncode = -1 if result.exit_code is None else result.exit_code
        answer = {"output": output, "returncode": returncode, "exception_info": exception_info}
        lines = output.lstrip().splitlines(keepends=True)
        if lines and lines[0].strip() == SUBMIT_MARKER and returncode == 0:
            submission = "".join(lines[1:])
            raise Submitted({"role": "exit", "content": submission,
                             "extra": {"exit_status": "Submitted", "submission": submission}})
        return answer

    def get_template_vars(self, **kwargs: Any) -> dict[str, Any]:
        return {**self.config, **self.system_info, **kwargs}

    def serialize(self) -> dict:
        return {"info": {"config": {
            "environment": dict(self.config),
            "environment_type": f"{type(self).__module__}.{type(self).__name__}",
        }}}


class SandboxAgent(DefaultAgent):
    """``DefaultAgent`` that also stops before a model call once the episode is cancelled."""

    def __init__(self, *args: Any, stop: threading.Event, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.stop = stop

    def query(self) -> dict:
        if self.stop.is_set():
            raise Stopped({"role": "exit", "content": "Stopped",
                           "extra": {"exit_status": "Stopped", "submission": ""}})
        return super().query()


def task_text(task: Mapping[str, Any], messages: Sequence[Mapping[str, Any]]) -> str:
    """The problem for mini-swe-agent's ``{{task}}``: the swe-tools issue with where the project
    is, or (another env) the env's last user message. The env's system prompt is left out: it
    describes agentrl's tools (editor, run_tests, submit), which this agent does not have."""
    statement = task.get("problem_statement")
    if not statement:
        users = [m for m in messages if m.get("role") == "user"]
        if not users:
            raise ValueError("the task has no problem_statement and the env sent no user message")
        return str(users[-1]["content"])
    files = "\n".join(f"  {path}" for path in sorted(task.get("files", {})))
    listing = f" It has these files:\n{files}\n" if files else ""
    return (
        f"The project is in {WORKSPACE}, the working directory of every command.{listing}\n"
        "Fix the issue below in the source code with a small change. Do not change the tests: "
        "the fix is graded with the project's full test suite, including tests you cannot see."
        f"\n\n{statement}"
    )


async def sandbox_system_info(sandbox: Sandbox) -> dict[str, str]:
    """``uname`` fields of the sandbox (the config's templates describe the system)."""
    result = await sandbox.exec("uname -s; uname -r; uname -v; uname -m", timeout=30)
    values = result.stdout.splitlines() if result.ok else []
    keys = ("system", "release", "version", "machine")
    return {k: (values[i] if i < len(values) else "") for i, k in enumerate(keys)}


def build_agent(
    endpoint: Endpoint, sandbox: Sandbox, system_info: Mapping[str, str], stop: threading.Event
) -> SandboxAgent:
    """mini-swe-agent's default agent on ``endpoint``'s model and ``sandbox`` (see the module
    docstring)."""
    config = yaml.safe_load(CONFIG_FILE.read_text(encoding="utf-8"))
    model_config = config.get("model", {})
    model = LitellmModel(**{
        **model_config,  # observation and format-error templates, model_kwargs (drop_params)
        "model_name": f"openai/{endpoint.model}",
        "model_kwargs": {
            **model_config.get("model_kwargs", {}),
            "api_base": endpoint.base_url,
            "api_key": endpoint.api_key,
        },
        "cost_tracking": "ignore_errors",
    })
    environment = SandboxEnvironment(
        sandbox, endpoint.loop, stop,
        env=config.get("environment", {}).get("env", {}),
        system_info=system_info,
    )
    agent_config = config["agent"]
    return SandboxAgent(
        model, environment, stop=stop,
        system_template=agent_config["system_template"],
        instance_template=agent_config["instance_template"],
        step_limit=STEP_LIMIT,
        cost_limit=0.0,  # 0 turns the limit off
    )


def run_agent(agent: SandboxAgent, text: str) -> dict[str, Any]:
    """Runs ``agent`` to its end (in the worker thread); returns its exit information.

    mini-swe-agent ends a run itself on submission, on its step limit and after repeated format
    errors (``DefaultAgent.run`` turns those exceptions into an exit message and returns). A
    conversation grown past the model's context also ends the episode normally: the workspace
    is graded as it is. Anything else is a real failure and propagates.
    """
    try:
        return agent.run(text)
    except litellm.exceptions.ContextWindowExceededError as exc:
        return {"exit_status": "ContextWindowExceeded", "exception_str": str(exc)}


async def run(task: Mapping[str, Any], endpoint: Endpoint) -> None:
    """Plays one episode of ``task`` with mini-swe-agent; the env grades the workspace."""
    sandbox = endpoint.sandbox
    if sandbox is None:
        raise ValueError("mini-swe-agent needs an env with a sandbox (e.g. swe-tools)")
    stop = threading.Event()
    agent = build_agent(endpoint, sandbox, await sandbox_system_info(sandbox), stop)
    # A thread of its own rather than asyncio.to_thread: the loop's default executor is small
    # (cores + 4 threads) and the sandbox runs blocking steps in it (killing a timed-out
    # command, file I/O, starting sandboxes). Agents parked there, each waiting for such a
    # step, would deadlock once they filled it.
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="mini-swe-agent")
    try:
        info = await asyncio.get_running_loop().run_in_executor(
            pool, run_agent, agent, task_text(task, endpoint.messages)
        )
    except asyncio.CancelledError:
        # The thread cannot be killed; this makes it stop at its next command or model call.
        stop.set()
        raise
    finally:
        pool.shutdown(wait=False)
    log.info("mini-swe-agent ended: %s after %d model calls", info.get("exit_status"), agent.n_calls)
    return None
