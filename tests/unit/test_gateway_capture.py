"""Gateway sessions capture agents' calls token for token (agentrl.gateway.session).

The property: random agents (that extend their conversation, retry a call, or rewrite their
history anywhere: a message edited, removed or inserted, a reply's whitespace stripped, an older
tool output cut, the history summarized, the system prompt changed) across three chat templates
and the real Qwen2.5 vocabulary; in every sample a session gives, each trained token is a token
the engine sampled, with the log-probability it was sampled with, each generated turn is
preceded by exactly the ids the engine was given, and every reply the engine produced is either
in a trained sample or counted as dropped.
"""

from __future__ import annotations

import asyncio
import json
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agentrl.chat import ChatRenderer
from agentrl.engine.base import GenerateOutput, SamplingParams
from agentrl.gateway.protocol import APIError, parse_chat_request
from agentrl.gateway.session import Session
from agentrl.records.sample import Sample
from tests.support.tokenizers import qwen25_tokenizer
from tests.unit.test_rollout_token_exact import TEMPLATES, EchoEnv, ScriptEngine

pytestmark = pytest.mark.unit

TOOLS = EchoEnv().toolbox.schemas


class RandomTurns(ScriptEngine):
    """Answers with a random kind of turn (text, the format's tool calls, or broken markup),
    random log-probs, and remembers every output."""

    def __init__(self, renderer: ChatRenderer, seed: int) -> None:
        super().__init__(renderer, [], TOOLS)
        self.rng = random.Random(seed)
        self.outputs: list[tuple[list[int], list[float]]] = []
        self.prompts: list[list[int]] = []

    def _text(self) -> str:
        kind = self.rng.choice(["text", "calls", "calls", "garbage"])
        words = " ".join(self.rng.choice(["alpha", "béta", "東京", "🚀", "x=1"]) for _ in range(3))
        if kind == "text":
            return words
        if kind == "garbage":
            return {"hermes": "<tool_call>\n{oops", "qwen3_coder": "<tool_call>\n<function=",
                    "mistral": "[TOOL_CALLS] [{"}[self.renderer.tool_call_format.name]
        calls = [{"name": "echo", "arguments": {"text": words, "repeat": self.rng.randint(1, 3)}}
                 for _ in range(self.rng.randint(1, 2))]
        message = {"role": "assistant", "content": words, "tool_calls": calls}
        return self.renderer.assistant_text([{"role": "user", "content": "q"}], message, TOOLS)

    async def generate(self, input_ids, sampling: SamplingParams, rid=None) -> GenerateOutput:
        self.prompts.append(list(input_ids))
        ids = self.renderer.encode(self._text()) + self.eot
        finish = "stop"
        if len(ids) > sampling.max_new_tokens:
            ids, finish = ids[: sampling.max_new_tokens], "length"
        logprobs = [-self.rng.random() * 5 for _ in ids]
        self.outputs.append((ids, logprobs))
        return GenerateOutput(ids, logprobs, finish, "v7", len(input_ids))


@pytest.fixture(scope="module", params=list(TEMPLATES))
def renderer(request) -> ChatRenderer:
    template, fmt = TEMPLATES[request.param]
    r = ChatRenderer(qwen25_tokenizer(), fmt, chat_template=template, template_name=request.param)
    r.self_check(TOOLS)
    return r


def _request(messages, **extra):
    return parse_chat_request({"model": "m", "messages": messages, "tools": TOOLS, **extra})


def _reply_for(message: dict, rng: random.Random) -> list[dict]:
    calls = message.get("tool_calls") or []
    if calls:
        return [{"role": "tool", "tool_call_id": c["id"], "content": f"echo {i} ✓"}
                for i, c in enumerate(calls)]
    return [{"role": "user", "content": rng.choice(["go on", "and then?", "ok — more"])}]


ACTIONS = st.lists(st.sampled_from(["extend", "extend", "extend", "retry", "truncate", "new_system",
                                    "edit", "remove", "insert", "strip", "cut_tool"]),
                   min_size=1, max_size=8)


def _rewritten(messages: list[dict], action: str, rng: random.Random) -> list[dict]:
    """``messages`` changed by ``action`` at a random position after the first message."""
    messages = json.loads(json.dumps(messages))
    at = rng.randrange(1, len(messages))
    if action == "edit":
        messages[at]["content"] = f"{messages[at].get('content') or ''} (edited)"
    elif action == "remove" and len(messages) > 2:
        del messages[at]
    elif action == "insert":
        messages.insert(at, {"role": "user", "content": "An aside."})
    elif action == "strip":
        for message in messages[at:]:
            if message["role"] == "assistant":
                message["content"] = f"  {message.get('content') or ''}  ".strip() + " "
                break
    elif action == "cut_tool":
        for message in messages[at:]:
            if message["role"] == "tool":
                message["content"] = message["content"][:3]
                break
    return messages


def _replies(samples: list[Sample]) -> set[tuple[tuple[int, ...], tuple[float, ...]]]:
    """The (ids, log-probs) of every assistant turn trained in ``samples``."""
    out = set()
    for sample in samples:
        response = sample.tokens[sample.prompt_length:]
        for turn in sample.turns:
            if turn.role == "assistant":
                out.add((tuple(response[turn.start:turn.end]),
                         tuple(sample.rollout_log_probs[turn.start:turn.end])))
    return out


@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(actions=ACTIONS, seed=st.integers(0, 10_000), max_new_tokens=st.sampled_from([6, 200, 200]),
       n=st.sampled_from([1, 1, 2]))
def test_every_trained_token_is_a_sampled_token_with_its_logprob(renderer, actions, seed,
                                                                  max_new_tokens, n):
    engine = RandomTurns(renderer, seed)
    session = Session("k", engine, renderer, SamplingParams(max_new_tokens=max_new_tokens), 6000,
                      rid="r0-g0-s0")
    rng = random.Random(seed)
    messages = [{"role": "system", "content": "Use echo."}, {"role": "user", "content": "Begin."}]

    async def play():
        nonlocal messages
        rewrites = 0
        choices, _ = await session.chat(_request(messages, n=n))
        for action in actions:
            if action == "retry":
                choices, _ = await session.chat(_request(messages, n=n))
                continue
            if action == "extend":
                pick = rng.randrange(len(choices))  # the agent follows any of the choices
                reply = choices[pick].message
                messages = [*messages, json.loads(json.dumps(reply)), *_reply_for(reply, rng)]
            elif action == "truncate" and len(messages) > 3:
                messages = [*messages[:2], {"role": "user", "content": "Summary: done so far."}]
                rewrites += 1
            elif action == "new_system":
                messages = [{"role": "system", "content": f"Another system prompt {rng.random()}"},
                            *messages[1:]]
                rewrites += 1
            else:
                messages = _rewritten(messages, action, rng)
                rewrites += 1
            choices, _ = await session.chat(_request(messages, n=n))
        return rewrites

    rewrites = asyncio.run(play())
    samples = session.samples(Sample(group_id=3, index=1), "all")
    assert len(session.segments) <= rewrites + 1
    # every reply the engine produced is trained or counted as dropped, in both modes
    produced = {(tuple(ids), tuple(lps)) for ids, lps in engine.outputs}
    for mode in ("all", "last"):
        kept = _replies(session.samples(Sample(group_id=3), mode))
        stats = session.stats(mode)
        assert stats["replies"] == len(engine.outputs) == len(produced)
        assert stats["dropped_replies"] == len(produced - kept)
        assert stats["segments"] == len(session.segments) and stats["rewrites"] == len(session.segments) - 1
    assert samples[-1].metadata["gateway"] == session.stats("all")
    outputs = {(tuple(ids), tuple(lps)) for ids, lps in engine.outputs}
    for sample in samples:
        sample.check()
        assert (sample.group_id, sample.index) == (3, 1)
        response = sample.tokens[sample.prompt_length:]
        for turn in sample.turns:
            ids = response[turn.start:turn.end]
            mask = sample.loss_mask[turn.start:turn.end]
            lps = sample.rollout_log_probs[turn.start:turn.end]
            if turn.role == "assistant":
                assert (tuple(ids), tuple(lps)) in outputs and mask == [1] * len(ids)
                # the engine was given exactly the ids before this turn
                assert sample.tokens[: sample.prompt_length + turn.start] in engine.prompts
            else:
                assert mask == [0] * len(ids) and lps == [0.0] * len(ids)
    last = samples[-1]
    assert last.metadata["segments"][-1]["trained"] and last.metadata["segment"] == len(session.segments) - 1
    reasons = [s["reason"] for s in last.metadata["segments"]]
    assert reasons[0] == "start" and all(r != "start" for r in reasons[1:])
    assert [s.metadata["segment"] for s in session.samples(Sample(group_id=3), "last")] == [
        len(session.segments) - 1]


def test_extending_calls_grow_one_sample_and_rewrites_say_why(renderer):
    engine = RandomTurns(renderer, 1)
    session = Session("k", engine, renderer, SamplingParams(max_new_tokens=200), 6000, rid="e")
    messages = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}]

    async def play():
        nonlocal messages
        choices, _ = await session.chat(_request(messages))
        messages = [*messages, choices[0].message, {"role": "user", "content": "more"}]
        await session.chat(_request(messages))
        await session.chat(_request(messages))  # a retry of the same prompt
        rewritten = [{"role": "system", "content": "S2"}, *messages[1:]]
        choices, _ = await session.chat(_request(rewritten))
        extended = [*rewritten, choices[0].message, {"role": "user", "content": "and?"}]
        await session.chat(_request(extended, tools=None))

    asyncio.run(play())
    assert [c.how for c in session.calls] == ["start", "extends", "repeats", "start", "start"]
    assert [s.reason for s in session.segments] == [
        "start", "history rewritten at messages[0] (system message changed)", "tools changed"]
    first = session.segments[0].final.sample
    assert sum(t.role == "assistant" for t in first.turns) == 2  # the retry replaced the 2nd turn


def test_a_change_after_a_kept_reply_starts_a_segment_and_keeps_the_later_reply(renderer):
    engine = RandomTurns(renderer, 3)
    session = Session("k", engine, renderer, SamplingParams(max_new_tokens=200), 6000, rid="w")
    messages = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}]

    async def play():
        nonlocal messages
        for _ in range(2):  # reply 1 and reply 2, each answered by the user
            choices, _ = await session.chat(_request(messages))
            messages = [*messages, choices[0].message, {"role": "user", "content": "long output " * 5}]
        # the agent cuts the message after reply 1 and asks again: reply 1 is kept, reply 2 is not
        # an unchanged continuation of it any more
        cut = [*messages[:3], {"role": "user", "content": "long"}, *messages[4:]]
        await session.chat(_request(cut))

    asyncio.run(play())
    assert [c.how for c in session.calls] == ["start", "extends", "start"]
    assert session.segments[1].reason == "history rewritten at messages[3] (user message changed)"
    reply2 = (tuple(engine.outputs[1][0]), tuple(engine.outputs[1][1]))
    assert reply2 in _replies(session.samples(Sample(group_id=0), "all"))
    assert reply2 not in _replies(session.samples(Sample(group_id=0), "last"))
    assert session.stats("all") == {"calls": 3, "segments": 2, "rewrites": 1, "replies": 3,
                                    "dropped_replies": 0}
    assert session.stats("last")["dropped_replies"] == 2  # replies 1 and 2: the first segment's


def test_a_prompt_longer_than_the_context_is_refused_and_changes_nothing(renderer):
    session = Session("k", RandomTurns(renderer, 2), renderer, SamplingParams(max_new_tokens=50),
                      200, rid="c")
    with pytest.raises(APIError) as info:
        asyncio.run(session.chat(_request([{"role": "user", "content": "word " * 400}])))
    assert info.value.code == "context_length_exceeded" and info.value.status == 400
    assert session.calls == [] and session.segments == []


def test_a_scripted_model_answers_instead_of_the_engine(renderer):
    engine = RandomTurns(renderer, 4)
    seen = []

    def respond(messages):
        seen.append([m["role"] for m in messages])
        return f"Answer: {len(messages)}"

    session = Session("k", engine, renderer, SamplingParams(max_new_tokens=200), 6000, rid="o",
                      respond=respond)
    messages = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}]
    choices, _ = asyncio.run(session.chat(_request(messages)))
    assert choices[0].message["content"] == "Answer: 2" and seen == [["system", "user"]]
    assert engine.outputs == []  # the engine generated nothing
    [sample] = session.samples(Sample(group_id=0))
    assert sample.rollout_log_probs == [0.0] * sample.response_length and all(sample.loss_mask)
