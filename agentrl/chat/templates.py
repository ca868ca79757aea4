"""Chat templates written for agentrl (Jinja, Hugging Face ``apply_chat_template`` dialect).

Every template here is *prefix-stable*: rendering a conversation and then the same conversation
with more messages appended only ever adds text at the end. That is what lets a rollout append
environment turns as token deltas without re-tokenizing (see :mod:`agentrl.chat`).

The templates emit text only through explicit ``{{- ... }}`` expressions, so no template
whitespace leaks into the output whatever the Jinja ``trim_blocks`` / ``lstrip_blocks`` settings.
"""

from __future__ import annotations

__all__ = ["CHATML_HERMES_TEMPLATE"]

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
