"""Tests for the tool-call formats in ``agentrl.tools.formats``."""

from __future__ import annotations

import json
import keyword
import math

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from agentrl.errors import ToolCallParseError, ToolCallRenderError
from agentrl.tools.calls import TOOL_NAME_PATTERN, ParsedTurn, ToolCall
from agentrl.tools.formats import (
    FORMATS,
    HermesFormat,
    Llama3JsonFormat,
    MistralFormat,
    PythonicFormat,
    Qwen3CoderFormat,
    ToolCallFormat,
    available_formats,
    get_format,
)

pytestmark = pytest.mark.unit

FORMAT_NAMES = ["hermes", "llama3", "mistral", "qwen3_coder", "pythonic"]
PROPERTY = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# --- strategies ---------------------------------------------------------------------------------

tool_names = st.from_regex(TOOL_NAME_PATTERN, fullmatch=True).filter(TOOL_NAME_PATTERN.fullmatch)
identifiers = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,12}", fullmatch=True).filter(
    lambda s: not keyword.iskeyword(s)
)
dotted_names = (
    st.lists(identifiers, min_size=1, max_size=3).map(".".join).filter(TOOL_NAME_PATTERN.fullmatch)
)
TRICKY = ["<", ">", ";", "]", "[", "{", "}", '"', "'", "\\", "\n", "\r", "\t", " ", "=", "é", "🦙"]
tricky_text = st.text(alphabet=st.sampled_from(TRICKY) | st.characters(), max_size=12)
json_like_strings = st.sampled_from(
    [
        "",
        " ",
        "\n",
        "12",
        " 12 ",
        "null",
        "true",
        "NaN",
        "-Infinity",
        '"q"',
        "[1]",
        "{}",
        "</parameter>",
        "<tool_call>",
        "a < b",
        "x\n",
        "\nx",
        "\n\n",
    ]
)
texts = st.text(max_size=12) | tricky_text | json_like_strings
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | texts,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(identifiers, inner, max_size=3),
    max_leaves=8,
)
arguments = st.dictionaries(identifiers, json_values, max_size=4)

MARKERS = {
    "hermes": ["<tool_call"],
    "qwen3_coder": ["<tool_call"],
    "llama3": ["<|python_tag|>", "{"],
    "mistral": ["[TOOL_CALLS]"],
    "pythonic": ["["],
}
content_text = st.text(max_size=30) | st.lists(
    st.sampled_from(TRICKY + ["<tool", "_call>", "[TOOL", "_CALLS]", "<|python", "_tag|>", "f("]),
    max_size=8,
).map("".join)

FRAGMENTS = [
    "<tool_call>",
    "</tool_call>",
    "<tool_call>\n{",
    "}\n</tool_call>",
    '{"name": "f", ',
    '"arguments": ',
    '"parameters": ',
    '"name": ',
    '"f"',
    "{}",
    "[]",
    "<|python_tag|>",
    "[TOOL_CALLS]",
    "[TOOL_CALLS] [",
    "<function=f>",
    "<function=",
    "<parameter=x>",
    "</parameter>",
    "</function>",
    "[f(",
    "f(",
    "a=",
    "a.b(",
    ")",
    "]",
    "[",
    "{",
    "}",
    ",",
    ";",
    ":",
    '"',
    "'",
    "\\",
    "\n",
    " ",
    "1",
    "1e999",
    "null",
    "NaN",
    "**k",
    "...",
    "b'x'",
    "1j",
    "{1: 2}",
    "set()",
    "([",
    "\x00",
    "é",
]
garbage = st.text() | st.lists(st.sampled_from(FRAGMENTS) | st.text(max_size=4), max_size=20).map(
    "".join
)


def check_turn(turn: ParsedTurn) -> None:
    """A parse result is well formed."""
    assert isinstance(turn, ParsedTurn)
    assert isinstance(turn.content, str)
    assert turn.content == turn.content.strip()
    assert isinstance(turn.tool_calls, tuple)
    for call in turn.tool_calls:
        assert isinstance(call, ToolCall)
        assert TOOL_NAME_PATTERN.fullmatch(call.name)
        assert isinstance(call.arguments, dict)
        assert call.id is None


def parse_errors(fmt: ToolCallFormat, text: str) -> ToolCallParseError:
    """Parses ``text`` expecting a ToolCallParseError; returns it."""
    with pytest.raises(ToolCallParseError) as info:
        fmt.parse(text)
    assert info.value.format_name == fmt.name
    return info.value


# --- registry -------------------------------------------------------------------------------


def test_registry() -> None:
    assert set(FORMAT_NAMES) | {"qwen25"} == set(available_formats()) == set(FORMATS)
    assert available_formats() == sorted(available_formats())
    for name in FORMAT_NAMES:
        fmt = get_format(name)
        assert isinstance(fmt, ToolCallFormat)
        assert fmt.name == name
    assert isinstance(get_format("qwen25"), HermesFormat)


def test_unknown_format_is_a_value_error_listing_names() -> None:
    with pytest.raises(ValueError, match="hermes") as info:
        get_format("nope")
    assert not isinstance(info.value, KeyError)
    assert "pythonic" in str(info.value)


# --- hermes ---------------------------------------------------------------------------------

HERMES = HermesFormat()


def test_hermes_single_call_layout() -> None:
    call = ToolCall("search", {"query": "llamas"})
    text = HERMES.render("", [call])
    assert text == '<tool_call>\n{"name": "search", "arguments": {"query": "llamas"}}\n</tool_call>'
    assert HERMES.parse(text) == ParsedTurn("", (call,))


def test_hermes_content_several_calls_unicode_nested() -> None:
    calls = (
        ToolCall("a", {"xs": [{"k": 1}, {"k": [None, True]}], "s": "日本語 🦙"}),
        ToolCall("b.c-d", {}),
    )
    text = HERMES.render("Thinking…", calls)
    assert text.startswith("Thinking…\n<tool_call>\n")
    assert "日本語 🦙" in text
    assert HERMES.parse(text) == ParsedTurn("Thinking…", calls)


def test_hermes_text_before_between_and_after() -> None:
    text = (
        '  before <tool_call>{"name": "f", "arguments": {}}</tool_call> middle\n'
        '<tool_call>\n  {"name": "g", "parameters": {"x": 1}}  \n</tool_call>\nafter  '
    )
    turn = HERMES.parse(text)
    assert turn.content == "before\nmiddle\nafter"
    assert turn.tool_calls == (ToolCall("f"), ToolCall("g", {"x": 1}))


def test_hermes_lenient_arguments() -> None:
    stringified = '<tool_call>{"name": "f", "arguments": "{\\"a\\": [1, 2]}"}</tool_call>'
    assert HERMES.parse(stringified).tool_calls == (ToolCall("f", {"a": [1, 2]}),)
    missing = '<tool_call>{"name": "f"}</tool_call>'
    assert HERMES.parse(missing).tool_calls == (ToolCall("f", {}),)


def test_hermes_no_markup_is_content() -> None:
    assert HERMES.parse('  just text {"name": 1} </tool_call> ') == ParsedTurn(
        'just text {"name": 1} </tool_call>'
    )


@pytest.mark.parametrize(
    "text",
    [
        '<tool_call>\n{"name": "f", "arguments": {}}',  # unclosed
        "<tool_call>",  # unclosed, empty
        "<tool_call>{'name': 'f'}</tool_call>",  # bad JSON
        '<tool_call>{"name": "f", "arguments": {}</tool_call>',  # truncated JSON
        '<tool_call>{"name": "f", "arguments": [1]}</tool_call>',  # non-dict arguments
        '<tool_call>{"name": "f", "arguments": "[1]"}</tool_call>',  # string, not an object
        '<tool_call>{"name": "f", "arguments": "{nope"}</tool_call>',  # string, not JSON
        '<tool_call>{"name": "bad name", "arguments": {}}</tool_call>',  # bad name
        '<tool_call>{"arguments": {}}</tool_call>',  # no name
        '<tool_call>["f", {}]</tool_call>',  # not an object
        '<tool_call>{"name": "f"} extra</tool_call>',  # text after the JSON
        '<tool_call>{"name": "f"}</tool_call><tool_call>{"name": "g"}',  # second unclosed
        "<tool_call>" + "[" * 100_000 + "</tool_call>",  # too deep
    ],
)
def test_hermes_malformed(text: str) -> None:
    parse_errors(HERMES, text)


# --- llama3 ---------------------------------------------------------------------------------

LLAMA3 = Llama3JsonFormat()


def test_llama3_layout_and_roundtrip() -> None:
    calls = (ToolCall("a", {"q": "x; y"}), ToolCall("b", {"n": [{"m": "ü"}]}))
    text = LLAMA3.render("Checking.", calls)
    assert text == (
        'Checking.<|python_tag|>{"name": "a", "parameters": {"q": "x; y"}}; '
        '{"name": "b", "parameters": {"n": [{"m": "ü"}]}}'
    )
    assert LLAMA3.parse(text) == ParsedTurn("Checking.", calls)
    assert LLAMA3.render("only text", []) == "only text"


def test_llama3_bare_json() -> None:
    one = '  {"name": "f", "parameters": {"s": "a;b"}}\n'
    assert LLAMA3.parse(one) == ParsedTurn("", (ToolCall("f", {"s": "a;b"}),))
    two = '{"name": "f", "arguments": {}};{"name": "g", "parameters": {"x": null}}'
    assert LLAMA3.parse(two).tool_calls == (ToolCall("f"), ToolCall("g", {"x": None}))


@pytest.mark.parametrize(
    "text",
    [
        '{"name": "Bob", "age": 3}',  # JSON, but no parameters: an answer, not a call
        '{"name": "bad name", "parameters": {}}',
        '{"name": "f", "parameters": {}} and then text',
        '{"name": "f", "parameters": [1]}',
        "{not json at all",
        "{}",
    ],
)
def test_llama3_bare_non_calls_are_content(text: str) -> None:
    assert LLAMA3.parse(text) == ParsedTurn(text.strip())


@pytest.mark.parametrize(
    "text",
    [
        "<|python_tag|>",
        "text<|python_tag|>  ; ",
        '<|python_tag|>{"name": "f", "parameters": {}} trailing',
        '<|python_tag|>{"name": "f", "parameters": {}',
        '<|python_tag|>{"name": "f", "parameters": "nope"}',
        '<|python_tag|>{"name": "f", "parameters": 3}',
        '<|python_tag|>{"name": "-f", "parameters": {}}',
        "<|python_tag|>print('hi')",
        '<|python_tag|>{"name": "f"}<|python_tag|>{"name": "g"}',
    ],
)
def test_llama3_malformed(text: str) -> None:
    parse_errors(LLAMA3, text)


# --- mistral --------------------------------------------------------------------------------

MISTRAL = MistralFormat()


def test_mistral_layout_and_roundtrip() -> None:
    calls = (ToolCall("a", {"x": [{"y": "ß"}]}), ToolCall("b", {}))
    text = MISTRAL.render("Sure.", calls)
    assert text == (
        'Sure.[TOOL_CALLS] [{"name": "a", "arguments": {"x": [{"y": "ß"}]}}, '
        '{"name": "b", "arguments": {}}]'
    )
    assert MISTRAL.parse(text) == ParsedTurn("Sure.", calls)


def test_mistral_lenient_forms() -> None:
    assert MISTRAL.parse('[TOOL_CALLS] {"name": "f", "arguments": "{}"}').tool_calls == (
        ToolCall("f"),
    )
    with_id = '[TOOL_CALLS][{"name": "f", "arguments": {"a": 1}, "id": "abc123xyz"}]'
    assert MISTRAL.parse(with_id).tool_calls == (ToolCall("f", {"a": 1}),)
    repeated = '[TOOL_CALLS] [{"name": "f"}] [TOOL_CALLS] [{"name": "g", "parameters": {}}]\n'
    assert MISTRAL.parse(repeated).tool_calls == (ToolCall("f"), ToolCall("g"))
    assert MISTRAL.parse("[TOOL_CALLS] []") == ParsedTurn("")
    assert MISTRAL.parse(" [TOOL CALLS] [] ") == ParsedTurn("[TOOL CALLS] []")


@pytest.mark.parametrize(
    "text",
    [
        "[TOOL_CALLS]",
        "[TOOL_CALLS] [{'name': 'f'}]",
        '[TOOL_CALLS] [{"name": "f", "arguments": {}}',
        '[TOOL_CALLS] [{"name": "f", "arguments": {}}] and more',
        '[TOOL_CALLS] [{"name": "f", "arguments": [1]}]',
        '[TOOL_CALLS] [{"name": "f f", "arguments": {}}]',
        "[TOOL_CALLS] [1, 2]",
        '[TOOL_CALLS] "f"',
    ],
)
def test_mistral_malformed(text: str) -> None:
    parse_errors(MISTRAL, text)


# --- qwen3_coder ----------------------------------------------------------------------------

QWEN3 = Qwen3CoderFormat()


def test_qwen3_coder_layout() -> None:
    call = ToolCall("search", {"query": "llamas", "n": 3, "q": "12", "tag": "<b>"})
    text = QWEN3.render("", [call])
    assert text == (
        "<tool_call>\n<function=search>\n"
        "<parameter=query>\nllamas\n</parameter>\n"
        "<parameter=n>\n3\n</parameter>\n"
        '<parameter=q>\n"12"\n</parameter>\n'
        '<parameter=tag>\n"\\u003cb>"\n</parameter>\n'
        "</function>\n</tool_call>"
    )
    assert QWEN3.parse(text) == ParsedTurn("", (call,))


def test_qwen3_coder_model_written_values() -> None:
    text = (
        "I'll edit it.\n<tool_call>\n<function=write_file>\n<parameter=path>\n/tmp/a.py\n"
        "</parameter>\n<parameter=code>\nif a < b:\n    print('x')\n\n</parameter>\n"
        '<parameter=opts>\n{"dry": true, "n": [1, 2]}\n</parameter>\n</function>\n'
        "</tool_call>\nDone?"
    )
    turn = QWEN3.parse(text)
    assert turn.content == "I'll edit it.\nDone?"
    assert turn.tool_calls == (
        ToolCall(
            "write_file",
            {
                "path": "/tmp/a.py",
                "code": "if a < b:\n    print('x')\n",
                "opts": {"dry": True, "n": [1, 2]},
            },
        ),
    )


def test_qwen3_coder_several_calls_and_empty_arguments() -> None:
    calls = (ToolCall("a.b", {}), ToolCall("c", {"v": ["日本", {"k": None}], "e": ""}))
    text = QWEN3.render("Plan:", calls)
    assert QWEN3.parse(text) == ParsedTurn("Plan:", calls)


@pytest.mark.parametrize("key", ["a>b", "a<b", "a=b", "a\nb", "a\rb"])
def test_qwen3_coder_unrenderable_keys(key: str) -> None:
    with pytest.raises(ToolCallRenderError):
        QWEN3.render("", [ToolCall("f", {key: 1})])


@pytest.mark.parametrize(
    "text",
    [
        "<tool_call>",
        "<tool_call>\n<function=f>\n",
        "<tool_call>\n<function=f>\n<parameter=a>\n1\n",
        "<tool_call>\n<function=f>\n<parameter=a>\n1\n</parameter>\n</tool_call>",
        "<tool_call>\n<function=f>\n</function>\n",
        "<tool_call>\n<function=bad name>\n</function>\n</tool_call>",
        "<tool_call>\n<function=f>\ntext\n</function>\n</tool_call>",
        '<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>',
    ],
)
def test_qwen3_coder_malformed(text: str) -> None:
    parse_errors(QWEN3, text)


# --- pythonic -------------------------------------------------------------------------------

PYTHONIC = PythonicFormat()


def test_pythonic_layout_and_roundtrip() -> None:
    calls = (
        ToolCall("get_weather", {"city": "Zürich", "days": 3, "x": -1.5, "ok": None}),
        ToolCall("geo.lookup", {"items": [{"a": [True, False]}], "s": 'it\'s "q"\n'}),
        ToolCall("now", {}),
    )
    text = PYTHONIC.render("Let me check.", calls)
    assert text.startswith("Let me check.\n[get_weather(city='Zürich', days=3, x=-1.5, ok=None), ")
    assert text.endswith(", now()]")
    assert PYTHONIC.parse(text) == ParsedTurn("Let me check.", calls)
    assert PYTHONIC.parse(text + "\n  ") == ParsedTurn("Let me check.", calls)


def test_pythonic_model_written() -> None:
    text = 'Sure [not a call] then [a.b(x=(1, 2), y={"k": "v"}, z="[f(")]'
    turn = PYTHONIC.parse(text)
    assert turn == ParsedTurn(
        "Sure [not a call] then", (ToolCall("a.b", {"x": [1, 2], "y": {"k": "v"}, "z": "[f("}),)
    )
    assert PYTHONIC.parse("see [f(] first\n[g()]").tool_calls == (ToolCall("g"),)
    assert PYTHONIC.parse("a list [1, 2] and (x)") == ParsedTurn("a list [1, 2] and (x)")


@pytest.mark.parametrize(
    "text",
    [
        "[f(a=1)] and then text",
        "[f(1)]",
        "[f(a=g())]",
        "[f(a=x)]",
        "[f(**k)]",
        "[f(a=1, a=2)]",
        "[f(a={1: 2})]",
        "[f(a=b'x')]",
        "[f(a=1j)]",
        "[f(a=1e999)]",
        "[f(a=set())]",
        "[f(a=1), 3]",
        "[f(a=1)](x=2)]",
        "[f(a=1)",
        "[f().g()]",
        "[f(a=" + "[" * 100_000 + "]",
        "[f(a=" + "[" * 200 + "]" * 200 + ")]",
        "[f(a=" + "1" * 10_000 + ")]",
        "[f(a='\x00')]",
    ],
)
def test_pythonic_malformed(text: str) -> None:
    parse_errors(PYTHONIC, text)


@pytest.mark.parametrize(
    "call",
    [
        ToolCall("has-dash", {}),
        ToolCall("class.method", {}),
        ToolCall("a..b", {}),
        ToolCall("f", {"class": 1}),
        ToolCall("f", {"not an identifier": 1}),
        ToolCall("f", {"ﬁ": 1}),  # NFKC-normalises to "fi" when parsed
        ToolCall("f", {"a": {1: 2}}),
        ToolCall("f", {"a": float("inf")}),
        ToolCall("f", {"a": object()}),
    ],
)
def test_pythonic_unrenderable(call: ToolCall) -> None:
    with pytest.raises(ToolCallRenderError):
        PYTHONIC.render("", [call])


# --- shared render errors -------------------------------------------------------------------


@pytest.mark.parametrize("format_name", FORMAT_NAMES)
@pytest.mark.parametrize(
    "call",
    [
        ToolCall("bad name", {}),
        ToolCall("", {}),
        ToolCall("f\n", {}),
        ToolCall("f", {"a": float("nan")}),
        ToolCall("f", {"a": {2: "int key"}}),
        ToolCall("f", {"a": {1, 2}}),
        ToolCall("f", [1]),  # type: ignore[arg-type]
    ],
)
def test_render_errors(format_name: str, call: ToolCall) -> None:
    with pytest.raises(ToolCallRenderError):
        get_format(format_name).render("text", [call])


@pytest.mark.parametrize("format_name", FORMAT_NAMES)
def test_no_calls_renders_content_only(format_name: str) -> None:
    fmt = get_format(format_name)
    assert fmt.render("hello", []) == "hello"
    assert fmt.parse(" hello \n") == ParsedTurn("hello")
    assert fmt.parse("") == ParsedTurn("")


# --- properties -----------------------------------------------------------------------------


def _calls(names: st.SearchStrategy[str]) -> st.SearchStrategy[list[ToolCall]]:
    return st.lists(st.builds(ToolCall, names, arguments), max_size=3)


@pytest.mark.parametrize("format_name", FORMAT_NAMES)
@PROPERTY
@given(data=st.data())
def test_render_parse_roundtrip(format_name: str, data: st.DataObject) -> None:
    fmt = get_format(format_name)
    names = dotted_names if format_name == "pythonic" else tool_names
    calls = data.draw(_calls(names), label="calls")
    content = data.draw(content_text, label="content")
    assume(not any(marker in content for marker in MARKERS[format_name]))
    turn = fmt.parse(fmt.render(content, calls))
    assert turn.content == content.strip()
    assert turn.tool_calls == tuple(calls)
    for got, want in zip(turn.tool_calls, calls, strict=True):
        assert json.dumps(got.arguments) == json.dumps(want.arguments)  # same types, order


@pytest.mark.parametrize("format_name", ["hermes", "llama3", "mistral", "qwen3_coder"])
@PROPERTY
@given(data=st.data())
def test_roundtrip_with_arbitrary_keys(format_name: str, data: st.DataObject) -> None:
    fmt = get_format(format_name)
    keys = st.text(max_size=8)
    if format_name == "qwen3_coder":
        keys = keys.filter(lambda k: not any(c in k for c in "<>=\n\r"))
    args = data.draw(st.dictionaries(keys, json_values, max_size=4), label="arguments")
    call = ToolCall(data.draw(tool_names, label="name"), args)
    assert fmt.parse(fmt.render("", [call])).tool_calls == (call,)


@pytest.mark.parametrize("format_name", FORMAT_NAMES)
@PROPERTY
@given(text=garbage)
def test_parse_garbage_raises_only_parse_errors(format_name: str, text: str) -> None:
    fmt = get_format(format_name)
    try:
        turn = fmt.parse(text)
    except ToolCallParseError as exc:
        assert exc.format_name == fmt.name
        return
    check_turn(turn)


@pytest.mark.parametrize("format_name", FORMAT_NAMES)
@PROPERTY
@given(
    calls=_calls(dotted_names),
    prefix=st.sampled_from(FRAGMENTS),
    cut=st.integers(min_value=0, max_value=400),
)
def test_parse_truncated_or_prefixed_markup(
    format_name: str, calls: list[ToolCall], prefix: str, cut: int
) -> None:
    """Valid markup cut short or with a stray fragment in front still fails cleanly."""
    fmt = get_format(format_name)
    text = fmt.render("", calls)
    for candidate in (text[:cut], prefix + text, text[:cut] + prefix):
        try:
            check_turn(fmt.parse(candidate))
        except ToolCallParseError:
            pass


def test_floats_roundtrip_exactly() -> None:
    values = [0.1, -0.0, 1e300, 5e-324, 1e16, 123456789.125]
    call = ToolCall("f", {"v": values})
    for name in FORMAT_NAMES:
        [got] = get_format(name).parse(get_format(name).render("", [call])).tool_calls
        assert [math.copysign(1, x) for x in got.arguments["v"]] == [
            math.copysign(1, x) for x in values
        ]
        assert got.arguments["v"] == values
        assert all(type(x) is float for x in got.arguments["v"])
