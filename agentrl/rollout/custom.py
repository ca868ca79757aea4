"""Custom generate functions (``--custom-generate-function-path``) and their helpers.

slime's multi-turn loop runs as written once the helpers are imported, with
``from agentrl.rollout.custom import compute_reward, execute_tool, extract_tool_call,
generate_single`` (``examples/custom_generate.py`` is that loop, verbatim).

The tokens stay exact although the loop only handles text: ``generate_single(conversation)``
finds the sample whose ``prompt`` *is* ``conversation`` (the same list object; pass
``sample=`` otherwise), appends the engine's sampled ids to it (loss mask 1, with log-probs),
and, on the next call, appends the messages the loop added since as the chat-template delta
(loss mask 0). The assistant message the loop appends is matched to the ids already sampled,
never re-tokenized.

Each call of ``custom_generate`` runs in a worker thread with its own event loop, so the sync
helpers (``execute_tool``, ``compute_reward``, as slime's loop calls them) block only that call,
never the rollout. Each sample is an :class:`~agentrl.rollout.episode.Episode` that the loop
drives step by step; with ``--env`` its env gives the tools and the reward: reset with the
sample's task before the call (its first observation becomes ``sample.prompt``, the
conversation the loop grows) and closed when the call returns.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import dataclasses
import inspect
import logging
import threading
import time
from collections.abc import Coroutine, Mapping, Sequence
from typing import Any, TypeVar

from agentrl.engine.base import SamplingParams
from agentrl.errors import PluginError, ToolCallParseError
from agentrl.plugins import load_plugin
from agentrl.records.sample import Sample, Status
from agentrl.rollout.episode import EngineTurns, Episode, RolloutContext
from agentrl.tools.calls import ToolCall

__all__ = [
    "acompute_reward",
    "aexecute_tool",
    "compute_reward",
    "execute_tool",
    "extract_tool_call",
    "generate_single",
    "load_custom_generate",
    "run_custom_generate",
]

T = TypeVar("T")
_FLAG = "--custom-generate-function-path"

log = logging.getLogger(__name__)


@dataclasses.dataclass
class _SampleState:
    """One sample's :class:`Episode`, driven by the user's loop, and what the loop did to its
    conversation since the last generated turn."""

    episode: Episode
    conversation: list[dict[str, Any]]
    messages_seen: int = 0
    pending_response: str | None = None
    last_finish: str | None = None

    @property
    def sample(self) -> Sample:
        return self.episode.sample


@dataclasses.dataclass
class _Call:
    """One running ``custom_generate(args, samples)`` call."""

    ctx: RolloutContext
    loop: asyncio.AbstractEventLoop  # the rollout's loop: engine and envs live there
    states: dict[int, _SampleState]
    rid: str
    evaluation: bool
    last: _SampleState | None = None


_CURRENT: contextvars.ContextVar[_Call | None] = contextvars.ContextVar("agentrl_custom", default=None)


def _call() -> _Call:
    call = _CURRENT.get()
    if call is None:
        raise RuntimeError("agentrl's generate helpers work inside a custom generate function "
                           "run by the rollout (--custom-generate-function-path)")
    return call


def _state(call: _Call, conversation: Any, sample: Sample | None) -> _SampleState:
    if sample is not None:
        for state in call.states.values():
            if state.sample is sample:
                return state
        raise ValueError("sample= is not one of the samples given to this custom generate call")
    state = call.states.get(id(conversation))
    if state is None:
        raise ValueError("generate_single: this conversation is not a sample's prompt list; "
                         "pass sample=... (e.g. generate_single(messages, sample=sample))")
    return state


async def _on_rollout_loop(call: _Call, coroutine: Coroutine[Any, Any, T]) -> T:
    return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coroutine, call.loop))


def _blocking(call: _Call, coroutine: Coroutine[Any, Any, T]) -> T:
    try:
        running = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    if running is call.loop:  # waiting here would deadlock the loop that must run it
        coroutine.close()
        raise RuntimeError("sync helpers cannot run on the rollout's own event loop; "
                           "use the async form (aexecute_tool / acompute_reward)")
    return asyncio.run_coroutine_threadsafe(coroutine, call.loop).result()


async def generate_single(
    conversation: list[dict[str, Any]], sample: Sample | None = None,
    sampling_params: SamplingParams | Mapping[str, Any] | None = None,
) -> str:
    """Generates the next assistant turn of ``conversation`` and returns its text.

    Messages appended to ``conversation`` since the last call (the assistant message holding the
    last response, then tool or user messages) are added to the sample's tokens as the chat
    template's delta; the engine's ids are appended as they were sampled.

    Args:
        conversation: The sample's ``prompt`` list, grown by the loop.
        sample: The sample, when ``conversation`` is not its ``prompt`` object.
        sampling_params: Overrides of the run's sampling parameters (SGLang names).

    Returns:
        The response text (special tokens dropped), ``""`` when the context is full or the
        request was aborted (the sample's status says which).
    """
    call = _call()
    state = _state(call, conversation, sample)
    episode = state.episode
    new = list(conversation[state.messages_seen :])
    if state.pending_response is not None:
        if not new or new[0].get("role") != "assistant":
            raise ValueError("generate_single: append the assistant message holding the last "
                             "response to the conversation before generating again")
        history = [*conversation[: state.messages_seen], new[0]]
        env_messages = new[1:]
        if env_messages:
            appended = episode.append_env(history, env_messages)
            if appended is None:
                return ""
            for i, message in enumerate(appended):  # what the model saw, if tool output was cut
                conversation[state.messages_seen + 1 + i] = message
        state.messages_seen = len(conversation)
        state.pending_response = None
    elif new:
        raise ValueError("generate_single: messages were added before the first response; put "
                         "them in the prompt")
    call.last = state
    if episode.done:
        return ""
    turns = episode.source
    if sampling_params is not None:
        overrides = sampling_params if isinstance(sampling_params, Mapping) else dataclasses.asdict(sampling_params)
        assert call.ctx.engine is not None
        turns = EngineTurns(call.ctx.engine, call.ctx.sampling.replace(**overrides),
                            call.ctx.config.rollout_seed)
    out = await _on_rollout_loop(call, episode.next_turn(turns))
    if out is None:
        return ""
    state.last_finish = out.finish_reason
    state.pending_response = episode.last_text
    return episode.last_text


def extract_tool_call(response: str) -> dict[str, Any] | None:
    """The first tool call in ``response`` as ``{"name", "arguments"}``, or ``None``.

    Uses the run's ``--tool-call-format``. Malformed call markup yields a call to the
    pseudo-tool ``(unparsed)`` so that :func:`execute_tool` reports the parse error to the model.
    """
    call = _call()
    fmt = call.ctx.renderer.tool_call_format
    try:
        parsed = fmt.parse(response)
    except ToolCallParseError as exc:
        return {"name": "(unparsed)", "arguments": {}, "error": str(exc)}
    if not parsed.tool_calls:
        return None
    first = parsed.tool_calls[0]
    return {"name": first.name, "arguments": dict(first.arguments)}


async def aexecute_tool(tool_call: Mapping[str, Any], sample: Sample | None = None) -> str:
    """Runs one tool call with the env's tools (validated, timed out, errors as text).

    Returns:
        The tool's result text, or ``Error (<kind>): ...`` for any failure the model caused.
    """
    call = _call()
    state = _only_state(call, sample)
    return await _on_rollout_loop(call, _run_tool(call, state, tool_call))


def execute_tool(tool_call: Mapping[str, Any], sample: Sample | None = None) -> str:
    """Sync form of :func:`aexecute_tool` (as slime's loop calls it)."""
    call = _call()
    return _blocking(call, _run_tool(call, _only_state(call, sample), tool_call))


async def _run_tool(call: _Call, state: _SampleState, tool_call: Mapping[str, Any]) -> str:
    if tool_call.get("name") == "(unparsed)":
        return f"Error (parse_error): {tool_call.get('error', 'the tool call could not be parsed')}"
    env = state.episode.env
    if env is None:
        raise PluginError(f"{_FLAG}: execute_tool needs tools: pass --env ID (its tools run)")
    started = time.perf_counter()
    name, arguments = str(tool_call.get("name")), tool_call.get("arguments") or {}
    outcome = await env.arun_tool(ToolCall(name, dict(arguments)))
    if state.sample.turns:
        state.sample.turns[-1].tools_s += time.perf_counter() - started
        state.sample.turns[-1].tool_names.append(outcome.call.name)
    if outcome.error is not None:
        errors = state.sample.metadata.setdefault("tool_errors", {})
        errors[outcome.error.value] = errors.get(outcome.error.value, 0) + 1
    return str(outcome.to_message()["content"])


async def acompute_reward(sample: Sample) -> float:
    """The sample's reward: ``--custom-rm-path`` if given, else the env's score of the last
    response (0.0 when the episode did not end with an answer)."""
    call = _call()
    return await _on_rollout_loop(call, _reward(call, sample))


def compute_reward(sample: Sample) -> float:
    """Sync form of :func:`acompute_reward` (as slime's loop calls it)."""
    call = _call()
    return _blocking(call, _reward(call, sample))


async def _reward(call: _Call, sample: Sample) -> float:
    state = _only_state(call, sample)
    _finalize(state)
    if sample.metadata.get("custom_rm_path") or call.ctx.config.custom_rm_path:
        assert call.ctx.rewards is not None
        await call.ctx.rewards.apply([sample])
        return sample.reward if sample.reward is not None else 0.0
    env = state.episode.env
    if env is None or env.state is None:
        raise PluginError(f"{_FLAG}: compute_reward needs --env or --custom-rm-path")
    if sample.status is not Status.COMPLETED:
        return 0.0
    final = {"role": "assistant", "content": state.pending_response or ""}
    started = time.perf_counter()
    reward = await state.episode.grade(final)
    if sample.turns:
        sample.turns[-1].reward_s += time.perf_counter() - started
    return reward


def _only_state(call: _Call, sample: Sample | None) -> _SampleState:
    """The state of ``sample``; without it, of the sample ``generate_single`` ran for last."""
    if sample is not None:
        return _state(call, None, sample)
    if call.last is None:
        raise ValueError("call generate_single before execute_tool, or pass sample=...")
    return call.last


def _finalize(state: _SampleState) -> None:
    """Ends the episode from what the loop did, unless it already ended (context, abort)."""
    episode = state.episode
    if episode.done or episode.sample.status is Status.ABORTED:
        return
    if state.last_finish == "length":
        episode.finish(Status.TRUNCATED, "length")
    elif len(state.conversation) > state.messages_seen + 1:
        # the loop ran out of turns: tool results after the last response, never answered
        episode.finish(Status.TRUNCATED, "max_turns")
    else:
        episode.finish(Status.COMPLETED, "stop")


def load_custom_generate(spec: str) -> Any:
    """Loads and checks ``async def custom_generate(args, samples, evaluation=False)``."""
    fn = load_plugin(spec, flag=_FLAG, default_name="custom_generate")
    if not inspect.iscoroutinefunction(fn):
        raise PluginError(f"{_FLAG} {spec!r}: {getattr(fn, '__name__', fn)!r} must be "
                          "`async def custom_generate(args, samples, evaluation=False)`")
    params = list(inspect.signature(fn).parameters)
    if len(params) < 2:
        raise PluginError(f"{_FLAG} {spec!r}: it must take (args, samples, evaluation=False); "
                          f"it takes {params}")
    return fn


async def run_custom_generate(
    fn: Any, ctx: RolloutContext, samples: Sequence[Sample], rid: str, *,
    evaluation: bool = False,
) -> list[Sample]:
    """Runs ``fn(args, samples, evaluation)`` in a worker thread with its own event loop.

    Starts each sample's :class:`Episode` first (env reset with its task, the prompt as chat
    messages in ``sample.prompt``, prompt token ids), then ends it (status, response text,
    custom reward when the function set none). A crash of the function fails all its samples
    with the reason.
    """
    loop = asyncio.get_running_loop()
    states: dict[int, _SampleState] = {}
    for sample in samples:
        sample.status, sample.reward = Status.PENDING, None
        episode = Episode(ctx, sample, f"{rid}-s{sample.index}")
        try:
            await episode.start()
        except Exception as exc:  # noqa: BLE001 - an env that cannot reset fails its sample
            episode.fail(exc)
            await episode.close()
            continue
        sample.prompt = episode.history  # the loop's conversation: the list it grows
        states[id(episode.history)] = _SampleState(episode, episode.history,
                                                   messages_seen=len(episode.history))
    call = _Call(ctx, loop, states, rid, evaluation)

    def worker() -> list[Sample]:
        context = contextvars.copy_context()
        context.run(_CURRENT.set, call)
        return context.run(asyncio.run, _invoke(fn, ctx.args, list(samples), evaluation))

    try:
        result = await _in_daemon_thread(worker, name=f"custom-generate-{rid}")
        if not isinstance(result, list) or any(not isinstance(s, Sample) for s in result):
            raise PluginError(f"{_FLAG}: custom_generate must return the list of samples")
    except Exception as exc:  # noqa: BLE001 - a crashing user function fails its samples
        log.warning("%s %s raised %s: %s; its %d samples (group %s) fail", _FLAG,
                    getattr(fn, "__qualname__", fn), type(exc).__name__, exc, len(states),
                    samples[0].group_id if samples else "-")
        for state in states.values():
            state.episode.fail(PluginError(f"custom_generate: {type(exc).__name__}: {exc}"),
                               report=False)
        result = list(samples)
    finally:
        for state in states.values():
            await state.episode.close()
    for state in states.values():
        if state.sample.status is not Status.FAILED:
            _finalize(state)
    unscored = [s for s in result if s.reward is None and s.status is not Status.FAILED]
    assert ctx.rewards is not None
    await ctx.rewards.apply(unscored)
    for sample in result:
        if sample.reward is None:
            sample.reward = 0.0
    return result


async def _in_daemon_thread(worker: Any, *, name: str) -> Any:
    """Runs ``worker()`` in a daemon thread and awaits its result.

    A daemon thread, unlike an executor's, does not hold the interpreter's exit: a plug-in that
    ignores the run's stop must not keep the process alive after the clean stop.
    """
    done: concurrent.futures.Future[Any] = concurrent.futures.Future()

    def target() -> None:
        if not done.set_running_or_notify_cancel():
            return
        try:
            done.set_result(worker())
        except BaseException as exc:  # noqa: BLE001 - handed to the awaiting coroutine
            done.set_exception(exc)

    threading.Thread(target=target, name=name, daemon=True).start()
    return await asyncio.wrap_future(done)


async def _invoke(fn: Any, args: Any, samples: list[Sample], evaluation: bool) -> Any:
    return await fn(args, samples, evaluation=evaluation)
