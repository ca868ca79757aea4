"""Built-in chat templates and --chat-template: names, files, the template that fits a
tokenizer, and the error for a model whose own template renders no tool calls."""

from __future__ import annotations

import json
import types
from pathlib import Path

import pytest

from agentrl.chat import CHATML_HERMES_TEMPLATE, ChatRenderer
from agentrl.chat.templates import (
    BUILTIN_TEMPLATES,
    fitting_template,
    load_chat_template,
    renders_tool_calls,
)
from agentrl.errors import ChatTemplateError, ConfigError
from agentrl.rollout.build import renderer_from_config
from agentrl.rollout.config import RolloutConfig
from tests.support.tokenizers import tiny_tokenizer

pytestmark = pytest.mark.unit

# ChatML turns and nothing else, the way SmolLM2-135M-Instruct's own template is written: an
# assistant message's tool_calls never reach the text.
PLAIN_CHATML = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + "
    "(message['content'] or '') + '<|im_end|>\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
TOOLS = [{"type": "function", "function": {
    "name": "calculator", "description": "Evaluates an expression.",
    "parameters": {"type": "object", "properties": {"expression": {"type": "string"}},
                   "required": ["expression"]}}}]


def test_a_template_that_drops_tool_calls_is_refused_naming_the_flag_and_the_fitting_template():
    renderer = ChatRenderer(tiny_tokenizer(), chat_template=PLAIN_CHATML, template_name="smol")
    with pytest.raises(ChatTemplateError) as info:
        renderer.self_check(TOOLS)
    message = str(info.value)
    assert "'smol' renders no tool calls" in message
    assert "--chat-template chatml-hermes" in message and "<|im_start|> / <|im_end|>" in message
    assert "--chat-template FILE" in message


def test_without_a_fitting_builtin_the_error_asks_for_a_template_file():
    renderer = ChatRenderer(tiny_tokenizer(), chat_template=PLAIN_CHATML, template_name="other")
    renderer.tokenizer = types.SimpleNamespace(get_vocab=dict, apply_chat_template=(
        tiny_tokenizer().apply_chat_template))  # a vocabulary without ChatML's turn markers
    message = renderer._no_tool_calls_message()
    assert "no built-in template fits" in message and "--chat-template FILE" in message


def test_renders_tool_calls_tells_the_two_kinds_apart():
    tokenizer = tiny_tokenizer()
    assert renders_tool_calls(tokenizer, CHATML_HERMES_TEMPLATE)
    assert not renders_tool_calls(tokenizer, PLAIN_CHATML)
    assert not renders_tool_calls(tokenizer, "{{ raise_exception('no tools here') }}")


def test_fitting_template_reads_the_turn_markers():
    assert fitting_template(tiny_tokenizer()) is BUILTIN_TEMPLATES["chatml-hermes"]
    assert fitting_template(types.SimpleNamespace(get_vocab=lambda: {"<s>": 1})) is None


def test_the_flag_fixes_it_and_the_renderer_is_token_exact():
    config = RolloutConfig(env="calc", chat_template="chatml-hermes")
    renderer = renderer_from_config(config, _tokenizer_with(PLAIN_CHATML))
    renderer.self_check(TOOLS)  # raises if not token-exact
    assert renderer.template_name == "chatml-hermes"
    own = renderer_from_config(RolloutConfig(env="calc"), _tokenizer_with(PLAIN_CHATML))
    with pytest.raises(ChatTemplateError, match="renders no tool calls"):
        own.self_check(TOOLS)


def _tokenizer_with(template: str):
    tokenizer = tiny_tokenizer().__class__.from_pretrained(tiny_tokenizer().name_or_path)
    tokenizer.chat_template = template
    return tokenizer


def test_load_chat_template_reads_names_jinja_files_and_tokenizer_configs(tmp_path: Path):
    assert load_chat_template("chatml-hermes") == ("chatml-hermes", CHATML_HERMES_TEMPLATE)
    jinja = tmp_path / "t.jinja"
    jinja.write_text(PLAIN_CHATML)
    assert load_chat_template(str(jinja)) == (str(jinja), PLAIN_CHATML)
    config = tmp_path / "tokenizer_config.json"
    config.write_text(json.dumps({"chat_template": PLAIN_CHATML}))
    assert load_chat_template(str(config))[1] == PLAIN_CHATML


@pytest.mark.parametrize("name, content, expected", [
    ("t.jinja", None, "neither a built-in template (chatml-hermes) nor a file"),
    ("t.jinja", "  \n", "the file is empty"),
    ("t.json", '{"bos_token": "<s>"}', "no string 'chat_template'"),
    ("t.json", "[1, 2]", "not a JSON object"),
])
def test_bad_chat_templates_name_the_flag(tmp_path: Path, name, content, expected):
    path = tmp_path / name
    if content is not None:
        path.write_text(content)
    with pytest.raises(ConfigError) as info:
        RolloutConfig(env="calc", chat_template=str(path)).validate()
    assert str(info.value).startswith(f"--chat-template {path}: ") and expected in str(info.value)
