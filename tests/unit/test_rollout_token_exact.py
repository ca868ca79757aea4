"""Property: over random multi-turn episodes, a sample's tokens are exactly the prompt, the
engine's sampled ids and the template deltas of the env's replies; the loss mask is 1 exactly on
the sampled ids. Random tool outputs (some too long for the context, so cut), random turn limits,
per-turn length cuts, turns ended by a stop string, garbage tool calls; three chat templates; the
tiny vocabulary and the real Qwen2.5 one."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import agentrl
from agentrl.chat import CHATML_HERMES_TEMPLATE, ChatRenderer
from agentrl.engine.base import Engine, GenerateOutput, SamplingParams
from agentrl.records.sample import Sample, Status
from agentrl.rollout.config import RolloutConfig
from agentrl.rollout.episode import Episode, RolloutContext
from tests.support.tokenizers import qwen25_tokenizer, tiny_tokenizer

pytestmark = pytest.mark.unit

_HERMES_CALL = CHATML_HERMES_TEMPLATE[
    CHATML_HERMES_TEMPLATE.index("{{- '<tool_call>\\n{\"name\": '"):
    CHATML_HERMES_TEMPLATE.index("{{- '}\\n</tool_call>' -}}") + len("{{- '}\\n</tool_call>' -}}")
]
QWEN3_CODER_TEMPLATE = CHATML_HERMES_TEMPLATE.replace(_HERMES_CALL, """
            {{- '<tool_call>\\n<function=' ~ fn.name ~ '>\\n' -}}
            {%- for key, value in fn.arguments.items() -%}
                {{- '<parameter=' ~ key ~ '>\\n' -}}
                {%- if value is string -%}{{- value -}}{%- else -%}{{- value | tojson -}}{%- endif -%}
                {{- '\\n</parameter>\\n' -}}
            {%- endfor -%}
            {{- '</function>\\n</tool_call>' -}}""")
_TOOL_BLOCK = CHATML_HERMES_TEMPLATE[
    CHATML_HERMES_TEMPLATE.index("{%- elif message.role == 'tool' -%}"):
    CHATML_HERMES_TEMPLATE.index("    {%- else -%}\n        {{- '<|im_start|>' ~ message.role")
]
_ASSISTANT_BLOCK = CHATML_HERMES_TEMPLATE[
    CHATML_HERMES_TEMPLATE.index("{{- '<|im_start|>assistant\\n' ~ text -}}"):
    CHATML_HERMES_TEMPLATE.index("{%- elif message.role == 'tool' -%}")
]
MISTRAL_TOOL_ROLE_TEMPLATE = CHATML_HERMES_TEMPLATE.replace(_ASSISTANT_BLOCK, """{{- '<|im_start|>assistant\\n' ~ text -}}
        {%- if message.tool_calls -%}
            {%- set ns = namespace(calls=[]) -%}
            {%- for call in message.tool_calls -%}
                {%- set fn = call.function if call.function is defined else call -%}
                {%- set ns.calls = ns.calls + [{'name': fn.name, 'arguments': fn.arguments}] -%}
            {%- endfor -%}
            {{- '[TOOL_CALLS] ' ~ (ns.calls | tojson) -}}
        {%- endif -%}
        {{- '<|im_end|>\\n' -}}
    """).replace(_TOOL_BLOCK, """{%- elif message.role == 'tool' -%}
        {{- '<|im_start|>tool\\n' ~ text ~ '<|im_end|>\\n' -}}
""")
TEMPLATES = {
    "chatml-hermes": (CHATML_HERMES_TEMPLATE, "hermes"),
    "chatml-qwen3-coder": (QWEN3_CODER_TEMPLATE, "qwen3_coder"),
    "tool-role-mistral": (MISTRAL_TOOL_ROLE_TEMPLATE, "mistral"),
}
VOCABS = {"tiny": tiny_tokenizer, "qwen25": qwen25_tokenizer}


@agentrl.tool
def echo(text: str, repeat: int = 1) -> str:
    """Repeats text.

    Args:
        text: What to repeat.
        repeat: How many times.
    """
    return text * repeat


class EchoEnv(agentrl.ToolEnv):
    tools = [echo]

    def make_prompt(self, task):
        return [{"role": "system", "content": "Use echo."}, {"role": "user", "content": task["q"]}]

    def compute_reward(self, task, final, state):
        return float(len(final["content"]) % 2)


@dataclasses.dataclass
class Turn:
    content: str
    calls: list[dict]
    garbage: bool
    stop_string: bool


class ScriptEngine(Engine):
    """Plays scripted turns: the template's own text for each (or garbage), as token ids."""

    def __init__(self, renderer: ChatRenderer, script: list[Turn], tools) -> None:
        self.renderer, self.script, self.tools = renderer, list(script), tools
        self.eot = renderer.encode(renderer.end_of_turn)
        self.outputs: list[list[int]] = []
        self.texts: list[str] = []

    def text_of(self, turn: Turn) -> str:
        if turn.garbage:
            return turn.content
        message = {"role": "assistant", "content": turn.content, "tool_calls": turn.calls}
        return self.renderer.assistant_text([{"role": "user", "content": "x"}], message, self.tools)

    async def generate(self, input_ids, sampling: SamplingParams, rid=None) -> GenerateOutput:
        turn = self.script.pop(0) if self.script else Turn("done", [], False, False)
        text = self.text_of(turn)
        ids = self.renderer.encode(text) + ([] if turn.stop_string else self.eot)
        finish = "stop"
        if len(ids) > sampling.max_new_tokens:
            ids, finish = ids[: sampling.max_new_tokens], "length"
        self.outputs.append(ids)
        self.texts.append(text)
        return GenerateOutput(ids, [-0.5] * len(ids), finish, "v1", len(input_ids))

    async def update_weights(self, **kw): ...
    async def pause(self, mode="abort"): ...
    async def resume(self): ...
    async def abort(self, rid_prefix=""): return 0
    async def health(self): return True
    @property
    def weight_version(self): return "v1"
    async def close(self): ...


_WORD = st.text(alphabet=st.sampled_from("abcxyzé東🚀 ,.!"), min_size=1, max_size=12).map(
    lambda s: s.strip() or "w")
_CALL = st.builds(lambda text, repeat: {"name": "echo", "arguments": {"text": text, "repeat": repeat}},
                  _WORD, st.sampled_from([1, 40, 300, 300]))
_TURN = st.builds(
    Turn,
    content=_WORD,
    calls=st.lists(_CALL, max_size=2),
    garbage=st.sampled_from([False, False, False, True]),
    stop_string=st.sampled_from([False, False, True]),
)


def garbage_text(fmt: str) -> str:
    return {"hermes": "<tool_call>\n{not json\n</tool_call>", "qwen3_coder": "<tool_call>\n<function=",
            "mistral": "[TOOL_CALLS] [{"}[fmt]


@pytest.fixture(scope="module", params=[(t, v) for t in TEMPLATES for v in VOCABS],
                ids=lambda p: f"{p[0]}-{p[1]}")
def renderer(request) -> ChatRenderer:
    template, fmt = TEMPLATES[request.param[0]]
    r = ChatRenderer(VOCABS[request.param[1]](), fmt, chat_template=template,
                     template_name=request.param[0])
    r.self_check(EchoEnv().toolbox.schemas)
    return r


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(script=st.lists(_TURN, min_size=1, max_size=5), max_turns=st.integers(1, 4),
       max_new_tokens=st.sampled_from([8, 400, 400, 400]), context=st.sampled_from([300, 700, 4000]),
       question=_WORD)
def test_tokens_are_prompt_plus_sampled_plus_deltas(renderer, script, max_turns, max_new_tokens, context, question):
    fmt = renderer.tool_call_format.name
    script = [dataclasses.replace(t, content=garbage_text(fmt)) if t.garbage else t for t in script]
    tools = EchoEnv().toolbox.schemas
    engine = ScriptEngine(renderer, script, tools)
    ctx = RolloutContext(RolloutConfig(max_turns=max_turns), engine, renderer, SamplingParams(max_new_tokens=max_new_tokens), context,
                         lambda: EchoEnv(max_turns=max_turns, tool_call_format=fmt))
    episode = Episode(ctx, Sample(group_id=0, metadata={"task": {"q": question}}), "p")
    sample = asyncio.run(episode.run())
    assert sample.status is not Status.FAILED, sample.metadata.get("traceback")
    sample.check()
    event(f"finish={sample.metadata['finish']}")
    event(f"tool outputs cut={sample.metadata.get('tool_outputs_cut', 0) > 0}")
    assert len(sample.loss_mask) == sample.response_length == len(sample.rollout_log_probs)
    assert len(sample.tokens) <= context

    # mask 1 exactly on the engine's ids, in order; 0 elsewhere
    response = sample.tokens[sample.prompt_length :]
    sampled = [t for t, m in zip(response, sample.loss_mask, strict=True) if m == 1]
    assert sampled == [t for ids in engine.outputs for t in ids]
    assert [lp for lp, m in zip(sample.rollout_log_probs, sample.loss_mask, strict=True) if m == 0] == \
        [0.0] * sample.loss_mask.count(0)
    spans = [t for t in sample.turns if t.role == "assistant"]
    assert [response[t.start : t.end] for t in spans] == engine.outputs

    # and the whole sequence is what the chat template renders for the conversation played
    conversation = list(episode.history)
    last_text = engine.texts[-1] if engine.texts else None
    if spans and len([m for m in conversation if m["role"] == "assistant"]) < len(spans):
        conversation.append({"role": "assistant", "content": last_text})  # the final, unparsed turn
    if not spans:  # the prompt alone fills the context: not played, no tokens
        assert sample.status is Status.SKIPPED and sample.metadata["finish"] == "overlong_prompt"
        assert sample.tokens == [] and len(renderer.prompt_ids(conversation, tools)) >= context
    elif sample.metadata["finish"] == "length":
        before_last = conversation[:-1]
        prefix = renderer.prompt_ids(before_last, tools)
        assert sample.tokens[: len(prefix)] == prefix
        assert sample.tokens[len(prefix) :] == engine.outputs[-1]
    else:
        full = renderer.encode(renderer.render_text(conversation, tools))
        assert sample.tokens == full[: len(sample.tokens)]
        ended_by_stop_string = engine.outputs[-1][-len(engine.eot):] != engine.eot
        tail = renderer.tokenizer.decode(full[len(sample.tokens) :])
        assert tail == (renderer.end_of_turn + "\n" if ended_by_stop_string else "\n")
    if any("characters of output cut" in str(m.get("content")) for m in conversation):
        assert sample.metadata["tool_outputs_cut"] >= 1
