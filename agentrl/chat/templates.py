"""Chat templates written for agentrl (Jinja, Hugging Face ``apply_chat_template`` dialect).

Every template here is *prefix-stable*: rendering a conversation and then the same conversation
with more messages appended only ever adds text at the end. That is what lets a rollout append
environment turns as token deltas without re-tokenizing (see :mod:`agentrl.chat`).

The templates emit text only through explicit ``{{- ... }}`` expressions, so no template
whitespace leaks into the output whatever the Jinja ``trim_blocks`` / ``lstrip_blocks`` settings.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from agentrl.errors import ConfigError

__all__ = ["BUILTIN_TEMPLATES", "CHATML_HERMES_TEMPLATE", "BuiltinTemplate", "fitting_template",
           "load_chat_template", "renders_tool_calls"]

CHATML_HERMES_TEMPLATE = r"""
{%- if messages and messages[0].role == 'system' -%}
    {%- set system_text = messages[0].content or '' -%}
    {%- set turns = messages[1:] -%}
    {%- set has_system = true -%}
{%- else -%}
    {%- set system_text = '' -%}
    {%- set turns = messages -%}
    {%- set has_system = false -%}
{%- endif -%}
{%- if has_system or tools -%}
    {{- '<|im_start|>system\n' ~ system_text -}}
    {%- if tools -%}
        {%- if system_text -%}
            {{- '\n\n' -}}
        {%- endif -%}
        {{- '# Tools\n\nThe functions below are available to you. Their JSON schemas are listed'
            ' between <tools> and </tools>:\n<tools>' -}}
        {%- for tool in tools -%}
            {{- '\n' ~ (tool | tojson) -}}
        {%- endfor -%}
        {{- '\n</tools>\n\nTo call a function, answer with one block per call, each holding a'
            ' JSON object with the keys "name" and "arguments":\n<tool_call>\n'
            '{"name": "<function name>", "arguments": {<arguments as a JSON object>}}\n'
            '</tool_call>' -}}
    {%- endif -%}
    {{- '<|im_end|>\n' -}}
{%- endif -%}
{%- for message in turns -%}
    {%- set text = message.content or '' -%}
    {%- if message.role == 'assistant' -%}
        {{- '<|im_start|>assistant\n' ~ text -}}
        {%- for call in message.tool_calls or [] -%}
            {%- set fn = call.function if call.function is defined else call -%}
            {%- if text or not loop.first -%}
                {{- '\n' -}}
            {%- endif -%}
            {{- '<tool_call>\n{"name": ' ~ (fn.name | tojson) ~ ', "arguments": ' -}}
            {%- if fn.arguments is string -%}
                {{- fn.arguments -}}
            {%- else -%}
                {{- fn.arguments | tojson -}}
            {%- endif -%}
            {{- '}\n</tool_call>' -}}
        {%- endfor -%}
        {{- '<|im_end|>\n' -}}
    {%- elif message.role == 'tool' -%}
        {%- if loop.first or loop.previtem.role != 'tool' -%}
            {{- '<|im_start|>user' -}}
        {%- endif -%}
        {{- '\n<tool_response>\n' ~ text ~ '\n</tool_response>' -}}
        {%- if loop.last or loop.nextitem.role != 'tool' -%}
            {{- '<|im_end|>\n' -}}
        {%- endif -%}
    {%- else -%}
        {{- '<|im_start|>' ~ message.role ~ '\n' ~ text ~ '<|im_end|>\n' -}}
    {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{- '<|im_start|>assistant\n' -}}
{%- endif -%}
"""
"""ChatML with Hermes-style tool calls, laid out as Qwen2.5 lays them out.

* ``<|im_start|>role\\n...<|im_end|>\\n`` turns; generation prompt ``<|im_start|>assistant\\n``.
* Tool schemas are listed in the system turn inside ``<tools></tools>`` (a system turn is written
  when there is a system message or tools), with instructions to answer in ``<tool_call>`` blocks.
* Assistant tool calls: ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`` blocks
  after the content, one per line (the ``hermes`` tool-call format).
* Consecutive ``tool`` messages form ONE ``user`` turn of ``<tool_response>`` blocks.

A tool-response turn is closed by the message after it, so the template is prefix-stable at every
point a rollout appends messages: after an assistant turn (tool replies and user turns are
appended together with the next generation prompt).
"""


@dataclasses.dataclass(frozen=True)
class BuiltinTemplate:
    """A chat template agentrl ships, usable by name (``--chat-template NAME``).

    Attributes:
        name: The name ``--chat-template`` takes.
        text: The Jinja template.
        tool_call_format: The ``--tool-call-format`` that reads the tool calls it writes.
        special_tokens: Tokens the template writes that a tokenizer must hold as single tokens
            for the template to fit it (the turn markers).
        description: One line for listings and error messages.
    """

    name: str
    text: str
    tool_call_format: str
    special_tokens: tuple[str, ...]
    description: str


BUILTIN_TEMPLATES: Mapping[str, BuiltinTemplate] = {
    t.name: t for t in (
        BuiltinTemplate("chatml-hermes", CHATML_HERMES_TEMPLATE, "hermes",
                        ("<|im_start|>", "<|im_end|>"),
                        "ChatML turns (<|im_start|>role ... <|im_end|>) with Hermes <tool_call> "
                        "blocks, laid out as Qwen2.5 lays them out (SmolLM2, Qwen2, ...)"),
    )
}
"""The built-in templates by name."""


def load_chat_template(value: str) -> tuple[str, str]:
    """The ``(label, Jinja text)`` of ``--chat-template``: a built-in name, or a file holding a
    Jinja template (or a ``tokenizer_config.json`` whose ``chat_template`` it takes).

    Raises:
        ConfigError: Neither a built-in name nor a readable template file; names the flag.
    """
    if value in BUILTIN_TEMPLATES:
        return value, BUILTIN_TEMPLATES[value].text
    path = Path(value).expanduser()
    names = ", ".join(BUILTIN_TEMPLATES)
    if not path.is_file():
        raise ConfigError(f"--chat-template {value}: neither a built-in template ({names}) nor a "
                          "file; give one of those names or the path of a Jinja template")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"--chat-template {value}: cannot read it ({exc})") from exc
    if path.suffix == ".json":  # a tokenizer_config.json: its template
        try:
            text = json.loads(text).get("chat_template")
        except (ValueError, AttributeError) as exc:
            raise ConfigError(f"--chat-template {value}: not a JSON object ({exc})") from exc
        if not isinstance(text, str):
            raise ConfigError(f"--chat-template {value}: has no string 'chat_template' to use")
    if not text.strip():
        raise ConfigError(f"--chat-template {value}: the file is empty")
    return str(path), text


def fitting_template(tokenizer: Any) -> BuiltinTemplate | None:
    """The first built-in template whose turn markers are single tokens of ``tokenizer``
    (so it renders turns the model was trained on), or ``None``."""
    vocab = tokenizer.get_vocab()
    for template in BUILTIN_TEMPLATES.values():
        if all(token in vocab for token in template.special_tokens):
            return template
    return None


def renders_tool_calls(tokenizer: Any, chat_template: str | None = None) -> bool:
    """Whether the template (``chat_template``, else the tokenizer's own) writes an assistant
    turn's tool calls into the text at all: a call's name and an argument value must appear."""
    name, marker = "lookup_weather", "Reykjavik-4711"
    messages = [{"role": "user", "content": "Weather?"},
                {"role": "assistant", "content": "",
                 "tool_calls": [{"type": "function",
                                 "function": {"name": name, "arguments": {"city": marker}}}]}]
    tools = [{"type": "function", "function": {
        "name": name, "description": "Weather of a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]
    try:
        text = tokenizer.apply_chat_template(messages, tools=tools, tokenize=False,
                                             chat_template=chat_template)
    except Exception:  # noqa: BLE001 - a template that cannot render calls does not render them
        return False
    assert isinstance(text, str)
    after_user = text.rpartition("Weather?")[2]
    return name in after_user and marker in after_user
