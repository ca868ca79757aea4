"""Black-box agents: episodes played by code agentrl did not write, through the gateway.

``--agent-function-path file.py:run`` names ``async def run(task, endpoint)``; ``--agent-command
"CMD"`` names a program (a CLI agent). ``task`` (a command agent's stdin and task file) is the
task's public view (``ToolEnv.public_task``: the fields the env's ``TaskFields`` declares
public; ``{"prompt": ...}`` without an env): an agent never sees an answer, a fix or a hidden
test, whatever it does with its task. Either is called once per episode with its own gateway
session (:mod:`agentrl.gateway`): every model call the agent makes through the endpoint is
recorded token for token, and the session's samples are what the episode trains on
(``--gateway-segments``). Groups, ``--n-samples-per-prompt``, GRPO, dynamic sampling, eval sets
and checkpoints treat these episodes as any other.

What the agent returns is its score:

* a number: the reward;
* a dict: ``reward`` (required) and other numbers, kept in ``metadata["agent_metrics"]``;
* ``None``: graded like an env episode: ``--custom-rm-path`` if given, else the env's
  ``compute_reward`` on the episode's task, with the last generated reply as the final
  message (and the env's sandbox as the agent left it).

Episode outcomes: the agent returned (``completed``, finish ``agent``); it ran past
``--agent-timeout`` (``truncated``, finish ``agent_timeout``); it raised, exited non-zero, or
made no model call (``failed``, with the reason in ``metadata["error"]``).

A command agent runs sandboxed (:class:`~agentrl.sandbox.bwrap.BwrapSandbox`): your uid (so
that it can run this Python) with no capabilities, a fresh workspace at ``/workspace`` as its
working directory, a private ``/tmp``, ``/usr``, this Python
installation and the folders of the files its command names visible read-only, nothing else of
the host (not your home, not the current directory), and the host's network, since it must
reach the gateway on loopback; limits and reaping as for any sandbox. With
``--agent-on-host`` it runs on the host instead (:class:`~agentrl.sandbox.local.ProcessSandbox`:
the same limits and reaping, but as your user, in the current directory, seeing every file your
user can).
"""

from __future__ import annotations

import abc
import asyncio
import dataclasses
import inspect
import json
import logging
import os
import re
import shlex
import shutil
import sys
from collections.abc import Mapping
from typing import Any

from agentrl.chat import ChatRenderer
from agentrl.engine.base import Engine
from agentrl.env import ToolEnv, as_reward
from agentrl.errors import AgentRLError, PluginError
from agentrl.gateway.server import Gateway
from agentrl.plugins import load_plugin
from agentrl.records.sample import Sample, Status
from agentrl.rollout.config import RolloutConfig
from agentrl.rollout.episode import Episode, Policy, action_text
from agentrl.sandbox.base import WORKSPACE, Limits
from agentrl.sandbox.bwrap import BwrapSandbox
from agentrl.sandbox.local import ProcessSandbox
from agentrl.tools.calls import ToolCall

__all__ = ["AgentEndpoint", "AgentError", "AgentPlayer", "BlackBoxAgent", "CommandAgent",
           "CommandLimits", "FunctionAgent", "load_agent", "play_agent_episode"]

log = logging.getLogger(__name__)

_FUNCTION_FLAG = "--agent-function-path"
_COMMAND_FLAG = "--agent-command"


class AgentError(AgentRLError):
    """A black-box agent failed its episode (raised, exited non-zero, or never called the model)."""


@dataclasses.dataclass
class AgentEndpoint:
    """What an agent gets for one episode.

    Attributes:
        base_url: The session's OpenAI base URL (``.../s/<key>/v1``): pass it as the client's
            ``base_url``.
        api_key: The session's key (also accepted as ``Authorization: Bearer <key>`` on the
            gateway's plain ``/v1`` URL).
        model: The model name to ask for.
        sandbox: The episode's sandbox when the env has one (``agentrl.sandbox.Sandbox``): run
            commands there, not on the host. ``None`` otherwise.
        messages: The env's first observation (system and user messages) for the task.
        tools: The env's tool schemas (OpenAI form), to offer the model.
        loop: The event loop the episode runs on (sandbox and tool coroutines belong to it).
    """

    base_url: str
    api_key: str
    model: str
    sandbox: Any
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]]
    loop: asyncio.AbstractEventLoop
    env: ToolEnv | None = dataclasses.field(default=None, repr=False)

    async def call_tool(self, name: str, arguments: Mapping[str, Any]) -> str:
        """Runs one of the env's tools in this episode (its state and sandbox), as the env would
        run the model's call: ``await endpoint.call_tool("calculator", {"expression": "2+3"})``.
        A coroutine: await it on the episode's loop (:attr:`loop`; from a thread, use
        ``asyncio.run_coroutine_threadsafe(..., endpoint.loop)``).

        Returns:
            The tool's result as the text a ``role: tool`` message would carry; a failed call
            (unknown tool, arguments that break its schema, a timeout, an exception in the tool)
            comes back as ``Error (<kind>): ...`` text, never raised. The call is not a turn of
            the episode: the episode's tool calls (``rollout/tool_calls``) are the calls in the
            model's replies that the gateway returned to the agent.

        Raises:
            AgentError: The env has no tools (no ``--env``).
        """
        if self.env is None:
            raise AgentError("call_tool: this episode has no env (pass --env)")

        outcome = await self.env.arun_tool(ToolCall(name, dict(arguments)))
        return str(outcome.to_message()["content"])


class BlackBoxAgent(abc.ABC):
    """An agent run once per episode against an :class:`AgentEndpoint`."""

    name: str
    grace_s: float = 0.0
    """Seconds past ``--agent-timeout`` before the episode stops waiting (an agent that enforces
    the timeout itself gets time to stop its processes)."""

    @abc.abstractmethod
    async def run(self, task: Mapping[str, Any], endpoint: AgentEndpoint) -> Any:
        """Plays the episode; returns its score (see the module docstring) or ``None``.

        Raises:
            AgentError: The agent failed (the sample fails with the reason).
        """


class FunctionAgent(BlackBoxAgent):
    """``async def run(task, endpoint)`` from ``--agent-function-path``.

    Raises:
        PluginError: The plug-in cannot be loaded or is not such a coroutine function.
    """

    def __init__(self, spec: str) -> None:
        fn = load_plugin(spec, flag=_FUNCTION_FLAG, default_name="run")
        if not inspect.iscoroutinefunction(fn):
            raise PluginError(f"{_FUNCTION_FLAG} {spec!r}: {getattr(fn, '__name__', fn)!r} must be "
                              "`async def run(task, endpoint)`")
        if len(inspect.signature(fn).parameters) < 2:
            raise PluginError(f"{_FUNCTION_FLAG} {spec!r}: it must take (task, endpoint)")
        self.fn = fn
        self.name = spec

    async def run(self, task: Mapping[str, Any], endpoint: AgentEndpoint) -> Any:
        return await self.fn(task, endpoint)


@dataclasses.dataclass(frozen=True)
class CommandLimits:
    """Limits of a command agent's processes (those of a sandbox, sized for an agent)."""

    memory_mb: int = 4096
    pids: int = 256
    output_bytes: int = 256 * 1024


class CommandAgent(BlackBoxAgent):
    """A program run per episode (``--agent-command``), unmodified.

    It gets ``OPENAI_BASE_URL``, ``OPENAI_API_KEY``, ``OPENAI_MODEL`` (and ``OPENAI_API_BASE``,
    which litellm reads), the task's public view as JSON on stdin and in the file
    ``$AGENTRL_TASK_FILE``, and the run's ``PATH`` with this Python first. By default it runs
    sandboxed (see the module: its own workspace as working directory; a relative path in the
    command to a file of the current directory is rewritten to the file, made visible
    read-only); ``on_host`` runs it in the current directory as the current user. Either way
    :class:`CommandLimits` and ``timeout_s`` hold, and when it ends (or times out) its process
    group and every process holding its output are killed. Exit status 0 is success; its
    score comes from the env (or ``--custom-rm-path``), or from a last stdout line
    ``{"reward": ...}`` when it prints one.

    Raises:
        AgentError: Sandboxed, but bubblewrap is not installed (the message names
            ``--agent-on-host``). A file of the current directory named in the command is a
            warning: the sandbox does not show it.
    """

    grace_s = 15.0

    def __init__(self, command: str, timeout_s: float, limits: CommandLimits | None = None, *,
                 on_host: bool = False) -> None:
        self.command = command
        self.name = command
        self.timeout_s = timeout_s
        self.limits = limits or CommandLimits()
        self.on_host = on_host
        # what the sandbox runs and shows, worked out once (the current directory is the run's)
        self._sandboxed: tuple[str, list[str]] = (command, [])
        if on_host:
            return
        if shutil.which("bwrap") is None:
            raise AgentError(f"{_COMMAND_FLAG} runs the agent in a bubblewrap sandbox, and `bwrap` "
                             "is not installed: `apt-get install bubblewrap` (scripts/setup-system.sh "
                             "does), or pass --agent-on-host to run it as your user in the current "
                             "directory, where it can read every file you can")
        run, binds, hidden = sandboxed_command(command, os.getcwd())
        self._sandboxed = (run, [*python_dirs(), *binds])
        for word in hidden:
            log.warning("%s names %s, a file in the current directory, which the sandboxed agent "
                        "does not see (it would see the whole directory): put the agent in a folder "
                        "of its own (e.g. agents/), install it, or pass --agent-on-host",
                        _COMMAND_FLAG, word)

    async def run(self, task: Mapping[str, Any], endpoint: AgentEndpoint) -> Any:
        limits = Limits(timeout_s=self.timeout_s, memory_mb=self.limits.memory_mb,
                        cpu_s=int(self.timeout_s) + 1, pids=self.limits.pids,
                        output_bytes=self.limits.output_bytes, file_size_mb=1024,
                        workspace_mb=1024)
        payload = json.dumps(dict(task), ensure_ascii=False, default=str)
        path = os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")])
        env = {"OPENAI_BASE_URL": endpoint.base_url, "OPENAI_API_BASE": endpoint.base_url,
               "OPENAI_API_KEY": endpoint.api_key, "OPENAI_MODEL": endpoint.model, "PATH": path}
        if self.on_host:
            box: ProcessSandbox | BwrapSandbox = ProcessSandbox(limits, tag="agent-", own_uid=False)
            command, cwd = self.command, os.getcwd()
        else:
            command, binds = self._sandboxed
            # the caller's uid: this Python may live under a home only its owner can enter
            box = BwrapSandbox(limits, tag="agent-", ro_binds=binds, network=True, own_uid=False)
            cwd = WORKSPACE
        async with box:
            await box.write_file("task.json", payload)
            assert box.workspace is not None
            env["AGENTRL_TASK_FILE"] = os.path.join(box.workspace if self.on_host else WORKSPACE,
                                                    "task.json")
            result = await box.exec(command, stdin=payload, env=env, cwd=cwd, timeout=self.timeout_s)
        if result.timed_out:
            raise TimeoutError(f"{_COMMAND_FLAG}: still running after {self.timeout_s:.0f} s "
                               "(--agent-timeout); its processes were killed")
        if not result.ok:
            why = result.limit_hit and f"its {result.limit_hit} limit was hit" or f"exit code {result.exit_code}"
            raise AgentError(f"{_COMMAND_FLAG} {self.command!r} failed ({why}); stderr: "
                             f"{result.stderr.strip()[-800:]}")
        lines = result.stdout.strip().splitlines()
        if lines:
            try:
                last = json.loads(lines[-1])
            except ValueError:
                return None
            if isinstance(last, dict) and "reward" in last:
                return last
        return None


def python_dirs() -> list[str]:
    """The folders this Python runs from (the virtual environment, the installation it was
    made from), which a sandboxed command agent sees read-only to run Python programs."""
    dirs = {os.path.realpath(sys.prefix), os.path.realpath(sys.base_prefix),
            os.path.dirname(os.path.dirname(os.path.realpath(sys.executable)))}
    return sorted(d for d in dirs if os.path.isdir(d) and d != "/")


_INTERPRETERS = re.compile(r"(python[0-9.]*|bash|sh|node|perl|ruby)")
"""Programs whose next word is the file they run (``python agents/agent.py``)."""


def sandboxed_command(command: str, cwd: str) -> tuple[str, list[str], list[str]]:
    """``command`` made to run in a sandbox whose working directory is its own workspace.

    The files the command runs (the first word of each command in it, or the first word after
    an interpreter and its options: ``python -u agents/agent.py``) become visible read-only, their folders bound,
    and a relative one is rewritten to the absolute path. Other words stay as they are. A
    program directly in ``cwd`` (or in one of its parents) stays hidden: showing its folder
    would show the whole current directory.

    Returns:
        The command to run, the folders to bind read-only, and the words naming hidden files.
    """
    words = shlex.shlex(command, posix=True, punctuation_chars=True)
    words.whitespace_split = True
    binds: list[str] = []
    hidden: list[str] = []
    try:
        tokens = list(words)
    except ValueError:  # unbalanced quotes: sh will say so
        return command, binds, hidden
    here = os.path.realpath(cwd)
    programs, after_interpreter = [], False
    for i, token in enumerate(tokens):
        starts = i == 0 or set(tokens[i - 1]) <= set("|&;()")
        if starts or (after_interpreter and not token.startswith("-")):
            programs.append(token)
        # an interpreter's options come before its file: python3 -u agents/agent.py
        after_interpreter = (bool(_INTERPRETERS.fullmatch(os.path.basename(token)))
                             or (after_interpreter and token.startswith("-")))
    for token in dict.fromkeys(programs):
        target = os.path.realpath(os.path.join(cwd, token))
        if not os.path.isfile(target):
            continue
        folder = os.path.dirname(target)
        if here == folder or here.startswith(folder.rstrip("/") + "/"):
            hidden.append(token)
            continue
        if folder not in binds:
            binds.append(folder)
        if not os.path.isabs(token):
            command = re.sub(rf"(?<![\w./-]){re.escape(token)}(?![\w./-])", target, command)
    return command, binds, hidden


def load_agent(function_path: str | None, command: str | None, timeout_s: float, *,
               on_host: bool = False) -> BlackBoxAgent | None:
    """The run's black-box agent (``None`` when neither flag is given); ``on_host``:
    ``--agent-on-host``."""
    if function_path:
        return FunctionAgent(function_path)
    if command:
        return CommandAgent(command, timeout_s, on_host=on_host)
    return None


def _score(value: Any, sample: Sample, agent: BlackBoxAgent) -> float | None:
    """The agent's return value as a reward (``None``: grade it); extra metrics are kept."""
    if value is None:
        return None
    if isinstance(value, Mapping):
        if "reward" not in value:
            raise PluginError(f"agent {agent.name}: a returned dict needs a 'reward' key, got "
                              f"{sorted(value)}")
        extra = {k: v for k, v in value.items() if k != "reward"}
        if extra:
            sample.metadata["agent_metrics"] = extra
        value = value["reward"]
    return as_reward(value, f"agent {agent.name}")


async def play_agent_episode(agent: BlackBoxAgent, episode: Any, gateway: Any, *,
                             sampling: Any, segments: str, timeout_s: float, evaluation: bool,
                             custom_rm: bool, model: Policy | None = None) -> list[Sample]:
    """Plays ``episode`` (an :class:`~agentrl.rollout.episode.Episode`, not started) with
    ``agent`` through a new session of ``gateway``.

    The env is reset with the sample's task first (its sandbox is the agent's). The sample
    becomes the session's trained segment; with ``segments="all"`` the earlier segments come
    back too, as more samples of the group. Failures of the agent fail the sample; they never
    raise. ``model``, when given, is a scripted policy (the env's oracle) that answers the
    agent's requests instead of the engine: ``model(env, task, messages)``.

    Returns:
        The episode's samples: ``episode.sample`` first.
    """
    sample = episode.sample
    try:
        await episode.start()
    except Exception as exc:  # noqa: BLE001 - an env that cannot reset fails its sample
        episode.fail(exc)
        await episode.close()
        return [sample]
    if episode.done:  # the prompt does not fit the context (skipped)
        await episode.close()
        return [sample]
    env = episode.env
    respond = None
    if model is not None and env is not None and env.state is not None:
        task_row = env.state.task

        def respond(messages: list[dict[str, Any]]) -> str:
            return action_text(env, model(env, task_row, messages))
    session = gateway.open_session(episode.rid, sampling=sampling, client_sampling=evaluation,
                                   stopping=episode.ctx.stopping, respond=respond)
    # the agent is the side being graded: it gets the task's public view, never the row
    task = env.public_task(env.state.task) if env is not None and env.state is not None else {
        "prompt": sample.prompt}
    endpoint = AgentEndpoint(gateway.base_url(session), session.key, gateway.model,
                             getattr(env, "sandbox", None), [dict(m) for m in episode.history],
                             list(episode.tools or []), asyncio.get_running_loop(), env)
    outcome: tuple[Status, str] = (Status.COMPLETED, "agent")
    value: Any = None
    try:
        value = await asyncio.wait_for(agent.run(task, endpoint), timeout_s + agent.grace_s)
    except TimeoutError as exc:
        outcome = (Status.TRUNCATED, "agent_timeout")
        sample.metadata["error"] = str(exc) or f"the agent ran past --agent-timeout {timeout_s:g} s"
    except Exception as exc:  # noqa: BLE001 - the agent's own failure fails its sample
        outcome = (Status.FAILED, "error")
        episode.fail(exc)
    finally:
        await gateway.close_session(session)
    if session.stopped:  # the rollout had enough groups: unfinished, played afresh if resumed
        for key in ("error", "traceback"):
            sample.metadata.pop(key, None)
        sample.status, sample.reward = Status.ABORTED, None
        sample.metadata["finish"] = "abort"
        await episode.close()
        return [sample]
    out = session.samples(sample, segments)
    if not out and outcome[0] is not Status.FAILED:
        late = f" before it ran past --agent-timeout {timeout_s:g} s" if outcome[0] is Status.TRUNCATED else ""
        outcome = (Status.FAILED, "error")
        episode.fail(AgentError(f"agent {agent.name} made no model call through its endpoint "
                                f"({endpoint.base_url}){late}"))
    try:
        if out:
            _adopt(sample, out[-1])
        if outcome[0] is not Status.FAILED:
            episode.finish(*outcome)
            # the whole conversation, in training as in evaluation (the viewer shows the replies)
            sample.metadata["messages"] = session.last_messages
            own = sample.metadata.get("segment")
            sample.metadata["turns"] = (session.segments[own].calls if own is not None
                                        else len(session.calls))
            completion = sum(len(c["output_ids"]) for call in session.calls for c in call.choices)
            prompt = sum(len(call.prompt_ids) for call in session.calls)
            sample.metadata["usage"] = {"prompt_tokens": prompt, "completion_tokens": completion,
                                        "total_tokens": prompt + completion}
            reward = _score(value, sample, agent) if outcome[0] is Status.COMPLETED else 0.0
            if reward is None and not custom_rm and env is not None and env.state is not None:
                final = {"role": "assistant", "content": session.last_assistant_text}
                reward = await episode.grade(final)
            sample.reward = reward
    except Exception as exc:  # noqa: BLE001 - a crashing grader fails the sample, not the batch
        episode.fail(exc)
    finally:
        await episode.close()
    extra = []
    for i, segment in enumerate(out[:-1]):
        segment.status, segment.reward = sample.status, sample.reward
        segment.metadata = {**segment.metadata, "finish": sample.metadata.get("finish"),
                            "turns": session.segments[segment.metadata["segment"]].calls}
        segment.index = sample.index + 10_000 * (i + 1)  # distinct from the group's own samples
        extra.append(segment)
    return [sample, *extra]


def _adopt(sample: Sample, made: Sample) -> None:
    """Gives ``sample`` the tokens, mask, log-probs and turns of a session's sample."""
    sample.tokens, sample.response_length = made.tokens, made.response_length
    sample.loss_mask, sample.rollout_log_probs = made.loss_mask, made.rollout_log_probs
    sample.turns, sample.weight_version = made.turns, made.weight_version
    sample.token_versions = made.token_versions
    for key in ("segments", "segment", "gateway_calls", "gateway"):
        sample.metadata[key] = made.metadata[key]


class AgentPlayer:
    """The run's black-box agent and the gateway its episodes go through (started on first
    use, on the rollout's event loop; :meth:`aclose` stops it).

    Args:
        agent: The agent.
        config: The run's rollout config (``--gateway-segments``, ``--agent-timeout``,
            ``--custom-rm-path``, ``--rollout-seed``).
        engine: The policy engine.
        renderer: Its chat renderer.
        max_context_len: Tokens per sample.
        model: A scripted policy that answers the agent instead of the engine (``agentrl eval
            --agent ... --policy oracle``: the env's oracle plays the model, to try an agent's
            tool loop on tasks it can solve); ``None``: the engine's model answers.
    """

    def __init__(self, agent: BlackBoxAgent, config: RolloutConfig, engine: Engine,
                 renderer: ChatRenderer, max_context_len: int, model: Policy | None = None) -> None:
        self.agent = agent
        self.model = model
        self.config = config
        self.engine = engine
        self.renderer = renderer
        self.max_context_len = max_context_len
        self.gateway: Gateway | None = None
        self._starting = asyncio.Lock()

    @property
    def name(self) -> str:
        return self.agent.name

    async def play(self, episode: Episode, *, evaluation: bool) -> list[Sample]:
        """Plays ``episode`` with the agent (see :func:`play_agent_episode`)."""
        async with self._starting:
            if self.gateway is None:
                gateway = Gateway(self.engine, self.renderer, episode.ctx.sampling,
                                  self.max_context_len, seed=self.config.rollout_seed)
                await gateway.start()
                self.gateway = gateway
        config = self.config
        return await play_agent_episode(
            self.agent, episode, self.gateway, sampling=episode.ctx.sampling,
            segments=config.gateway_segments, timeout_s=config.agent_timeout,
            evaluation=evaluation, custom_rm=config.custom_rm_path is not None, model=self.model)

    async def aclose(self) -> None:
        """Stops the gateway (every open session is closed)."""
        gateway, self.gateway = self.gateway, None
        if gateway is not None:
            await gateway.stop()
