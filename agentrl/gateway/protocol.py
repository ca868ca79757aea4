"""The OpenAI wire format the gateway speaks: requests read and checked, responses written.

Pure functions and dataclasses (no HTTP, no engine), so every rule here is unit-tested alone.

Request fields fall in three kinds:

* honoured: ``model``, ``messages`` / ``prompt``, ``tools``, ``tool_choice``, ``n``,
  ``temperature``, ``top_p``, ``max_tokens`` / ``max_completion_tokens``, ``stop``, ``seed``,
  ``logprobs``, ``stream``, ``stream_options.include_usage``, ``parallel_tool_calls``;
* accepted and ignored, as they change nothing a local model does: ``user``, ``store``,
  ``metadata``, ``service_tier``, ``prompt_cache_key``, ``safety_identifier``, and
  ``frequency_penalty`` / ``presence_penalty`` / ``top_logprobs`` when 0 (other values are refused:
  the engine has no such sampling);
* anything else is refused with a 400 naming the field, so a typo never silently changes what
  was asked for.

Errors use OpenAI's body: ``{"error": {"message", "type", "param", "code"}}``.
"""

from __future__ import annotations

import dataclasses
import json
import time
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from agentrl.env.messages import content_text

__all__ = [
    "MAX_N",
    "APIError",
    "ChatRequest",
    "Choice",
    "CompletionRequest",
    "assistant_message",
    "chat_chunk",
    "chat_response",
    "chunk_logprobs",
    "completion_response",
    "content_text",
    "message_key",
    "new_id",
    "parse_chat_request",
    "parse_completion_request",
    "template_messages",
]

MAX_N = 16
"""Most choices one request may ask for (``n``)."""

_COMMON = {"model", "n", "temperature", "top_p", "max_tokens", "stop", "seed", "logprobs",
           "stream", "stream_options", "user", "frequency_penalty", "presence_penalty",
           "metadata", "store", "service_tier", "prompt_cache_key", "safety_identifier"}
_CHAT_FIELDS = _COMMON | {"messages", "tools", "tool_choice", "max_completion_tokens",
                          "parallel_tool_calls", "top_logprobs", "response_format"}
_COMPLETION_FIELDS = _COMMON | {"prompt", "echo", "suffix", "best_of"}
_ROLES = ("system", "developer", "user", "assistant", "tool")


class APIError(Exception):
    """A request the gateway refuses, as OpenAI reports it.

    Args:
        status: HTTP status (400 bad request, 401 unknown key, 404 unknown model or route).
        message: What is wrong and what to do.
        param: The request field at fault, if one is.
        code: OpenAI's machine-readable code (``context_length_exceeded``, ...).
        type: OpenAI's error type.
    """

    def __init__(self, status: int, message: str, *, param: str | None = None,
                 code: str | None = None, type: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.type = type

    def body(self) -> dict[str, Any]:
        """The JSON error body."""
        return {"error": {"message": self.message, "type": self.type, "param": self.param,
                          "code": self.code}}


def _bad(message: str, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(400, message, param=param, code=code)


@dataclasses.dataclass(frozen=True)
class _Sampling:
    """What both endpoints share: the model and how to sample."""

    model: str
    n: int = 1
    temperature: float | None = None
    top_p: float | None = None
    max_tokens: int | None = None
    stop: tuple[str, ...] = ()
    seed: int | None = None
    logprobs: bool = False
    stream: bool = False
    include_usage: bool = False


@dataclasses.dataclass(frozen=True)
class ChatRequest(_Sampling):
    """A checked ``POST /v1/chat/completions`` body.

    Attributes:
        messages: The conversation, as sent (OpenAI form).
        tools: Function schemas (OpenAI form), ``None`` when none were given or
            ``tool_choice`` is ``"none"``.
        tool_choice: ``auto``, ``none``, ``required`` or a function name.
        parallel_tool_calls: False keeps only the first call of a turn.
    """

    messages: tuple[Mapping[str, Any], ...] = ()
    tools: tuple[Mapping[str, Any], ...] | None = None
    tool_choice: str = "auto"
    parallel_tool_calls: bool = True


@dataclasses.dataclass(frozen=True)
class CompletionRequest(_Sampling):
    """A checked ``POST /v1/completions`` body: one prompt, text or token ids."""

    prompt: str | tuple[int, ...] = ""


def _check_fields(body: Any, allowed: set[str], where: str) -> Mapping[str, Any]:
    if not isinstance(body, Mapping):
        raise _bad(f"the request body must be a JSON object ({where})")
    unknown = sorted(set(body) - allowed)
    if unknown:
        raise _bad(f"unknown field {unknown[0]!r} in a {where} request; the gateway takes "
                   f"{', '.join(sorted(allowed))}", param=unknown[0], code="unknown_field")
    return body


def _number(body: Mapping[str, Any], name: str, low: float, high: float) -> float | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not low <= value <= high:
        raise _bad(f"{name} must be a number in [{low}, {high}], got {value!r}", param=name)
    return float(value)


def _integer(body: Mapping[str, Any], name: str, low: int, high: int | None = None) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < low or (
            high is not None and value > high):
        bound = f"between {low} and {high}" if high is not None else f">= {low}"
        raise _bad(f"{name} must be an integer {bound}, got {value!r}", param=name)
    return value


def _sampling(body: Mapping[str, Any]) -> dict[str, Any]:
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise _bad("model is required: the name GET /v1/models lists", param="model")
    for name in ("frequency_penalty", "presence_penalty", "top_logprobs"):
        if body.get(name) not in (None, 0, 0.0):
            raise _bad(f"{name} is not supported by agentrl's engines (only 0)", param=name)
    stop = body.get("stop")
    if isinstance(stop, str):
        stop = [stop]
    if stop is not None and (not isinstance(stop, list) or len(stop) > 4
                             or not all(isinstance(s, str) and s for s in stop)):
        raise _bad("stop must be a string or a list of up to 4 non-empty strings", param="stop")
    options = body.get("stream_options")
    if options is not None and not isinstance(options, Mapping):
        raise _bad("stream_options must be an object", param="stream_options")
    n = _integer(body, "n", 1, MAX_N)
    logprobs = body.get("logprobs")
    return {
        "model": model, "n": 1 if n is None else n,
        "temperature": _number(body, "temperature", 0.0, 2.0),
        "top_p": _number(body, "top_p", 1e-9, 1.0), "stop": tuple(stop or ()),
        "seed": _integer(body, "seed", -(2**63), 2**63 - 1),
        "logprobs": bool(logprobs) if not isinstance(logprobs, int) else logprobs > 0,
        "stream": bool(body.get("stream", False)),
        "include_usage": bool((options or {}).get("include_usage", False)),
        "max_tokens": _integer(body, "max_tokens", 1),
    }


def parse_chat_request(body: Any) -> ChatRequest:
    """Checks a chat-completions body.

    Raises:
        APIError: 400 naming the field at fault (unknown fields, ``n`` above :data:`MAX_N`,
            malformed messages or tools, an unsupported ``response_format``).
    """
    body = _check_fields(body, _CHAT_FIELDS, "chat completions")
    fields = _sampling(body)
    limit = _integer(body, "max_completion_tokens", 1)
    if limit is not None:
        fields["max_tokens"] = limit
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise _bad("messages must be a non-empty list of messages", param="messages")
    for i, message in enumerate(messages):
        _check_message(message, f"messages[{i}]")
    response_format = body.get("response_format")
    if response_format is not None and (not isinstance(response_format, Mapping)
                                        or response_format.get("type") != "text"):
        raise _bad("response_format: only {\"type\": \"text\"} is supported (no constrained "
                   "decoding in agentrl's engines)", param="response_format")
    tools = body.get("tools")
    if tools is not None:
        if not isinstance(tools, list) or not all(_is_function_tool(t) for t in tools):
            raise _bad("tools must be a list of {\"type\": \"function\", \"function\": {\"name\", "
                       "...}} objects", param="tools")
    choice = body.get("tool_choice", "auto")
    if isinstance(choice, Mapping):
        name = (choice.get("function") or {}).get("name") if isinstance(choice.get("function"), Mapping) else None
        if not isinstance(name, str):
            raise _bad("tool_choice must be auto, none, required or {\"type\": \"function\", "
                       "\"function\": {\"name\": ...}}", param="tool_choice")
        choice = name
    elif choice not in ("auto", "none", "required"):
        raise _bad(f"tool_choice must be auto, none, required or a function, got {choice!r}",
                   param="tool_choice")
    if choice == "none" or not tools:
        tools = None
    return ChatRequest(**fields, messages=tuple(messages),
                       tools=tuple(tools) if tools else None, tool_choice=choice,
                       parallel_tool_calls=bool(body.get("parallel_tool_calls", True)))


def parse_completion_request(body: Any) -> CompletionRequest:
    """Checks a (legacy) completions body: one prompt, a string or a list of token ids.

    Raises:
        APIError: 400 naming the field at fault.
    """
    body = _check_fields(body, _COMPLETION_FIELDS, "completions")
    fields = _sampling(body)
    for name in ("echo", "suffix"):
        if body.get(name):
            raise _bad(f"{name} is not supported", param=name)
    if body.get("best_of") not in (None, 1):
        raise _bad("best_of is not supported (use n)", param="best_of")
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, list):
        if not prompt or not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0
                                 for t in prompt):
            raise _bad("prompt must be a string or one list of token ids", param="prompt")
        prompt = tuple(prompt)
    elif not isinstance(prompt, str) or not prompt:
        raise _bad("prompt must be a non-empty string or one list of token ids", param="prompt")
    return CompletionRequest(**fields, prompt=prompt)


def _is_function_tool(tool: Any) -> bool:
    return (isinstance(tool, Mapping) and tool.get("type", "function") == "function"
            and isinstance(tool.get("function"), Mapping)
            and isinstance(tool["function"].get("name"), str))


def _check_message(message: Any, where: str) -> None:
    if not isinstance(message, Mapping):
        raise _bad(f"{where} must be an object", param=where)
    role = message.get("role")
    if role not in _ROLES:
        raise _bad(f"{where}.role must be one of {', '.join(_ROLES)}, got {role!r}", param=where)
    content = message.get("content")
    if content is not None and not isinstance(content, str):
        if not isinstance(content, list) or not all(
                isinstance(p, Mapping) and p.get("type") == "text" and isinstance(p.get("text"), str)
                for p in content):
            raise _bad(f"{where}.content must be a string or a list of text parts (the gateway "
                       "serves text models)", param=where)
    calls = message.get("tool_calls")
    if calls is not None:
        if role != "assistant" or not isinstance(calls, list):
            raise _bad(f"{where}.tool_calls: only assistant messages carry a list of calls",
                       param=where)
        for j, call in enumerate(calls):
            fn = call.get("function") if isinstance(call, Mapping) else None
            if not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str):
                raise _bad(f"{where}.tool_calls[{j}] must be {{\"type\": \"function\", "
                           "\"function\": {\"name\", \"arguments\"}}", param=where)


def _arguments(raw: Any) -> Any:
    if isinstance(raw, str):
        try:
            return json.loads(raw)
        except ValueError:
            return raw
    return raw if raw is not None else {}


def template_messages(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """OpenAI messages in the chat-template form: string content, ``developer`` as ``system``,
    tool-call arguments decoded, and each tool result named after the call it answers."""
    out: list[dict[str, Any]] = []
    names: dict[str, str] = {}
    for message in messages:
        role = "system" if message["role"] == "developer" else message["role"]
        msg: dict[str, Any] = {"role": role, "content": content_text(message.get("content"))}
        calls = message.get("tool_calls")
        if calls:
            msg["tool_calls"] = []
            for call in calls:
                fn = call["function"]
                item = {"type": "function", "function": {"name": fn["name"],
                                                         "arguments": _arguments(fn.get("arguments"))}}
                if call.get("id"):
                    item["id"] = call["id"]
                    names[call["id"]] = fn["name"]
                msg["tool_calls"].append(item)
        if role == "tool":
            name = message.get("name") or names.get(str(message.get("tool_call_id")))
            if name:
                msg["name"] = name
            if message.get("tool_call_id"):
                msg["tool_call_id"] = message["tool_call_id"]
        out.append(msg)
    return out


def message_key(message: Mapping[str, Any]) -> tuple[Any, ...]:
    """What must match for a sent message to be the same as a recorded one: role, text and
    tool calls (names and decoded arguments); ids, names and extra fields clients add are not
    compared."""
    role = "system" if message.get("role") == "developer" else message.get("role")
    calls = tuple(
        (c["function"]["name"], json.dumps(_arguments(c["function"].get("arguments")),
                                           sort_keys=True, ensure_ascii=False))
        for c in message.get("tool_calls") or ())
    return role, content_text(message.get("content")), calls


def assistant_message(content: str, calls: Sequence[Any], call_ids: Sequence[str]) -> dict[str, Any]:
    """The OpenAI assistant message for a generated turn (``calls``: agentrl ToolCalls)."""
    message: dict[str, Any] = {"role": "assistant", "content": content if content or not calls else None}
    if calls:
        message["tool_calls"] = [
            {"id": call_id, "type": "function",
             "function": {"name": c.name, "arguments": json.dumps(c.arguments, ensure_ascii=False)}}
            for c, call_id in zip(calls, call_ids, strict=True)]
    return message


def new_id(prefix: str) -> str:
    """A fresh response id (``chatcmpl-...``, ``cmpl-...``)."""
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


def _usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def _logprobs(tokens: Sequence[str], logprobs: Sequence[float]) -> dict[str, Any]:
    return {"content": [{"token": t, "logprob": lp, "bytes": list(t.encode()), "top_logprobs": []}
                        for t, lp in zip(tokens, logprobs, strict=True)]}


@dataclasses.dataclass
class Choice:
    """One generated choice, ready to be written.

    Attributes:
        message: The assistant message (:func:`assistant_message`).
        finish_reason: ``stop``, ``length`` or ``tool_calls``.
        tokens: The sampled tokens as strings (for ``logprobs``).
        logprobs: Their log-probabilities.
        token_ids: The sampled ids.
    """

    message: dict[str, Any]
    finish_reason: str
    tokens: list[str]
    logprobs: list[float]
    token_ids: list[int]


def chat_response(request_id: str, model: str, choices: Sequence[Choice], prompt_tokens: int,
                  *, logprobs: bool) -> dict[str, Any]:
    """A ``chat.completion`` object."""
    return {
        "id": request_id, "object": "chat.completion", "created": int(time.time()),
        "model": model,
        "choices": [{"index": i, "message": c.message, "finish_reason": c.finish_reason,
                     "logprobs": _logprobs(c.tokens, c.logprobs) if logprobs else None}
                    for i, c in enumerate(choices)],
        "usage": _usage(prompt_tokens, sum(len(c.token_ids) for c in choices)),
    }


def chat_chunk(request_id: str, model: str, index: int, delta: Mapping[str, Any], *,
               finish_reason: str | None = None, logprobs: dict[str, Any] | None = None,
               usage: tuple[int, int] | None = None) -> dict[str, Any]:
    """A ``chat.completion.chunk`` object (``usage`` given: the final usage-only chunk)."""
    chunk: dict[str, Any] = {"id": request_id, "object": "chat.completion.chunk",
                             "created": int(time.time()), "model": model}
    if usage is not None:
        chunk["choices"], chunk["usage"] = [], _usage(*usage)
    else:
        chunk["choices"] = [{"index": index, "delta": dict(delta), "logprobs": logprobs,
                             "finish_reason": finish_reason}]
    return chunk


def chunk_logprobs(choice: Choice) -> dict[str, Any]:
    """The ``logprobs`` object of a streamed chunk carrying ``choice``'s whole text."""
    return _logprobs(choice.tokens, choice.logprobs)


def completion_response(request_id: str, model: str, texts: Sequence[tuple[str, str, Choice]],
                        prompt_tokens: int, *, logprobs: bool) -> dict[str, Any]:
    """A ``text_completion`` object; ``texts``: (text, finish reason, choice) per choice."""
    choices = []
    for i, (text, reason, choice) in enumerate(texts):
        lp = None
        if logprobs:
            lp = {"tokens": choice.tokens, "token_logprobs": choice.logprobs,
                  "top_logprobs": None, "text_offset": None}
        choices.append({"index": i, "text": text, "finish_reason": reason, "logprobs": lp,
                        "token_ids": choice.token_ids})
    return {"id": request_id, "object": "text_completion", "created": int(time.time()),
            "model": model, "choices": choices,
            "usage": _usage(prompt_tokens, sum(len(c.token_ids) for _, _, c in texts))}
