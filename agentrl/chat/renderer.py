"""Token-exact rendering of multi-turn conversations through a tokenizer's chat template."""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping, Sequence
from typing import Any

import jinja2

from agentrl.chat.templates import fitting_template, renders_tool_calls
from agentrl.errors import ChatTemplateError, ToolCallParseError
from agentrl.tools.calls import ToolCall
from agentrl.tools.formats import ToolCallFormat, get_format

__all__ = ["ChatRenderer"]

Message = Mapping[str, Any]
Tools = Sequence[Mapping[str, Any]] | None

_FIX_HINT = "Fix: use a template rendering history identically, or a matching --tool-call-format."
_FORMAT_HINT = "Fix: pass the --tool-call-format matching the template, or a matching template."


def _normalize_call(call: Any) -> dict[str, Any]:
    """One tool call (ours, a ToolCall, or OpenAI's) in the OpenAI form, arguments as a dict."""
    if isinstance(call, ToolCall):
        return call.to_message_dict()
    fn = call.get("function", call) if isinstance(call, Mapping) else None
    if not isinstance(fn, Mapping) or "name" not in fn:
        raise ValueError(f"not a tool call: {call!r}")
    arguments = fn.get("arguments")
    if isinstance(arguments, str):  # OpenAI form: a JSON string
        try:
            decoded = json.loads(arguments)
            arguments = decoded if isinstance(decoded, dict) else arguments
        except ValueError:
            pass
    out = {"type": "function", "function": {"name": fn["name"], "arguments": arguments or {}}}
    return out if call.get("id") is None else {**out, "id": call["id"]}


def _sample_conversation(tools: Tools) -> list[dict[str, Any]]:
    """The self-check conversation; it calls the first tools in ``tools`` with tricky arguments."""
    names = [t.get("function", t).get("name") for t in tools or ()] or ["search_docs", "read_file"]
    first, second = names[0], names[min(1, len(names) - 1)]
    deep = [1, 2.5, True, None, {"tags": ['quo"te', "back\\slash"]}]
    calls = [
        ToolCall(first, {"query": "naïve café — 東京 🚀", "options": {"limit": 3, "deep": deep}}),
        ToolCall(second, {"path": "/tmp/ünïcödé.txt", "lines": [1, 2], "flags": {}}),
    ]
    return [
        {"role": "system", "content": "You are a careful assistant. Use tools when useful."},
        {"role": "user", "content": "Find the café notes from Tōkyō, then read the file."},
        {"role": "assistant", "content": "Let me check both.", "tool_calls": calls},
        {"role": "tool", "name": first, "content": '{"hits": ["Ünïcode ✓", 42]}'},
        {"role": "tool", "name": second, "content": "line 1\nline 2 — done"},
        {"role": "assistant", "content": "Found 1 hit; the file has 2 lines."},
        {"role": "user", "content": "Thanks! And in one word?"},
        {"role": "assistant", "content": "Done."},
    ]


class ChatRenderer:
    """Renders conversations with a chat template and yields token-exact environment deltas.

    Args:
        tokenizer: A Hugging Face tokenizer with ``apply_chat_template``.
        tool_call_format: A registry name (see :func:`agentrl.tools.formats.get_format`) or a
            :class:`ToolCallFormat`: the format the template writes assistant tool calls in.
        chat_template: A Jinja template to use instead of the tokenizer's own.
        end_of_turn: The token ending an assistant turn (e.g. ``<|im_end|>``); read off the
            template when omitted.
        template_name: Name for error messages; defaults to ``tokenizer.name_or_path``, or
            ``"custom template"`` when ``chat_template`` is given.

    Raises:
        ChatTemplateError: Neither the tokenizer nor ``chat_template`` provides a template.
    """

    def __init__(
        self, tokenizer: Any, tool_call_format: str | ToolCallFormat = "hermes", *,
        chat_template: str | None = None, end_of_turn: str | None = None,
        template_name: str | None = None,
    ) -> None:
        self.tokenizer = tokenizer
        fmt = tool_call_format
        self.tool_call_format = get_format(fmt) if isinstance(fmt, str) else fmt
        self.chat_template = chat_template
        path = getattr(tokenizer, "name_or_path", "")
        default_name = path if path and chat_template is None else "custom template"
        self.template_name = template_name or default_name
        if not (chat_template or getattr(tokenizer, "chat_template", None)):
            msg = "the tokenizer has no chat template; pass chat_template=..."
            raise ChatTemplateError(f"{self.template_name}: {msg}")
        self._end_of_turn = end_of_turn

    @staticmethod
    def normalize_messages(messages: Sequence[Message]) -> list[dict[str, Any]]:
        """Copies ``messages`` into the Hugging Face chat-template form.

        Tool calls (our ``{"name", "arguments"}``, :class:`ToolCall` or OpenAI form) become
        OpenAI-form dicts with dict ``arguments``; ``None`` content becomes ``""``.

        Raises:
            ValueError: A message without a role, or a tool call without a name.
        """
        out = []
        for i, message in enumerate(messages):
            if not isinstance(message, Mapping) or "role" not in message:
                raise ValueError(f"message {i} has no role: {message!r}")
            msg = dict(message)
            if msg.get("content") is None:
                msg["content"] = ""
            calls = msg.pop("tool_calls", None)
            if calls:
                msg["tool_calls"] = [_normalize_call(call) for call in calls]
            out.append(msg)
        return out

    def render_text(
        self, messages: Sequence[Message], tools: Tools = None, add_generation_prompt: bool = False
    ) -> str:
        """The template's text for ``messages`` (plus the generation prompt if asked).

        Raises:
            ChatTemplateError: The template failed to render.
        """
        extra = {} if self.chat_template is None else {"chat_template": self.chat_template}
        try:
            return self.tokenizer.apply_chat_template(
                self.normalize_messages(messages), tools=list(tools) if tools else None,
                add_generation_prompt=add_generation_prompt, tokenize=False, **extra,
            )
        except jinja2.TemplateError as exc:
            raise ChatTemplateError(f"{self.template_name}: rendering failed: {exc}") from exc

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text``, without BOS/EOS or other added special tokens."""
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def prompt_ids(self, messages: Sequence[Message], tools: Tools = None) -> list[int]:
        """Token ids of the first prompt: ``messages`` rendered with the generation prompt."""
        return self.encode(self.render_text(messages, tools, add_generation_prompt=True))

    @property
    def end_of_turn(self) -> str:
        """The token ending an assistant turn: as given, else read off the template."""
        if self._end_of_turn is None:
            probe = "agentrl end-of-turn probe"
            chat = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": probe}]
            tail = self.render_text(chat).rpartition(probe)[2]
            ids = self.encode(tail)
            first = self.tokenizer.convert_ids_to_tokens(ids[0]) if ids else None
            eos = getattr(self.tokenizer, "eos_token", None)
            if first in self.tokenizer.get_added_vocab() and tail.startswith(first):
                self._end_of_turn = first
            elif eos and eos in tail:
                self._end_of_turn = eos
            else:
                msg = f"no end-of-turn token in {tail!r} after an assistant message"
                raise ChatTemplateError(f"{self.template_name}: {msg}; pass end_of_turn=...")
        return self._end_of_turn

    def assistant_text(
        self, history: Sequence[Message], message: Message, tools: Tools = None
    ) -> str:
        """What the template writes for ``message`` (after ``history``) between the generation
        prompt and the end-of-turn token: the text an engine would generate for that turn.

        Raises:
            ChatTemplateError: The generation prompt is not a prefix of the rendered turn.
        """
        return self._assistant_text(history, message, tools, "assistant turn")

    def env_delta_ids(
        self, history: Sequence[Message], new_messages: Sequence[Message], tools: Tools = None
    ) -> list[int]:
        """Tokens to append after the engine's assistant turn (ending with the end-of-turn token)
        so the sequence continues with ``new_messages`` and the next generation prompt. Only the
        appended text is tokenized, never the history.

        Args:
            history: The conversation so far, ending with the assistant message just generated.
            new_messages: The environment's reply: tool and/or user messages.
            tools: The tool schemas given to the template.

        Raises:
            ValueError: ``history`` does not end with an assistant message.
            ChatTemplateError: ``history`` renders differently once ``new_messages`` follow.
        """
        return self.encode(self._env_delta_text(history, new_messages, tools, "env turn"))

    def _assistant_text(self, history, message, tools: Tools, step: str) -> str:
        prompt = self.render_text(history, tools, add_generation_prompt=True)
        full = self.render_text([*history, message], tools)
        if not full.startswith(prompt):
            what = "the generation prompt is not a prefix of the rendered assistant turn"
            labels = ("the generation prompt", "the rendered assistant turn")
            raise self._mismatch(step, self.encode(full), self.encode(prompt), what, labels)
        return self._split_at_end_of_turn(full[len(prompt) :], step)[0]

    def _split_at_end_of_turn(self, text: str, step: str) -> tuple[str, str]:
        """``text`` cut around its last end-of-turn token: (before, after)."""
        before, eot, after = text.rpartition(self.end_of_turn)
        if not eot:
            msg = f"no {self.end_of_turn!r} ends the assistant turn at step {step!r}"
            raise ChatTemplateError(f"{self.template_name}: {msg}; pass end_of_turn=...")
        return before, after

    def _env_delta_text(self, history, new_messages, tools: Tools, step: str) -> str:
        if not history or history[-1].get("role") != "assistant":
            raise ValueError("history must end with the assistant message the engine generated")
        before = self.render_text(history, tools)
        after = self.render_text([*history, *new_messages], tools, add_generation_prompt=True)
        if not after.startswith(before):
            what = "rendering the history is not a text prefix of rendering it with new messages"
            labels = ("the history alone", "history + new messages")
            raise self._mismatch(step, self.encode(after), self.encode(before), what, labels)
        return self._split_at_end_of_turn(before, step)[1] + after[len(before) :]

    def _no_tool_calls_message(self) -> str:
        """Why a template that drops tool calls cannot be trained on, and the flag that fixes it."""
        fits = fitting_template(self.tokenizer)
        if fits is not None:
            fix = (f"pass --chat-template {fits.name} (built in: {fits.description}; it fits this "
                   f"tokenizer's {' / '.join(fits.special_tokens)} tokens"
                   + (f", with --tool-call-format {fits.tool_call_format}"
                      if fits.tool_call_format != self.tool_call_format.name else "")
                   + "), or --chat-template FILE with a Jinja template that renders tool_calls")
        else:
            fix = ("pass --chat-template FILE with a Jinja template that renders an assistant "
                   "message's tool_calls (no built-in template fits this tokenizer's special "
                   "tokens)")
        return (f"chat template {self.template_name!r} renders no tool calls: an assistant turn "
                "that calls a tool comes out without the call, so the model could never be "
                f"trained to make one. Fix: {fix}")

    def _mismatch(
        self, step: str, expected: Sequence[int], got: Sequence[int], what: str,
        labels: tuple[str, str] = ("the token-in/token-out sequence", "the full render"),
    ) -> ChatTemplateError:
        """The error for a token sequence ``got`` that should equal ``expected``."""
        pairs = enumerate(zip(expected, got, strict=False))
        index = next((i for i, (a, b) in pairs if a != b), min(len(expected), len(got)))

        def show(ids: Sequence[int]) -> str:
            if index >= len(ids):
                return "<end of sequence>"
            return f"{self.tokenizer.decode([ids[index]])!r} (id {ids[index]})"

        context = self.tokenizer.decode(list(expected[max(0, index - 8) : index]))
        return ChatTemplateError(
            f"chat template {self.template_name!r} is not prefix-stable at step {step!r}: {what}. "
            f"First differing token at index {index} (after {context!r}): {labels[0]} has "
            f"{show(got)}, {labels[1]} has {show(expected)}. {_FIX_HINT}"
        )

    def self_check(self, tools: Tools = None) -> None:
        """Checks that this (tokenizer, template, tool-call format) triple is token-exact.

        (a) Two tool calls with nested, unicode arguments, rendered by the template, parse back
        to the same calls. (b) Along a sample conversation (system, user, assistant with calls,
        tool replies, answer, user, answer), each history renders as a text prefix of the longer
        conversation, and prompt ids + engine-like assistant ids (the template's assistant text
        and the end-of-turn token) + :meth:`env_delta_ids` equal the full render's tokens.

        Args:
            tools: The tool schemas the environment will pass to the template.

        Raises:
            ChatTemplateError: A check failed; the message names the template, the step, the first
                differing token (decoded, on both sides) and a fix.
        """
        conversation = _sample_conversation(tools)
        self._check_tool_calls(conversation[:2], conversation[2], tools)
        starts = [i for i, m in enumerate(conversation) if m["role"] == "assistant"]
        ids = self.prompt_ids(conversation[: starts[0]], tools)
        eot_ids = self.encode(self.end_of_turn)
        for turn, at in enumerate(starts, start=1):
            step = f"assistant turn {turn}"
            text = self._assistant_text(conversation[:at], conversation[at], tools, step)
            ids += self.encode(text) + eot_ids
            end = starts[turn] if turn < len(starts) else len(conversation)
            history, new = conversation[: at + 1], conversation[at + 1 : end]
            if new:
                step = f"after assistant turn {turn}: + {', '.join(m['role'] for m in new)}"
                ids += self.encode(self._env_delta_text(history, new, tools, step))
                expected = self.prompt_ids(conversation[:end], tools)
            else:
                full = self.render_text(conversation, tools)
                ids += self.encode(self._split_at_end_of_turn(full, step)[1])
                expected = self.encode(full)
            if ids != expected:
                what = "appending messages changed the tokens of the history"
                raise self._mismatch(step, expected, ids, what)

    def _check_tool_calls(self, history, message: dict[str, Any], tools: Tools) -> None:
        if not renders_tool_calls(self.tokenizer, self.chat_template):
            raise ChatTemplateError(self._no_tool_calls_message())
        step = "assistant turn with 2 tool calls"
        text = self._assistant_text(history, message, tools, step)
        fmt = self.tool_call_format.name
        where = f"what chat template {self.template_name!r} renders for an {step} ({text[:400]!r})"
        try:
            parsed = self.tool_call_format.parse(text)
        except ToolCallParseError as exc:
            msg = f"the {fmt!r} tool-call format cannot parse {where}: {exc}. {_FORMAT_HINT}"
            raise ChatTemplateError(msg) from exc

        dump = functools.partial(json.dumps, sort_keys=True, ensure_ascii=False)
        got = [(c.name, dump(c.arguments)) for c in parsed.tool_calls]
        want = [(c.name, dump(c.arguments)) for c in message["tool_calls"]]
        if got != want:
            raise ChatTemplateError(
                f"the {fmt!r} tool-call format reads {len(got)} call(s) {got!r} from {where}; "
                f"expected {want!r}. {_FORMAT_HINT}"
            )
