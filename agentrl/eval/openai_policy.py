"""``agentrl eval --policy openai``: any OpenAI-compatible chat server as the policy.

The episode loop is the env's own (:class:`~agentrl.rollout.episode.Episode`); only its
assistant turns come from the server, through :class:`OpenAITurns`. Each turn sends the
conversation so far, in OpenAI chat form, with the env's tool schemas as ``tools``, to
``POST {base_url}/chat/completions``, and the reply's ``tool_calls`` are the env's action. Tool
calling is the server's own (vLLM's or SGLang's tool-call parser, a hosted API's native calls):
the env's ``--tool-call-format`` is not involved, and text without ``tool_calls`` is the final
answer. No tokens are kept; a turn is recorded as a message-only
:class:`~agentrl.records.sample.Turn` with its wall time (retries included) as policy time.

**Conversation mapping.** The env keeps calls as ``{"name", "arguments": dict}`` and results as
``{"role": "tool", "name", "content"}``; the server wants ``tool_calls: [{"id", "type":
"function", "function": {"name", "arguments": JSON text}}]`` and tool messages whose
``tool_call_id`` names the call they answer. The env writes exactly one tool message per call,
in call order, so results are paired with calls by position; each assistant turn the server
wrote is sent back as the server wrote it (its call ids, its argument text), including calls
the env rejected, which is what keeps that pairing exact. Arguments that are not a JSON object
go to the env as they are: it answers them with a ``malformed_arguments`` tool error, as it
would a model's.

**Failures.** HTTP 429, 5xx, connection errors and requests that exceed ``request_timeout`` are
retried up to ``max_retries`` times, waiting as the server's ``Retry-After`` says or else with
exponential backoff; other 4xx answers and malformed replies are not retried. A request that
still fails raises :class:`~agentrl.errors.PolicyServerError` naming the URL, the HTTP status
and the server's own message; the episode loop turns it into a failed sample with that reason.

**Usage.** The ``usage`` of every reply is summed per episode into the sample's
``metadata["usage"]`` (``prompt_tokens``, ``completion_tokens``, ``total_tokens``); the eval
summary adds them up (:func:`agentrl.eval.metrics.summarize`).
"""

from __future__ import annotations

import asyncio
import email.utils
import json
import logging
import random
import time
import weakref
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import aiohttp

from agentrl.errors import PolicyServerError
from agentrl.eval.metrics import USAGE_KEYS
from agentrl.records.sample import Turn
from agentrl.rollout.episode import Episode, TurnOutput, TurnSource

__all__ = ["OpenAITurns", "read_reply", "retry_after_s", "server_message", "to_openai_messages"]

log = logging.getLogger(__name__)

MAX_RETRY_AFTER_S = 120.0
"""The longest wait a ``Retry-After`` header is obeyed for: a longer one would stall the
evaluation for no answer, so the request is retried after this long instead."""

RETRIED_STATUSES = frozenset({429})
"""4xx statuses that are retried (every 5xx is too): the others say the request itself is
wrong, and sending it again cannot help."""


class _Retryable(Exception):
    """One attempt failed in a way that may pass on a retry (internal control flow)."""

    def __init__(self, reason: str, status: int | None = None,
                 retry_after: float | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.status = status
        self.retry_after = retry_after


class OpenAITurns(TurnSource):
    """Assistant turns from an OpenAI-compatible ``/chat/completions`` endpoint.

    One HTTP session serves every episode of an evaluation; :meth:`close` ends it. Episodes
    may call :meth:`next_turn` concurrently (the rollout's ``--rollout-concurrency`` bounds
    them); the session puts no limit of its own on connections.

    Args:
        base_url: The API root, e.g. ``http://127.0.0.1:8000/v1`` (``/chat/completions`` is
            appended).
        model: The model name the server serves.
        api_key: Sent as ``Authorization: Bearer``; ``None`` or empty: no such header (local
            servers need none).
        temperature: Sampling temperature.
        top_p: Nucleus sampling mass.
        max_tokens: New tokens per assistant turn at most; a reply cut there
            (``finish_reason: length``) truncates the episode.
        stop: Stop strings (none: the field is not sent).
        request_timeout: Seconds one request may take, reading the reply included.
        max_retries: Retries of a request after a retryable failure (0: none).
        backoff_s: The first wait between retries when the server gives no ``Retry-After``;
            it doubles with each retry, with random jitter of up to half of it.
        max_backoff_s: The longest such wait.
    """

    name = "openai"

    def __init__(self, base_url: str, model: str, *, api_key: str | None = None,
                 temperature: float = 1.0, top_p: float = 1.0, max_tokens: int = 256,
                 stop: Sequence[str] = (), request_timeout: float = 120.0, max_retries: int = 4,
                 backoff_s: float = 0.5, max_backoff_s: float = 30.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.url = f"{self.base_url}/chat/completions"
        self.model = model
        self.api_key = api_key or None
        self.temperature = temperature
        self.top_p = top_p
        self.max_tokens = max_tokens
        self.stop = tuple(stop)
        self.request_timeout = request_timeout
        self.max_retries = max_retries
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self._session: aiohttp.ClientSession | None = None
        # Per episode: the assistant messages the server wrote, by their index in the env's
        # messages, sent back verbatim so call ids and argument text stay the server's own.
        self._written: weakref.WeakKeyDictionary[Episode, dict[int, dict[str, Any]]] = (
            weakref.WeakKeyDictionary())

    async def next_turn(self, episode: Episode, rid: str) -> TurnOutput:
        """Asks the server for the next assistant turn of ``episode`` and records it (a
        message-only turn, its usage added to ``metadata["usage"]``).

        Returns:
            The turn: an assistant message whose ``tool_calls`` (``{"id", "name",
            "arguments"}``, possibly empty) are the server's; ``finish_reason`` ``length``
            when the reply was cut at ``max_tokens``, else ``stop``.

        Raises:
            PolicyServerError: The server kept failing, refused the request, or replied with
                something that is not a chat completion (the message says which, with the URL
                and status).
            RuntimeError: The episode keeps tokens (a context with a chat renderer): this
                policy has none to give.
        """
        if episode.trajectory is not None:
            raise RuntimeError("the openai policy plays messages only: give it a context "
                               "without a chat renderer (agentrl.rollout.build.scripted_context)")
        history = episode.env.messages if episode.env is not None else episode.history
        written = self._written.setdefault(episode, {})
        body: dict[str, Any] = {
            "model": self.model, "messages": to_openai_messages(history, written),
            "max_tokens": self.max_tokens, "temperature": self.temperature, "top_p": self.top_p,
        }
        if episode.tools:
            body["tools"] = list(episode.tools)
        if self.stop:
            body["stop"] = list(self.stop)
        started = time.perf_counter()
        reply = await self.complete(body)
        elapsed = time.perf_counter() - started
        choice = _first_choice(reply, self.url)
        action, message = read_reply(choice["message"], episode.turn)
        written[len(history)] = message  # where the env appends this turn's assistant message
        _add_usage(episode.sample.metadata, reply.get("usage"))
        finish = "length" if choice.get("finish_reason") == "length" else "stop"
        episode.sample.turns.append(Turn("assistant", 0, 0, finish_reason=finish,
                                         generate_s=elapsed))
        return TurnOutput(action, finish)

    async def complete(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """``POST /chat/completions`` with ``body``, retried as the module docstring says.

        Returns:
            The reply, parsed from JSON (a dict).

        Raises:
            PolicyServerError: The last attempt failed, or a failure that is not retried
                happened (the message names the URL, the status and the server's message, and
                how many retries were made).
        """
        retries = 0
        while True:
            try:
                return await self._post(body)
            except _Retryable as failure:
                if retries >= self.max_retries:
                    tried = f"gave up after {retries} retries" if retries else "not retried"
                    raise PolicyServerError(f"{failure.reason} ({tried}; --max-retries "
                                            f"{self.max_retries})", url=self.url,
                                            status=failure.status) from None
                delay = failure.retry_after
                if delay is None:
                    delay = min(self.max_backoff_s, self.backoff_s * 2 ** retries)
                    delay *= random.uniform(0.5, 1.0)  # spreads out episodes that failed at once
                log.info("%s; retrying in %.2f s (retry %d of %d)", failure.reason, delay,
                         retries + 1, self.max_retries)
                await asyncio.sleep(delay)
                retries += 1

    async def close(self) -> None:
        """Closes the HTTP session (idempotent; a later turn opens a new one)."""
        session, self._session = self._session, None
        if session is not None:
            await session.close()

    async def _post(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """One attempt. Raises :class:`_Retryable`, or PolicyServerError when a retry cannot
        help."""
        session = self._open()
        try:
            async with session.post(self.url, json=body,
                                    timeout=aiohttp.ClientTimeout(total=self.request_timeout)
                                    ) as response:
                status, text = response.status, await response.text(errors="replace")
                headers = response.headers
                phrase = response.reason or ""
        except TimeoutError:  # before ClientError: aiohttp's timeouts are both
            raise _Retryable(f"POST {self.url}: no reply within {self.request_timeout:g} s "
                             "(--request-timeout)") from None
        except aiohttp.ClientError as exc:
            raise _Retryable(f"POST {self.url}: cannot reach the server: "
                             f"{type(exc).__name__}: {exc}") from None
        if status == 200:
            try:
                reply = json.loads(text)
            except ValueError:
                raise PolicyServerError(f"POST {self.url}: HTTP 200 but the body is not JSON: "
                                        f"{_one_line(text)[:300]!r}", url=self.url,
                                        status=status) from None
            if not isinstance(reply, dict):
                raise PolicyServerError(f"POST {self.url}: HTTP 200 but the body is not a chat "
                                        f"completion: {_one_line(text)[:300]!r}", url=self.url,
                                        status=status)
            return reply
        reason = f"POST {self.url}: HTTP {status} {phrase}".rstrip() + f": {server_message(text)}"
        if status >= 500 or status in RETRIED_STATUSES:
            raise _Retryable(reason, status, retry_after_s(headers))
        if status in (401, 403) and self.api_key is None:
            reason += " (no API key was sent: --api-key-env names the variable that holds it)"
        elif status == 404:
            reason += " (--base-url must be the API root that /chat/completions is under, e.g. "
            reason += "http://127.0.0.1:8000/v1)"
        raise PolicyServerError(f"{reason} (not retried: HTTP {status} says the request is "
                                "wrong)", url=self.url, status=status)

    def _open(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
            # episodes are bounded by --rollout-concurrency; a connector limit would queue
            # requests behind it unseen, inside the per-request timeout
            self._session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0),
                                                  headers=headers)
        return self._session


def to_openai_messages(messages: Sequence[Mapping[str, Any]],
                       written: Mapping[int, Mapping[str, Any]] | None = None
                       ) -> list[dict[str, Any]]:
    """An env's conversation in OpenAI chat form.

    Args:
        messages: The env's messages (agentrl form: assistant ``tool_calls`` are ``{"name",
            "arguments"}``; tool results are ``{"role": "tool", "name", "content"}``).
        written: Assistant messages already in OpenAI form, by their index in ``messages``
            (the server's own turns): used instead of converting those.

    Returns:
        New message dicts. Each tool message answers, by ``tool_call_id``, the call at its
        position among the preceding assistant message's calls. A tool message beyond that
        message's calls (the env's answer to a call it could not read) gets a call added to the
        assistant message, so that every tool message answers one.
    """
    written = written or {}
    out: list[dict[str, Any]] = []
    calls: list[dict[str, Any]] = []
    answered = 0
    for index, m in enumerate(messages):
        role = m.get("role")
        if role == "assistant":
            source = written.get(index)
            message = _copy_assistant(source) if source is not None else _assistant(m, index)
            out.append(message)
            calls = message.setdefault("tool_calls", [])
            answered = 0
        elif role == "tool":
            if answered >= len(calls):
                calls.append({"id": f"call_{index}", "type": "function",
                              "function": {"name": str(m.get("name") or ""), "arguments": "{}"}})
            out.append({"role": "tool", "tool_call_id": calls[answered]["id"],
                        "content": _text(m.get("content"))})
            answered += 1
        else:
            out.append({key: m[key] for key in ("role", "content", "name") if key in m})
    for message in out:  # servers refuse an empty list: no calls is no key
        if message["role"] == "assistant" and not message["tool_calls"]:
            del message["tool_calls"]
    return out


def read_reply(message: Any, turn: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """The env's action and the OpenAI-form history entry for one assistant reply.

    Args:
        message: ``choices[0].message`` of a chat completion.
        turn: The episode's turn number (makes call ids the server did not give, or gave twice,
            unique).

    Returns:
        ``(action, written)``: the action ``{"role": "assistant", "content", "tool_calls":
        [{"id", "name", "arguments"}]}`` (arguments a dict when they are a JSON object, else
        the server's text, which the env reports as a tool error), and the message to send
        back in later requests.

    Raises:
        PolicyServerError: ``message`` is not an object.
    """
    if not isinstance(message, Mapping):
        raise PolicyServerError(f"the reply's choices[0].message is not an object: {message!r}")
    content = _text(message.get("content"))
    action_calls: list[dict[str, Any]] = []
    written_calls: list[dict[str, Any]] = []
    used: set[str] = set()
    raw_calls = message.get("tool_calls")
    for j, raw in enumerate(raw_calls if isinstance(raw_calls, list) else ()):
        raw = raw if isinstance(raw, Mapping) else {}
        function = raw.get("function")
        function = function if isinstance(function, Mapping) else {}
        call_id = raw.get("id")
        if not isinstance(call_id, str) or not call_id or call_id in used:
            call_id = f"call_{turn}_{j}"
        used.add(call_id)
        name, arguments = function.get("name"), function.get("arguments")
        action_calls.append({"id": call_id, "name": name, "arguments": _arguments(arguments)})
        text = arguments if isinstance(arguments, str) else json.dumps(arguments or {})
        written_calls.append({"id": call_id, "type": "function",
                              "function": {"name": name if isinstance(name, str) else "",
                                           "arguments": text}})
    action = {"role": "assistant", "content": content, "tool_calls": action_calls}
    written = {"role": "assistant", "content": content, "tool_calls": written_calls}
    return action, written


def retry_after_s(headers: Mapping[str, str]) -> float | None:
    """How long a reply asks to wait before a retry: ``retry-after-ms``, else ``Retry-After``
    (seconds, or an HTTP date), at most :data:`MAX_RETRY_AFTER_S`; ``None`` when neither is
    given or readable."""
    lowered = {key.lower(): value for key, value in headers.items()}
    seconds: float | None = None
    if "retry-after-ms" in lowered:
        try:
            seconds = float(lowered["retry-after-ms"]) / 1000
        except ValueError:
            seconds = None
    if seconds is None and "retry-after" in lowered:
        value = lowered["retry-after"]
        try:
            seconds = float(value)
        except ValueError:
            try:
                when = email.utils.parsedate_to_datetime(value)
            except (TypeError, ValueError):
                return None
            if when.tzinfo is None:
                when = when.replace(tzinfo=UTC)
            seconds = (when - datetime.now(UTC)).total_seconds()
    if seconds is None or seconds != seconds:  # NaN
        return None
    return min(max(seconds, 0.0), MAX_RETRY_AFTER_S)


def server_message(text: str) -> str:
    """The error message in a reply body, on one line: OpenAI's ``{"error": {"message"}}``,
    ``{"message"}``, FastAPI's ``{"detail"}``, else the body's text (at most 500 characters)."""
    try:
        data = json.loads(text)
    except ValueError:
        return _one_line(text)[:500] or "(empty body)"
    found: Any = data
    if isinstance(data, Mapping):
        error = data.get("error")
        if isinstance(error, Mapping):
            found = error.get("message") or error
        elif error:
            found = error
        else:
            found = data.get("message") or data.get("detail") or data
    message = found if isinstance(found, str) else json.dumps(found)
    return _one_line(message)[:500] or "(empty body)"


def _first_choice(reply: Mapping[str, Any], url: str) -> Mapping[str, Any]:
    choices = reply.get("choices")
    first = choices[0] if isinstance(choices, list) and choices else None
    if not isinstance(first, Mapping) or "message" not in first:
        body = _one_line(json.dumps(reply))[:300]
        raise PolicyServerError(f"POST {url}: the reply has no choices[0].message: {body}",
                                url=url, status=200)
    return first


def _add_usage(metadata: dict[str, Any], usage: Any) -> None:
    totals = metadata.setdefault("usage", dict.fromkeys(USAGE_KEYS, 0))
    if isinstance(usage, Mapping):
        for key in ("prompt_tokens", "completion_tokens"):
            value = usage.get(key)
            if isinstance(value, int) and not isinstance(value, bool):
                totals[key] += value
    totals["total_tokens"] = totals["prompt_tokens"] + totals["completion_tokens"]


def _assistant(m: Mapping[str, Any], index: int) -> dict[str, Any]:
    """An agentrl-form assistant message (one this policy did not write) in OpenAI form."""
    calls = []
    for j, call in enumerate(m.get("tool_calls") or ()):
        arguments = call.get("arguments")
        calls.append({"id": f"call_{index}_{j}", "type": "function",
                      "function": {"name": str(call.get("name") or ""),
                                   "arguments": arguments if isinstance(arguments, str)
                                   else json.dumps(arguments or {})}})
    return {"role": "assistant", "content": _text(m.get("content")), "tool_calls": calls}


def _copy_assistant(m: Mapping[str, Any]) -> dict[str, Any]:
    return {**m, "tool_calls": [{**c, "function": dict(c["function"])}
                                for c in m.get("tool_calls") or ()]}


def _arguments(arguments: Any) -> Any:
    """A call's arguments for the env: a dict when they are a JSON object (an absent or empty
    argument text is ``{}``), else as the server wrote them."""
    if arguments is None or (isinstance(arguments, str) and not arguments.strip()):
        return {}
    if isinstance(arguments, str):
        try:
            decoded = json.loads(arguments)
        except ValueError:
            return arguments
        return decoded if isinstance(decoded, dict) else arguments
    return arguments


def _text(content: Any) -> str:
    """Message content as text: a list of content parts is joined from its ``text`` parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, Mapping))
    return ""


def _one_line(text: str) -> str:
    return " ".join(text.split())
