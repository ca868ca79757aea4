"""The episode runner: token-exact samples, statuses, context budget, failures, resume."""

from __future__ import annotations

import asyncio
import json
import re

import pytest

import agentrl
from agentrl.chat import ChatRenderer
from agentrl.engine.base import SamplingParams
from agentrl.env.factory import EnvFactory
from agentrl.records.sample import Sample, Status
from agentrl.records.trajectory import CUT_MARKER
from agentrl.rollout.config import RolloutConfig
from agentrl.rollout.episode import Episode, RolloutContext
from tests.support.engines import ScriptedEngine
from tests.support.tokenizers import tiny_tokenizer

TASK = {"task_id": "t1", "question": "What is 6 * 7 + 1?", "expression": "6 * 7 + 1", "answer": 43}


def calc_policy(text: str, rid: str) -> str:
    """Calls the calculator on the question's expression, then answers with its result."""
    results = re.findall(r"<tool_response>\n(.*?)\n</tool_response>", text, re.S)
    if results:
        return f"The result is {results[-1]}.\nAnswer: {results[-1]}"
    expression = re.findall(r"What is (.*)\?", text)[-1]
    call = {"name": "calculator", "arguments": {"expression": expression}}
    return f"Let me compute.\n<tool_call>\n{json.dumps(call)}\n</tool_call>"


def make_ctx(policy=calc_policy, *, max_context_len=2048, max_new_tokens=256, env="calc",
             env_kwargs=None, engine=None):
    tok = tiny_tokenizer()
    renderer = ChatRenderer(tok, "hermes")
    engine = engine or ScriptedEngine(tok, policy)
    factory = EnvFactory(env, env_kwargs=env_kwargs) if env is not None else None
    sampling = SamplingParams(max_new_tokens=max_new_tokens)
    config = RolloutConfig(env=env, max_turns=factory.info.max_turns if factory else 1)
    return RolloutContext(config, engine, renderer, sampling, max_context_len, factory)


def play(ctx, sample, rid="ep0"):
    return asyncio.run(Episode(ctx, sample, rid).run())


def check_token_exact(ctx, sample, engine):
    """tokens == prompt + engine ids + env deltas; mask 1 exactly on the engine's ids."""
    sample.check()
    prompt_len = sample.prompt_length
    assert sample.tokens[:prompt_len] == engine.requests[0][1][:prompt_len]
    for turn in sample.turns:
        span = sample.loss_mask[turn.start : turn.end]
        assert span == [1 if turn.role == "assistant" else 0] * (turn.end - turn.start)
        logprobs = sample.rollout_log_probs[turn.start : turn.end]
        if turn.role == "environment":
            assert logprobs == [0.0] * len(logprobs)
        else:
            assert all(lp < 0 for lp in logprobs)
    # every engine request saw exactly the sample's tokens up to that point
    for _rid, ids in engine.requests:
        assert sample.tokens[: len(ids)] == ids


def test_completed_episode_is_token_exact_and_scored():
    ctx = make_ctx()
    sample = play(ctx, Sample(group_id=0, metadata={"task": TASK}))
    assert sample.status is Status.COMPLETED and sample.metadata["finish"] == "env"
    assert sample.reward == 1.0
    assert [t.role for t in sample.turns] == ["assistant", "environment", "assistant"]
    assert sample.turns[0].tool_names == ["calculator"] and sample.turns[0].tools_s > 0
    assert sample.metadata["turns"] == 2 and sample.metadata["task_id"] == "t1"
    check_token_exact(ctx, sample, ctx.engine)
    # the whole sequence equals the chat template's rendering of the final conversation
    env = agentrl.make_env("calc")
    messages, info = env.reset(options={"task": TASK})
    env.step(calc_policy(ctx.renderer.tokenizer.decode(sample.tokens[: sample.prompt_length]), ""))
    conversation = list(env.messages)
    conversation.append({"role": "assistant", "content": "The result is 43.\nAnswer: 43"})
    full = ctx.renderer.encode(ctx.renderer.render_text(conversation, info["tools"]))
    assert sample.tokens == full[: len(sample.tokens)]
    assert len(full) - len(sample.tokens) <= 1  # only the template's newline after <|im_end|>
    assert "Answer: 43" in sample.response


def test_max_turns_truncates_without_reward():
    always_call = lambda text, rid: calc_policy("What is 1 + 1?", rid)  # noqa: E731
    ctx = make_ctx(always_call, env_kwargs={"max_turns": 3})
    sample = play(ctx, Sample(group_id=0, metadata={"task": TASK}))
    assert sample.status is Status.TRUNCATED and sample.metadata["finish"] == "max_turns"
    assert sample.reward == 0.0 and sample.metadata["turns"] == 3
    # the last turn is the model's: the unanswered tool results are not in the sequence
    assert sample.turns[-1].role == "assistant"
    check_token_exact(ctx, sample, ctx.engine)


def test_length_finish_truncates():
    ctx = make_ctx(max_new_tokens=5)
    sample = play(ctx, Sample(group_id=0, metadata={"task": TASK}))
    assert sample.status is Status.TRUNCATED and sample.metadata["finish"] == "length"
    assert sample.response_length == 5 and sample.loss_mask == [1] * 5


def test_max_new_tokens_shrinks_to_the_context_budget():
    probe = Sample(group_id=0, metadata={"task": TASK})
    ctx = make_ctx()
    asyncio.run(Episode(ctx, probe, "p").start())
    budget = len(probe.tokens) + 7
    ctx = make_ctx(max_context_len=budget)
    sample = play(ctx, Sample(group_id=0, metadata={"task": TASK}))
    assert len(sample.tokens) == budget
    assert sample.status is Status.TRUNCATED and sample.metadata["finish"] == "length"


def test_overlong_tool_output_is_cut_to_fit_and_says_so():
    @agentrl.tool
    def dump(n: int) -> str:
        """Prints n lines.

        Args:
            n: How many.
        """
        return "\n".join(f"line {i}: " + "x" * 40 for i in range(n))

    class DumpEnv(agentrl.ToolEnv):
        tools = [dump]

        def make_prompt(self, task):
            return [{"role": "user", "content": "dump"}]

        def compute_reward(self, task, final, state):
            return 1.0

    def policy(text, rid):
        if "<tool_response>" in text:
            return "done"
        return '<tool_call>\n{"name": "dump", "arguments": {"n": 400}}\n</tool_call>'

    ctx = make_ctx(policy, max_context_len=400)
    ctx.envs = lambda: DumpEnv()
    sample = play(ctx, Sample(group_id=0, metadata={"task": {}}))
    assert sample.status is Status.COMPLETED, sample.metadata
    assert len(sample.tokens) <= 400
    env_turn = next(t for t in sample.turns if t.role == "environment")
    text = ctx.renderer.tokenizer.decode(sample.tokens[sample.prompt_length + env_turn.start :
                                                       sample.prompt_length + env_turn.end])
    assert "characters of output cut to fit the context window" in text
    assert re.search(CUT_MARKER.format(removed=r"\d+").replace("[", r"\[").replace(".", r"\."), text)
    assert sample.metadata["tool_outputs_cut"] == 1
    check_token_exact(ctx, sample, ctx.engine)


def test_env_crash_fails_the_sample_with_the_reason():
    class Broken(agentrl.ToolEnv):
        def make_prompt(self, task):
            return [{"role": "user", "content": "hi"}]

        def compute_reward(self, task, final, state):
            raise RuntimeError("grader exploded")

    ctx = make_ctx(lambda text, rid: "an answer")
    ctx.envs = Broken
    sample = play(ctx, Sample(group_id=0, metadata={"task": {}}))
    assert sample.status is Status.FAILED and sample.reward == 0.0
    assert sample.metadata["error"] == "RuntimeError: grader exploded"
    assert "grader exploded" in sample.metadata["traceback"]


def test_single_turn_without_env():
    ctx = make_ctx(lambda text, rid: "Paris.", env=None)
    sample = play(ctx, Sample(group_id=0, prompt="Capital of France?"))
    assert sample.status is Status.COMPLETED and sample.metadata["finish"] == "stop"
    assert sample.response == "Paris." and sample.reward == 0.0
    assert sample.tokens[sample.prompt_length:] == ctx.renderer.encode("Paris.<|im_end|>")


def test_aborted_episode_resumes_where_it_stopped():
    async def scenario():
        engine = ScriptedEngine(tiny_tokenizer(), calc_policy, delay_s=5.0)
        ctx = make_ctx(engine=engine)
        sample = Sample(group_id=3, metadata={"task": TASK})
        episode = Episode(ctx, sample, "r0-g3-s0")
        task = asyncio.create_task(episode.run())
        await asyncio.sleep(0.05)
        assert await engine.abort("r0-g3") == 1
        await task
        assert sample.status is Status.ABORTED and episode.env is not None and not episode.done
        partial = sample.response_length
        assert 0 < partial and sample.loss_mask == [1] * partial
        engine.delay_s = 0.0
        await episode.run()
        return sample, ctx

    sample, ctx = asyncio.run(scenario())
    assert sample.status is Status.COMPLETED and sample.reward == 1.0
    sample.check()
    # the resumed first turn is one assistant span: aborted half + continuation
    assert sample.turns[0].role == "assistant" and sample.turns[0].finish_reason == "stop"


def test_each_token_records_the_weight_version_that_sampled_it():
    engine = ScriptedEngine(tiny_tokenizer(), calc_policy)
    engine.version = "4"
    sample = play(make_ctx(engine=engine), Sample(group_id=0, metadata={"task": TASK}))
    sample.check()
    assert len(sample.token_versions) == sample.response_length
    for turn in sample.turns:
        expected = 4 if turn.role == "assistant" else -1
        assert sample.token_versions[turn.start : turn.end] == [expected] * (turn.end - turn.start)
    assert sample.oldest_version() == 4 and "versions_inexact" not in sample.metadata


def test_an_engine_without_per_token_versions_is_labelled_with_the_version_at_submission():
    async def scenario():
        # the second turn's request is in flight when the weights change: the engine (like
        # SGLang) reports only the newer version, so its tokens get the one at submission
        engine = ScriptedEngine(tiny_tokenizer(), calc_policy,
                                delay_s=lambda rid: 0.3 if rid.endswith("-t1") else 0.0)
        task = asyncio.create_task(Episode(make_ctx(engine=engine), Sample(group_id=0, metadata={"task": TASK}), "ep0").run())
        while not any(rid.endswith("-t1") for rid, _ in engine.requests):
            await asyncio.sleep(0.01)
        await engine.update_weights(version="1")
        return await task

    sample = asyncio.run(scenario())
    first, _, second = sample.turns
    assert sample.weight_version == "1" and sample.metadata["versions_inexact"] is True
    assert set(sample.token_versions[first.start : first.end]) == {0}
    assert set(sample.token_versions[second.start : second.end]) == {0}  # never under-counted


def test_stop_string_turn_gets_end_of_turn_as_env_token():
    def policy(text, rid):
        return calc_policy(text, rid)

    tok = tiny_tokenizer()

    class StopStringEngine(ScriptedEngine):
        async def generate(self, input_ids, sampling, rid=None):
            out = await super().generate(input_ids, sampling, rid)
            if out.output_ids[-len(self.eot_ids):] == self.eot_ids and "</tool_call>" in tok.decode(out.output_ids):
                out.output_ids = out.output_ids[: -len(self.eot_ids)]
                out.output_logprobs = out.output_logprobs[: len(out.output_ids)]
                out.matched = "</tool_call>"
            return out

    ctx = make_ctx(engine=StopStringEngine(tok, policy))
    sample = play(ctx, Sample(group_id=0, metadata={"task": TASK}))
    assert sample.status is Status.COMPLETED and sample.reward == 1.0
    env_turn = sample.turns[1]
    first_env_token = sample.tokens[sample.prompt_length + env_turn.start]
    assert first_env_token == ctx.engine.eot_ids[0]
    assert sample.loss_mask[env_turn.start] == 0
    sample.check()


@pytest.mark.parametrize("bad", [0, -2])
def test_sampling_params_validation(bad):
    with pytest.raises(ValueError, match="top_k"):
        SamplingParams(top_k=bad)
