"""One agent episode behind the gateway: its calls, captured token for token.

A :class:`Session` turns an agent's stream of chat requests into training samples without ever
re-tokenizing what the model sampled. It keeps every *state* the conversation reached: the
prompt of each call and each choice the engine generated, each with the exact token sequence up
to it. A new request is matched against them by its messages (role, text, tool calls; see
:func:`~agentrl.gateway.protocol.message_key`) and tools:

* it **extends** a choice of a segment's latest call (its messages start with that choice's
  prompt and reply, unchanged, and add messages after it; the usual case): the sample grows by
  the chat template's delta for the new messages (loss mask 0) and then by the newly sampled ids
  (loss mask 1, with their log-probs);
* it **repeats** the prompt of a segment's latest call exactly (a retry, another draw): it is
  sampled again from that prompt's tokens;
* otherwise the agent **rewrote its history** (truncated or summarized it, edited, removed or
  inserted a message anywhere, changed the system prompt or the tools): a new *segment* starts
  from the request rendered afresh, and the session records why (``history rewritten at
  messages[3]``, ``tools changed``, ...). This holds wherever the change is: a request that
  keeps reply 1 but changes anything after it does not extend reply 1, since that would turn the
  agent's copy of reply 2 into untrained template text and lose reply 2's sampled tokens.

Each segment ends in one sequence of tokens: the choice generated last in it (choice 0 of a
call that asked for several). :meth:`Session.samples` gives the segments as samples; which of
them to train on is the caller's choice (``--gateway-segments``: ``last``, the segment that
ended the episode, or ``all``). Every trained token is a token the engine sampled, with the
log-probability it was sampled with. Every reply the engine generated is either in a trained
sample or counted as dropped (:meth:`Session.stats`: a reply of a segment not trained under
``last``, a choice other than the one continued, a draw that a retry replaced).

Requests of one session are served one at a time (in arrival order), so that each sees the
states of those before it.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import json
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

from agentrl.chat import ChatRenderer
from agentrl.engine.base import Engine, GenerateOutput, SamplingParams
from agentrl.errors import ToolCallParseError
from agentrl.gateway.protocol import (
    APIError,
    ChatRequest,
    Choice,
    CompletionRequest,
    assistant_message,
    message_key,
    template_messages,
)
from agentrl.records.sample import Sample
from agentrl.records.trajectory import Trajectory, request_seed

__all__ = ["CallRecord", "Segment", "Session", "SessionClosed"]

T = TypeVar("T")

SEGMENT_MODES = ("last", "all")
"""The choices of ``--gateway-segments``."""

ABORT_RETRIES = 8
"""Times one choice is resumed after the engine aborted it (a weight update) before failing."""


class SessionClosed(Exception):
    """The session ended (its episode finished or was stopped) while a request was in flight."""


@dataclasses.dataclass
class CallRecord:
    """What one request did, exactly.

    Attributes:
        index: Its position in the session.
        segment: The segment it belongs to.
        how: ``start`` (a new segment), ``extends`` (a previous choice) or ``repeats`` (a
            previous prompt).
        prompt_ids: The token ids the engine was given.
        choices: Per choice: ``output_ids``, ``output_logprobs``, ``finish_reason`` and
            ``weight_version``.
        latency_s: Seconds the engine took for all choices.
    """

    index: int
    segment: int
    how: str
    prompt_ids: list[int]
    choices: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    latency_s: float = 0.0


@dataclasses.dataclass
class Segment:
    """A stretch of the session that is one token sequence.

    Attributes:
        index: Its position.
        reason: Why it started (``start`` for the first one).
        calls: Requests served in it.
        final: The state of its last generated choice (``None`` until one exists).
    """

    index: int
    reason: str
    calls: int = 0
    final: _State | None = None

    def info(self, trained: bool) -> dict[str, Any]:
        sample = self.final.sample if self.final is not None else None
        return {"index": self.index, "reason": self.reason, "calls": self.calls,
                "tokens": len(sample.tokens) if sample else 0,
                "response_tokens": sample.response_length if sample else 0, "trained": trained}


@dataclasses.dataclass
class _State:
    """A point the conversation reached, with the token sample up to it."""

    segment: int
    keys: list[tuple[Any, ...]]
    messages: list[dict[str, Any]]  # template form
    tools_key: str
    sample: Sample
    is_prompt: bool
    text: str | None = None  # completions: the text so far
    reply: str = ""  # a choice: the text it returned to the client
    replies: tuple[tuple[int, int], ...] = ()  # (call, choice) of every reply sampled into `sample`


def _copy(sample: Sample) -> Sample:
    return dataclasses.replace(
        sample, tokens=list(sample.tokens), loss_mask=list(sample.loss_mask),
        rollout_log_probs=list(sample.rollout_log_probs), token_versions=list(sample.token_versions),
        turns=[dataclasses.replace(t, tool_names=list(t.tool_names)) for t in sample.turns],
        metadata={})


class Session:
    """The gateway side of one episode.

    Args:
        key: The session's API key (also its URL prefix, ``/s/<key>/v1``).
        engine: The engine serving the model.
        renderer: The chat renderer of the engine's tokenizer (and the run's tool-call format,
            which reads tool calls out of generated text).
        sampling: The run's sampling parameters: ``max_new_tokens`` caps each turn and the stop
            ids always apply.
        max_context_len: Prompt + response tokens allowed in one segment.
        rid: Request-id prefix of the session's engine requests (abort matches by prefix).
        seed: The run's ``--rollout-seed``: each request's seed derives from it and the rid.
        client_sampling: Honour the client's ``temperature`` / ``top_p`` (evaluation). False
            (training): the run's sampling applies, as the trainer's log-probs assume it.
        stopping: The rollout's stop flag: once set, a request the engine aborts (and any new
            one) ends the session (``stopped``) instead of being resumed.
        respond: A scripted model instead of the engine for chat requests: called with the
            request's messages (template form), it returns the reply as raw model text (tool
            calls in the run's format), which is tokenized and served as if sampled (log-probs
            0). ``agentrl eval --agent ... --policy oracle`` lets the env's oracle play the model.
    """

    def __init__(self, key: str, engine: Engine, renderer: ChatRenderer, sampling: SamplingParams,
                 max_context_len: int, *, rid: str, seed: int | None = None,
                 client_sampling: bool = False, stopping: threading.Event | None = None,
                 respond: Callable[[list[dict[str, Any]]], str] | None = None) -> None:
        self.key = key
        self.respond = respond
        self.engine = engine
        self.renderer = renderer
        self.sampling = sampling
        self.max_context_len = max_context_len
        self.rid = rid
        self.seed = seed
        self.client_sampling = client_sampling
        self.calls: list[CallRecord] = []
        self.segments: list[Segment] = []
        self.closed = False
        self.stopping = stopping
        self.stopped = False
        """The rollout stopped the session (it had enough samples): the episode is unfinished."""
        self._states: list[_State] = []
        self._tips: dict[int, tuple[_State, list[_State]]] = {}
        """Per segment, its latest call's prompt and choices: the only states a request continues."""
        self._requests = 0
        self._how = "start"
        self._lock = asyncio.Lock()
        self._eot_ids = renderer.encode(renderer.end_of_turn)

    # -- serving -----------------------------------------------------------------------------

    async def chat(self, request: ChatRequest) -> tuple[list[Choice], int]:
        """Serves a chat request: matches it to the session's states, generates its choices.

        Returns:
            The choices and the number of prompt tokens.

        Raises:
            APIError: The prompt leaves no room in the context (``context_length_exceeded``),
                or the template cannot render the messages.
            SessionClosed: The session ended meanwhile.
        """
        messages = template_messages(request.messages)
        keys = [message_key(m) for m in request.messages]
        tools = [dict(t) for t in request.tools] if request.tools else None
        tools_key = json.dumps(tools, sort_keys=True) if tools else ""

        def choice(prompt: _State, trajectory: Trajectory) -> tuple[Choice, _State]:
            made, message = self._chat_choice(trajectory, request)
            # the calls the client gets back, counted as the turn's tool calls (rollout/tool_calls)
            trajectory.sample.turns[-1].tool_names = [
                c["function"]["name"] for c in message.get("tool_calls") or ()]
            return made, _State(prompt.segment, [*keys, message_key(message)],
                                [*messages, _template_assistant(message)], tools_key,
                                trajectory.sample, is_prompt=False,
                                reply=str(message.get("content") or ""))

        engine = self.engine
        if self.respond is not None:  # the scripted model's reply, the same for every choice
            engine = _Scripted(self.renderer.encode(self.respond(messages)) + self._eot_ids, engine)
        return await self._serve(request, lambda: self._prompt_state(keys, messages, tools, tools_key),
                                 choice, engine)

    async def complete(self, request: CompletionRequest) -> tuple[list[tuple[str, str, Choice]], int]:
        """Serves a (legacy) completions request: a prompt that extends a previous prompt and
        completion (as text, or as ids) continues its segment, any other starts one.

        Returns:
            ``(text, finish reason, choice)`` per choice, and the number of prompt tokens.
        """
        def choice(prompt: _State, trajectory: Trajectory) -> tuple[tuple[str, str, Choice], _State]:
            text, reason, made = self._text_choice(trajectory, request)
            # what the engine saw, special tokens and stop strings included: only a prompt that
            # continues exactly that extends the segment
            full = (prompt.text or "") + self.renderer.tokenizer.decode(
                trajectory.last_turn_ids(), skip_special_tokens=False)
            return (text, reason, made), _State(
                prompt.segment, [], [], "", trajectory.sample, is_prompt=False,
                text=full if isinstance(request.prompt, str) else None, reply=text)

        return await self._serve(request, lambda: self._completion_state(request.prompt), choice)

    async def _serve(self, request: ChatRequest | CompletionRequest, make_prompt: Callable[[], _State],
                     make_choice: Callable[[_State, Trajectory], tuple[T, _State]],
                     engine: Any = None) -> tuple[list[T], int]:
        """One request, alone in the session: its prompt state, its choices generated, each
        choice recorded as a state; the last segment's final state is the first choice."""
        async with self._lock:
            self._check_open()
            mark = self._mark()
            prompt = make_prompt()
            record = self._record(prompt)
            started = time.perf_counter()
            outs = await self._choices(prompt, request, mark, engine or self.engine)
            record.latency_s = time.perf_counter() - started
            results, choices = [], []
            for i, trajectory in enumerate(outs):
                result, state = make_choice(prompt, trajectory)
                state.replies = (*prompt.replies, (record.index, i))
                results.append(result)
                choices.append(state)
                self._add_choice(record, state, trajectory)
            self.segments[prompt.segment].final = choices[0]
            self._tips[prompt.segment] = (prompt, choices)
            return results, len(prompt.sample.tokens)

    async def close(self) -> None:
        """Ends the session: requests in flight are aborted, new ones refused."""
        self.closed = True
        await self.engine.abort(f"{self.rid}-")

    # -- samples -----------------------------------------------------------------------------

    def samples(self, base: Sample, mode: str = "last") -> list[Sample]:
        """The session's segments as samples of ``base``'s group (its group id, index, prompt,
        label and metadata are kept; tokens, mask, log-probs and turns are the segment's).

        Args:
            base: The episode's sample.
            mode: ``last``: only the last segment (the one that ended the episode); ``all``:
                every segment that generated something, in order.

        Returns:
            The samples (none when the agent made no call); each has ``metadata["segments"]``
            (every segment: reason, calls, tokens, whether it is trained on) and
            ``metadata["segment"]`` (its own index); the last one (the episode's own sample)
            also has ``metadata["gateway"]``, the session's :meth:`stats` under ``mode``.
        """
        chosen = self._chosen(mode)
        infos = [s.info(s in chosen) for s in self.segments]
        out = []
        for segment in chosen:
            assert segment.final is not None
            made = segment.final.sample
            sample = dataclasses.replace(
                _copy(made), group_id=base.group_id, index=base.index, prompt=base.prompt,
                label=base.label, status=base.status, reward=base.reward,
                metadata={**copy.deepcopy(base.metadata), "segments": infos,
                          "segment": segment.index, "gateway_calls": len(self.calls)})
            out.append(sample)
        if out:
            out[-1].metadata["gateway"] = self.stats(mode)
        return out

    def stats(self, mode: str = "last") -> dict[str, int]:
        """What the session kept and lost when its samples are taken under ``mode``.

        Returns:
            ``calls``; ``segments``; ``rewrites`` (segments started because the agent changed
            its history, tools or prompt, rather than by its first call); ``replies`` (choices
            the engine generated); ``dropped_replies`` (replies in no trained sample: the
            segments ``last`` leaves out, choices other than the one the agent continued, draws
            a retry replaced).
        """
        trained = {reply for segment in self._chosen(mode) if segment.final is not None
                   for reply in segment.final.replies}
        replies = sum(len(call.choices) for call in self.calls)
        return {"calls": len(self.calls), "segments": len(self.segments),
                "rewrites": sum(1 for s in self.segments if s.index > 0),
                "replies": replies, "dropped_replies": replies - len(trained)}

    def _chosen(self, mode: str) -> list[Segment]:
        if mode not in SEGMENT_MODES:
            raise ValueError(f"--gateway-segments must be one of {SEGMENT_MODES}, got {mode!r}")
        done = [s for s in self.segments if s.final is not None]
        return done[-1:] if mode == "last" else done

    @property
    def last_assistant_text(self) -> str:
        """The content of the last choice generated (what a grader reads as the answer)."""
        final = next((s for s in reversed(self._states) if not s.is_prompt), None)
        return final.reply if final is not None else ""

    @property
    def last_messages(self) -> list[dict[str, Any]]:
        """The conversation of the last choice generated (template form)."""
        final = next((s for s in reversed(self._states) if not s.is_prompt), None)
        return [dict(m) for m in final.messages] if final is not None else []

    # -- internals ---------------------------------------------------------------------------

    def _mark(self) -> tuple[int, int, int]:
        return len(self._states), len(self.segments), len(self.calls)

    async def _choices(self, prompt: _State, request: ChatRequest | CompletionRequest,
                       mark: tuple[int, int, int], engine: Any) -> list[Trajectory]:
        """Generates the request's choices; a failed or cancelled call (a client that went
        away) leaves the session as it was before it."""
        try:
            return list(await asyncio.gather(*(self._generate(prompt, request, i, engine)
                                               for i in range(request.n))))
        except BaseException:
            states, segments, calls = mark
            del self._states[states:], self.segments[segments:], self.calls[calls:]
            if self.segments and prompt.segment < len(self.segments):
                self.segments[prompt.segment].calls -= 1
            raise

    def _check_open(self) -> None:
        if self.stopping is not None and self.stopping.is_set():
            self.stopped = True
            raise SessionClosed(f"session {self.key[:12]}... was stopped: the rollout has the "
                                "samples it needs")
        if self.closed:
            raise SessionClosed(f"session {self.key[:12]}... has ended (its episode is over)")

    def _record(self, prompt: _State) -> CallRecord:
        record = CallRecord(len(self.calls), prompt.segment, self._how,
                            list(prompt.sample.tokens))
        self.calls.append(record)
        self.segments[prompt.segment].calls += 1
        return record

    def _add_choice(self, record: CallRecord, state: _State, trajectory: Trajectory) -> None:
        sample = trajectory.sample
        turn = sample.turns[-1]
        start = sample.prompt_length + turn.start
        record.choices.append({
            "output_ids": sample.tokens[start:],
            "output_logprobs": sample.rollout_log_probs[turn.start:],
            "finish_reason": turn.finish_reason, "weight_version": sample.weight_version})
        self._states.append(state)

    def _new_segment(self, reason: str) -> int:
        self.segments.append(Segment(len(self.segments), reason))
        self._how = "start"
        return len(self.segments) - 1

    def _prompt_state(self, keys: list[tuple[Any, ...]], messages: list[dict[str, Any]],
                      tools: list[dict[str, Any]] | None, tools_key: str) -> _State:
        parent = self._match(keys, tools_key)
        if parent is not None and parent.is_prompt:
            self._how = "repeats"
            return parent
        if parent is not None:
            sample = _copy(parent.sample)
            trajectory = Trajectory(sample, self.renderer, self.max_context_len)
            new = messages[len(parent.keys):]
            try:
                _, fits = trajectory.append_env(parent.messages, new, tools, cut=False)
            except ValueError as exc:
                raise APIError(400, f"messages: {exc}", param="messages") from exc
            if not fits:
                raise self._too_long(len(sample.tokens) + 1)
            self._how = "extends"
            state = _State(parent.segment, keys, messages, tools_key, sample, is_prompt=True,
                           replies=parent.replies)
        else:
            ids = self.renderer.prompt_ids(messages, tools)
            if len(ids) >= self.max_context_len:
                raise self._too_long(len(ids))
            segment = self._new_segment(self._rewrite_reason(keys, tools_key))
            state = _State(segment, keys, messages, tools_key, Sample(group_id=self.key,
                                                                      tokens=ids), is_prompt=True)
        self._states.append(state)
        return state

    def _completion_state(self, prompt: str | tuple[int, ...]) -> _State:
        renderer = self.renderer
        parent = None
        for state in self._tip_states():
            if state.is_prompt or state.keys:
                continue
            if isinstance(prompt, str) and state.text is not None and prompt.startswith(state.text):
                parent = state if parent is None or len(state.text) > len(parent.text or "") else parent
            elif not isinstance(prompt, str) and list(prompt[: len(state.sample.tokens)]) == state.sample.tokens:
                parent = state if parent is None or len(state.sample.tokens) > len(parent.sample.tokens) else parent
        if parent is not None:
            sample = _copy(parent.sample)
            rest = (renderer.encode(prompt[len(parent.text or ""):]) if isinstance(prompt, str)
                    else list(prompt[len(sample.tokens):]))
            if rest:
                Trajectory(sample, renderer, self.max_context_len).append_env_ids(rest)
            self._how = "extends"
            segment = parent.segment
            replies = parent.replies
        else:
            ids = renderer.encode(prompt) if isinstance(prompt, str) else list(prompt)
            sample = Sample(group_id=self.key, tokens=ids)
            reason = "start" if not self.segments else "prompt does not extend the latest completion"
            segment = self._new_segment(reason)
            replies = ()
        if len(sample.tokens) >= self.max_context_len:
            raise self._too_long(len(sample.tokens))
        state = _State(segment, [], [], "", sample, is_prompt=True,
                       text=prompt if isinstance(prompt, str) else None, replies=replies)
        self._states.append(state)
        return state

    def _tip_states(self) -> list[_State]:
        """The states a request may continue, most recent first: each segment's latest prompt
        and the choices generated from it. Continuing an older state would fork its segment and
        leave the replies after it in no sample."""
        tips = [state for prompt, choices in self._tips.values() for state in (prompt, *choices)]
        order = {id(state): i for i, state in enumerate(self._states)}
        return sorted(tips, key=lambda state: order.get(id(state), -1), reverse=True)

    def _match(self, keys: list[tuple[Any, ...]], tools_key: str) -> _State | None:
        """The longest state the request continues, among each segment's latest prompt and
        choices: a choice whose conversation is a strict prefix of ``keys``, or a prompt equal to
        it; the most recent on a tie."""
        best: _State | None = None
        for state in self._tip_states():
            if state.tools_key != tools_key or not state.keys:
                continue
            n = len(state.keys)
            fits = (keys == state.keys) if state.is_prompt else (n < len(keys) and keys[:n] == state.keys)
            if fits and (best is None or n > len(best.keys)):
                best = state
        return best

    def _rewrite_reason(self, keys: list[tuple[Any, ...]], tools_key: str) -> str:
        last = next((s for s in reversed(self._states) if s.keys), None)
        if last is None:
            return "start"
        if last.tools_key != tools_key and keys[: len(last.keys)] == last.keys:
            return "tools changed"
        index = next((i for i, (a, b) in enumerate(zip(keys, last.keys, strict=False)) if a != b),
                     None)
        if index is not None:
            return f"history rewritten at messages[{index}] ({last.keys[index][0]} message changed)"
        if len(keys) < len(last.keys):
            return f"history shortened to {len(keys)} of {len(last.keys)} messages"
        return "no new message after the last assistant turn"

    def _too_long(self, tokens: int) -> APIError:
        return APIError(400, f"this model's context is {self.max_context_len} tokens and the "
                        f"request's prompt has {tokens}, leaving no room to generate; shorten the "
                        "messages", param="messages", code="context_length_exceeded")

    def _params(self, request: ChatRequest | CompletionRequest, choice: int, budget: int
                ) -> SamplingParams:
        run = self.sampling
        limit = min(run.max_new_tokens, request.max_tokens or run.max_new_tokens, budget)
        changes: dict[str, Any] = {"max_new_tokens": limit,
                                   "stop": tuple(dict.fromkeys([*run.stop, *request.stop]))}
        if self.client_sampling:
            if request.temperature is not None:
                changes["temperature"] = request.temperature
            if request.top_p is not None:
                changes["top_p"] = request.top_p
        if request.seed is not None:
            changes["sampling_seed"] = request_seed(request.seed, f"{self.rid}-{choice}")
        return run.replace(**changes)

    async def _generate(self, prompt: _State, request: ChatRequest | CompletionRequest,
                        choice: int, engine: Any) -> Trajectory:
        sample = _copy(prompt.sample)
        trajectory = Trajectory(sample, self.renderer, self.max_context_len)
        params = self._params(request, choice, trajectory.budget)
        for _ in range(ABORT_RETRIES):
            rid = f"{self.rid}-t{self._requests}"
            self._requests += 1
            out = await trajectory.generate(engine, params, rid, seed=self.seed)
            if out is None:  # the budget was checked: only a full context gets here
                raise self._too_long(len(sample.tokens))
            if out.finish_reason != "abort":
                return trajectory
            self._check_open()  # aborted by a weight update: go on with the rest of the turn
            # (the rollout's stop aborts too: then the check above ends the session)
            params = params.replace(max_new_tokens=max(1, params.max_new_tokens - len(out.output_ids)))
        raise APIError(503, "the engine aborted this request repeatedly; retry it",
                       type="server_error", code="engine_aborted")

    def _decoded(self, trajectory: Trajectory, stops: Sequence[str]) -> tuple[str, bool]:
        """The choice's text (special tokens dropped), cut before the first stop string."""
        text = trajectory.last_turn_text()
        cuts = [i for i in (text.find(s) for s in stops) if i >= 0]
        return (text[: min(cuts)], True) if cuts else (text, False)

    def _token_strings(self, ids: Sequence[int], logprobs: bool) -> list[str]:
        if not logprobs:
            return []
        return [self.renderer.tokenizer.decode([i]) for i in ids]

    def _chat_choice(self, trajectory: Trajectory, request: ChatRequest
                     ) -> tuple[Choice, dict[str, Any]]:
        text, stopped = self._decoded(trajectory, request.stop)
        calls: tuple[Any, ...] = ()
        content = text
        if request.tools is not None:
            try:
                parsed = self.renderer.tool_call_format.parse(text)
            except ToolCallParseError:  # malformed markup: the model's text, as written
                parsed = None
            if parsed is not None and parsed.tool_calls:
                calls, content = parsed.tool_calls, parsed.content
                if not request.parallel_tool_calls:
                    calls = calls[:1]
        message = assistant_message(content, calls, [f"call_{uuid.uuid4().hex[:24]}" for _ in calls])
        finish = trajectory.sample.turns[-1].finish_reason
        reason = "tool_calls" if calls else ("length" if finish == "length" and not stopped else "stop")
        ids = trajectory.last_turn_ids()
        lps = trajectory.sample.rollout_log_probs[-len(ids):] if ids else []
        return Choice(message, reason, self._token_strings(ids, request.logprobs), list(lps),
                      list(ids)), message

    def _text_choice(self, trajectory: Trajectory, request: CompletionRequest
                     ) -> tuple[str, str, Choice]:
        text, stopped = self._decoded(trajectory, request.stop)
        finish = trajectory.sample.turns[-1].finish_reason
        reason = "length" if finish == "length" and not stopped else "stop"
        ids = trajectory.last_turn_ids()
        lps = trajectory.sample.rollout_log_probs[-len(ids):] if ids else []
        choice = Choice({}, reason, self._token_strings(ids, request.logprobs), list(lps), list(ids))
        return text, reason, choice


def _template_assistant(message: Mapping[str, Any]) -> dict[str, Any]:
    return template_messages([message])[0]


class _Scripted:
    """A scripted model's one reply, served through the engine interface a trajectory uses:
    ``ids`` (cut at the turn's token budget), log-probs 0, the engine's weight version."""

    def __init__(self, ids: list[int], engine: Engine) -> None:
        self.ids = ids
        self.weight_version = engine.weight_version

    async def generate(self, input_ids: list[int], sampling: SamplingParams, rid: str | None = None
                       ) -> GenerateOutput:
        ids = self.ids[: sampling.max_new_tokens]
        finish = "stop" if len(ids) == len(self.ids) else "length"
        return GenerateOutput(ids, [0.0] * len(ids), finish, self.weight_version, len(input_ids))

