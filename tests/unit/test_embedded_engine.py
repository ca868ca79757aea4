"""EmbeddedEngine: outputs against transformers, continuous batching, stops, control calls."""

from __future__ import annotations

import asyncio
import json
import shutil
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from agentrl.engine import EmbeddedEngine, GenerateOutput, RoutedExperts, SamplingParams
from agentrl.errors import EngineError
from tests.support.tokenizers import tiny_tokenizer

GREEDY = SamplingParams(max_new_tokens=16, temperature=0.0, ignore_eos=True)


def _hf_model(seed: int) -> Qwen2ForCausalLM:
    tokenizer = tiny_tokenizer()
    config = Qwen2Config(
        vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
        tie_word_embeddings=False, initializer_range=0.1,
        eos_token_id=tokenizer.convert_tokens_to_ids("<|im_end|>"), pad_token_id=0,
    )
    torch.manual_seed(seed)
    return Qwen2ForCausalLM(config).eval()


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("engine") / "model"
    _hf_model(0).save_pretrained(path)
    tiny_tokenizer().save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def other_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Same architecture, different weights."""
    path = tmp_path_factory.mktemp("engine") / "other"
    _hf_model(1).save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def hf(model_dir: Path) -> Qwen2ForCausalLM:
    return Qwen2ForCausalLM.from_pretrained(model_dir).eval()


def _prompt(n: int, start: int = 100) -> list[int]:
    return [(start + 37 * i) % 4000 + 10 for i in range(n)]


def run(model_dir: Path, body: Callable[[EmbeddedEngine], Awaitable[Any]], **kwargs: Any) -> Any:
    """Runs ``body(engine)`` in a fresh event loop and always closes the engine."""

    async def main() -> Any:
        engine = EmbeddedEngine.from_pretrained(model_dir, device="cpu", **kwargs)
        try:
            return await body(engine)
        finally:
            await engine.close()

    return asyncio.run(main())


def _hf_greedy(hf: Qwen2ForCausalLM, prompt: list[int], new_tokens: int) -> list[int]:
    with torch.no_grad():
        out = hf.generate(torch.tensor([prompt]), max_new_tokens=new_tokens,
                          min_new_tokens=new_tokens, do_sample=False, eos_token_id=None,
                          pad_token_id=0)
    return out[0, len(prompt) :].tolist()


def _hf_logprobs(hf: Qwen2ForCausalLM, prompt: list[int], output: list[int],
                 temperature: float) -> torch.Tensor:
    with torch.no_grad():
        logits = hf(torch.tensor([prompt + output])).logits[0].float()
    logp = (logits / temperature).log_softmax(-1)
    positions = torch.arange(len(prompt) - 1, len(prompt) + len(output) - 1)
    return logp[positions, torch.tensor(output)]


async def _wait_for(predicate: Callable[[], bool], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.002)


# --- outputs ---------------------------------------------------------------------------


def test_greedy_matches_transformers_generate(model_dir: Path, hf: Qwen2ForCausalLM) -> None:
    prompts = [_prompt(5), _prompt(19, 7), _prompt(2, 900)]

    async def body(engine: EmbeddedEngine) -> list[GenerateOutput]:
        return [await engine.generate(p, GREEDY.replace(max_new_tokens=20)) for p in prompts]

    outputs = run(model_dir, body)
    for prompt, out in zip(prompts, outputs, strict=True):
        expected = _hf_greedy(hf, prompt, 20)
        assert out.output_ids == expected
        assert len(set(expected)) > 3  # a real sequence, not one token repeated
        assert out.finish_reason == "length" and out.matched is None
        assert out.prompt_tokens == len(prompt) and out.weight_version == "0"
        assert out.latency_s > 0 and out.routed_experts is None  # a dense model routes nothing


def _mixed_requests() -> list[tuple[list[int], SamplingParams]]:
    requests = []
    for i in range(8):
        prompt = _prompt(3 + 5 * i, 50 * i)
        max_new = 6 + 3 * i
        if i % 2:
            sampling = SamplingParams(max_new_tokens=max_new, temperature=0.8 + 0.1 * i,
                                      top_p=0.9 if i % 3 else 1.0, top_k=50 if i == 3 else -1,
                                      sampling_seed=1000 + i, ignore_eos=True)
        else:
            sampling = GREEDY.replace(max_new_tokens=max_new)
        requests.append((prompt, sampling))
    return requests


def test_concurrent_requests_equal_one_at_a_time(model_dir: Path) -> None:
    requests = _mixed_requests()

    async def body(engine: EmbeddedEngine) -> tuple[list[GenerateOutput], list[GenerateOutput],
                                                    dict[str, float]]:
        alone = [await engine.generate(p, s) for p, s in requests]
        before = engine.stats()["decode_steps"]
        await engine.pause("in_place")  # so that all eight are admitted together
        tasks = [asyncio.create_task(engine.generate(p, s)) for p, s in requests]
        await _wait_for(lambda: engine.stats()["waiting"] == len(requests))
        await engine.resume()
        together = await asyncio.gather(*tasks)
        stats = engine.stats()
        stats["steps_together"] = stats["decode_steps"] - before
        return alone, together, stats

    alone, together, stats = run(model_dir, body)
    for (_, sampling), a, b in zip(requests, alone, together, strict=True):
        assert a.output_ids == b.output_ids
        assert len(a.output_ids) == sampling.max_new_tokens
        assert a.output_logprobs == pytest.approx(b.output_logprobs, abs=1e-5)
    # batched: the longest request needs max_new - 1 decode steps, and they all fit in it
    assert stats["steps_together"] == max(s.max_new_tokens for _, s in requests) - 1
    assert stats["requests_served"] == 16
    # seeded sampling is repeatable, and different seeds give different outputs
    assert len({tuple(o.output_ids[:6]) for o in alone[1::2]}) == 4


def test_logprobs_match_a_full_forward(model_dir: Path, hf: Qwen2ForCausalLM) -> None:
    prompt = _prompt(9, 300)
    cases = [
        SamplingParams(max_new_tokens=12, temperature=0.0, ignore_eos=True),
        SamplingParams(max_new_tokens=12, temperature=0.7, ignore_eos=True, sampling_seed=3),
        SamplingParams(max_new_tokens=12, temperature=1.3, top_k=5, top_p=0.8,
                       ignore_eos=True, sampling_seed=4),
    ]

    async def body(engine: EmbeddedEngine) -> list[GenerateOutput]:
        return await asyncio.gather(*(engine.generate(prompt, s) for s in cases))

    for sampling, out in zip(cases, run(model_dir, body), strict=True):
        temperature = 1.0 if sampling.greedy else sampling.temperature
        expected = _hf_logprobs(hf, prompt, out.output_ids, temperature)
        assert len(out.output_logprobs) == len(out.output_ids) == 12
        assert torch.allclose(torch.tensor(out.output_logprobs), expected, atol=1e-4, rtol=0)
    # the truncated request only ever sampled from its top-k / top-p set
    truncated = cases[2]
    out = run(model_dir, lambda e: e.generate(prompt, truncated))
    with torch.no_grad():
        logits = hf(torch.tensor([prompt + out.output_ids])).logits[0]
    for step, token in enumerate(out.output_ids):
        probs = (logits[len(prompt) - 1 + step] / truncated.temperature).softmax(-1)
        order = probs.argsort(descending=True).tolist()
        rank = order.index(token)
        assert rank < truncated.top_k
        assert probs[order[:rank]].sum() < truncated.top_p


# --- stopping ----------------------------------------------------------------------------

SAMPLED = SamplingParams(max_new_tokens=30, temperature=1.0, sampling_seed=11, ignore_eos=True)


def test_stop_token_ids_and_strings(model_dir: Path) -> None:
    tokenizer = tiny_tokenizer()
    prompt = _prompt(6, 1234)

    async def free(engine: EmbeddedEngine) -> GenerateOutput:
        return await engine.generate(prompt, SAMPLED)

    reference = run(model_dir, free).output_ids
    assert len(reference) == 30
    # a stop id first sampled at step 5 or later
    index = next(i for i in range(5, 30) if reference[i] not in reference[:i])
    stop_id = reference[index]
    # a stop string of 4 characters around a token boundary, from token 8 on
    full = tokenizer.decode(reference)
    for boundary in range(8, 25):
        cut = len(tokenizer.decode(reference[:boundary]))
        stop = full[cut - 2 : cut + 2]
        if len(stop) == 4 and "\ufffd" not in stop and stop.strip():
            break
    else:
        pytest.fail(f"no usable stop string in {full!r}")
    expected_len = next(k for k in range(1, 31) if stop in tokenizer.decode(reference[:k]))

    async def body(engine: EmbeddedEngine) -> list[GenerateOutput]:
        return await asyncio.gather(
            engine.generate(prompt, SAMPLED.replace(stop_token_ids=(stop_id,))),
            engine.generate(prompt, SAMPLED.replace(stop=(stop, "never-appears"))),
            engine.generate(prompt, SAMPLED.replace(max_new_tokens=4)),
        )

    by_id, by_string, by_length = run(model_dir, body)
    assert by_id.output_ids == reference[: index + 1]
    assert (by_id.finish_reason, by_id.matched) == ("stop", stop_id)
    assert by_string.output_ids == reference[:expected_len]
    assert (by_string.finish_reason, by_string.matched) == ("stop", stop)
    assert stop in tokenizer.decode(by_string.output_ids)
    assert by_length.output_ids == reference[:4]
    assert (by_length.finish_reason, by_length.matched) == ("length", None)


def test_model_eos_stops_unless_ignored(model_dir: Path, tmp_path: Path) -> None:
    prompt = _prompt(6, 1234)
    reference = run(model_dir, lambda e: e.generate(prompt, SAMPLED)).output_ids
    index = next(i for i in range(3, 30) if reference[i] not in reference[:i])
    eos = reference[index]
    assert not {2, 3} & set(reference[: index + 1])  # the other eos ids (config's 2, and 3)
    # generation_config.json's eos list (int or list) is read by from_pretrained
    custom = tmp_path / "model"
    shutil.copytree(model_dir, custom)
    (custom / "generation_config.json").write_text(json.dumps({"eos_token_id": [eos, 3]}))

    async def body(engine: EmbeddedEngine) -> list[GenerateOutput]:
        return await asyncio.gather(
            engine.generate(prompt, SAMPLED.replace(ignore_eos=False)),
            engine.generate(prompt, SAMPLED),
        )

    stopped, ignored = run(custom, body)
    assert stopped.output_ids == reference[: index + 1]
    assert (stopped.finish_reason, stopped.matched) == ("stop", eos)
    assert ignored.output_ids == reference and ignored.finish_reason == "length"


def test_length_limits(model_dir: Path) -> None:
    async def body(engine: EmbeddedEngine) -> tuple[GenerateOutput, GenerateOutput]:
        zero = await engine.generate(_prompt(4), GREEDY.replace(max_new_tokens=0))
        clipped = await engine.generate(_prompt(35), GREEDY.replace(max_new_tokens=20))
        with pytest.raises(EngineError, match="41 tokens; the context limit is 40"):
            await engine.generate(_prompt(41), GREEDY)
        with pytest.raises(EngineError, match="empty"):
            await engine.generate([], GREEDY)
        with pytest.raises(EngineError, match="outside the vocabulary"):
            await engine.generate([1, 99999], GREEDY)
        assert engine.max_context_len == 40
        return zero, clipped

    zero, clipped = run(model_dir, body, max_context_len=40)
    assert (zero.output_ids, zero.output_logprobs, zero.finish_reason) == ([], [], "length")
    assert zero.prompt_tokens == 4
    assert len(clipped.output_ids) == 5 and clipped.finish_reason == "length"


def test_stop_strings_need_a_tokenizer(tmp_path: Path, other_dir: Path) -> None:
    async def body(engine: EmbeddedEngine) -> None:
        assert engine.tokenizer is None
        with pytest.raises(EngineError, match="tokenizer"):
            await engine.generate(_prompt(3), GREEDY.replace(stop=("x",)))

    run(other_dir, body)


# --- continuous batching and control -------------------------------------------------------


def test_request_joins_mid_decode(model_dir: Path) -> None:
    long_sampling = GREEDY.replace(max_new_tokens=300)
    short_sampling = GREEDY.replace(max_new_tokens=10)

    async def body(engine: EmbeddedEngine) -> tuple[Any, ...]:
        solo_long = await engine.generate(_prompt(5), long_sampling)
        solo_short = await engine.generate(_prompt(12, 77), short_sampling)
        long_task = asyncio.create_task(engine.generate(_prompt(5), long_sampling))
        await _wait_for(lambda: engine.stats()["decode_steps"] >= 299 + 9 + 5)
        short = await engine.generate(_prompt(12, 77), short_sampling)
        long_running = not long_task.done()
        return solo_long, solo_short, await long_task, short, long_running, engine.stats()

    solo_long, solo_short, long, short, long_running, stats = run(model_dir, body)
    assert long_running  # the short request finished while the long one was decoding
    assert long.output_ids == solo_long.output_ids
    assert short.output_ids == solo_short.output_ids
    # the short request rode along: fewer steps than running both one after the other
    assert stats["decode_steps"] == 2 * 299 + 9
    assert stats["mean_batch_size"] > 1.0


def test_abort_by_prefix(model_dir: Path) -> None:
    sampling = GREEDY.replace(max_new_tokens=400)

    async def body(engine: EmbeddedEngine) -> tuple[Any, ...]:
        tasks = {rid: asyncio.create_task(engine.generate(_prompt(4, i), sampling, rid=rid))
                 for i, rid in enumerate(["ep1-a", "ep1-b", "ep2-a"])}
        await _wait_for(lambda: engine.stats()["decode_steps"] >= 5)
        count = await engine.abort("ep1")
        none = await engine.abort("nothing")
        ep1 = [await tasks["ep1-a"], await tasks["ep1-b"]]
        other_done = tasks["ep2-a"].done()
        return count, none, ep1, other_done, await tasks["ep2-a"]

    count, none, ep1, other_done, ep2 = run(model_dir, body)
    assert (count, none) == (2, 0)
    for out in ep1:
        assert out.finish_reason == "abort" and "abort('ep1')" in out.message
        assert 0 < len(out.output_ids) < 400
        assert len(out.output_logprobs) == len(out.output_ids)
    assert not other_done
    assert ep2.finish_reason == "length" and len(ep2.output_ids) == 400


def test_pause_abort_then_resume(model_dir: Path) -> None:
    sampling = GREEDY.replace(max_new_tokens=400)

    async def body(engine: EmbeddedEngine) -> tuple[Any, ...]:
        running = [asyncio.create_task(engine.generate(_prompt(4, i), sampling)) for i in range(3)]
        await _wait_for(lambda: engine.stats()["decode_steps"] >= 3)
        await engine.pause("abort")
        aborted = [await t for t in running]
        healthy_paused = await engine.health()
        waiting = asyncio.create_task(engine.generate(_prompt(4), GREEDY))
        await asyncio.sleep(0.2)
        waited = not waiting.done()
        await engine.resume()
        return aborted, healthy_paused, waited, await waiting, await engine.health()

    aborted, healthy_paused, waited, after, healthy = run(model_dir, body)
    for out in aborted:
        assert out.finish_reason == "abort" and "pause" in out.message
        assert 1 <= len(out.output_ids) < 400
    assert not healthy_paused and waited and healthy
    assert after.finish_reason == "length" and len(after.output_ids) == GREEDY.max_new_tokens


def test_pause_in_place_keeps_requests(model_dir: Path) -> None:
    sampling = GREEDY.replace(max_new_tokens=200)

    async def body(engine: EmbeddedEngine) -> tuple[Any, ...]:
        solo = await engine.generate(_prompt(6), sampling)
        task = asyncio.create_task(engine.generate(_prompt(6), sampling))
        await _wait_for(lambda: engine.stats()["decode_steps"] >= 199 + 5)
        await engine.pause("in_place")
        steps = engine.stats()["decode_steps"]
        await asyncio.sleep(0.2)
        frozen = engine.stats()["decode_steps"] == steps and not task.done()
        await engine.resume()
        return solo, frozen, await task

    solo, frozen, resumed = run(model_dir, body)
    assert frozen
    assert resumed.finish_reason == "length"
    assert resumed.output_ids == solo.output_ids


def test_update_weights_from_state_dict_and_directory(
    model_dir: Path, other_dir: Path, hf: Qwen2ForCausalLM
) -> None:
    prompt = _prompt(7, 500)
    other = Qwen2ForCausalLM.from_pretrained(other_dir).eval()
    original = _hf_greedy(hf, prompt, 16)
    updated = _hf_greedy(other, prompt, 16)
    assert original != updated

    async def body(engine: EmbeddedEngine) -> list[tuple[str, list[int]]]:
        seen = []

        async def probe() -> None:
            out = await engine.generate(prompt, GREEDY)
            assert out.weight_version == engine.weight_version
            seen.append((out.weight_version, out.output_ids))

        await probe()
        await engine.update_weights(state_dict=other.state_dict(), version="1")
        await probe()
        await engine.update_weights(path=str(model_dir), version="2")
        await probe()
        await engine.update_weights(path=str(other_dir), version="3")
        await probe()
        return seen

    seen = run(model_dir, body)
    assert seen == [("0", original), ("1", updated), ("2", original), ("3", updated)]


def test_a_request_spanning_a_weight_update_reports_each_tokens_version(
    model_dir: Path, other_dir: Path
) -> None:
    other = Qwen2ForCausalLM.from_pretrained(other_dir).eval().state_dict()
    sampling = GREEDY.replace(max_new_tokens=48, ignore_eos=True)

    async def body(engine: EmbeddedEngine) -> tuple[GenerateOutput, int]:
        task = asyncio.create_task(engine.generate(_prompt(6), sampling))
        await _wait_for(lambda: engine.stats()["tokens_generated"] >= 8)
        await engine.update_weights(state_dict=other, version="1")
        before = engine.stats()["tokens_generated"]
        return await task, before

    out, sampled_before = run(model_dir, body)
    versions = out.token_versions
    assert versions is not None and len(versions) == len(out.output_ids) == 48
    old = versions.count("0")
    assert versions == ["0"] * old + ["1"] * (48 - old)  # the older version first, then the newer
    assert 8 <= old <= sampled_before < 48  # the update landed between two decode steps
    assert out.weight_version == "1"


def test_bad_weights_change_nothing(model_dir: Path, other_dir: Path) -> None:
    other = dict(Qwen2ForCausalLM.from_pretrained(other_dir).state_dict())
    other["model.layers.0.mlp.up_proj.weight"] = torch.zeros(3, 3)
    other["model.layers.9.mlp.up_proj.weight"] = torch.zeros(64, 32)

    async def body(engine: EmbeddedEngine) -> tuple[Any, ...]:
        before = await engine.generate(_prompt(7), GREEDY)
        with pytest.raises(EngineError) as info:
            await engine.update_weights(state_dict=other, version="bad")
        with pytest.raises(EngineError, match="exactly one"):
            await engine.update_weights(version="bad")
        after = await engine.generate(_prompt(7), GREEDY)
        return str(info.value), before, after, engine.weight_version

    message, before, after, version = run(model_dir, body, weight_version="v0")
    assert "model.layers.9.mlp.up_proj.weight" in message
    assert "model.layers.0.mlp.up_proj.weight: got (3, 3)" in message
    assert after.output_ids == before.output_ids
    assert version == "v0" and after.weight_version == "v0"


def test_health_close_and_cancellation(model_dir: Path) -> None:
    async def main() -> None:
        engine = EmbeddedEngine.from_pretrained(model_dir, device="cpu", max_batch_size=2)
        assert await engine.health()
        # a cancelled request frees its slot: the next two requests run together
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(
                engine.generate(_prompt(4), GREEDY.replace(max_new_tokens=400)), 0.01
            )
        await _wait_for(lambda: engine.stats()["active"] == 0)
        outs = await asyncio.gather(*(engine.generate(_prompt(4, i), GREEDY) for i in range(2)))
        assert [len(o.output_ids) for o in outs] == [16, 16]
        # the event loop stays responsive while the engine decodes
        ticks = 0

        async def ticker() -> None:
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0.001)

        tick_task = asyncio.create_task(ticker())
        started = time.perf_counter()
        await engine.generate(_prompt(4), GREEDY.replace(max_new_tokens=300))
        elapsed = time.perf_counter() - started
        tick_task.cancel()
        assert ticks >= min(20, elapsed / 0.01)
        # close aborts what is in flight, then refuses new work; closing twice is fine
        generated = engine.stats()["tokens_generated"]
        pending = asyncio.create_task(engine.generate(_prompt(4), GREEDY.replace(
            max_new_tokens=400)))
        await _wait_for(lambda: engine.stats()["tokens_generated"] >= generated + 3)
        await engine.close()
        out = await pending
        assert out.finish_reason == "abort" and "closed" in out.message
        assert not await engine.health()
        await engine.close()
        with pytest.raises(EngineError, match="closed"):
            await engine.generate(_prompt(4), GREEDY)
        with pytest.raises(EngineError, match="closed"):
            await engine.abort()
        assert not engine._thread.is_alive()

    asyncio.run(main())


# --- the prefix store ------------------------------------------------------------------------


def test_the_next_turn_reuses_what_the_previous_turn_computed(model_dir: Path,
                                                             hf: Qwen2ForCausalLM) -> None:
    """A second turn (the first turn's prompt and output, then an env reply) computes only the
    reply and the last sampled token; its outputs and log-probs are those of a full prefill."""
    prompt = _prompt(40, 500)
    sampling = SamplingParams(max_new_tokens=10, temperature=0.7, sampling_seed=3, ignore_eos=True)

    async def body(engine: EmbeddedEngine) -> tuple[Any, ...]:
        first = await engine.generate(prompt, sampling)
        turn = [*prompt, *first.output_ids, *_prompt(6, 900)]
        second = await engine.generate(turn, sampling)
        return first, second, turn, engine.stats()

    first, second, turn, stats = run(model_dir, body)
    assert first.cached_tokens == 0
    assert second.cached_tokens == len(prompt) + len(first.output_ids) - 1
    assert stats["prompt_tokens"] == len(prompt) + len(turn)
    assert stats["prompt_tokens_computed"] == len(prompt) + len(turn) - second.cached_tokens
    _, alone, _, _ = run(model_dir, body, prefix_cache_bytes=0)
    assert alone.cached_tokens == 0 and alone.output_ids == second.output_ids
    assert torch.allclose(torch.tensor(second.output_logprobs), torch.tensor(alone.output_logprobs),
                          atol=1e-5, rtol=0)
    expected = _hf_logprobs(hf, turn, second.output_ids, 0.7)
    assert torch.allclose(torch.tensor(second.output_logprobs), expected, atol=1e-4, rtol=0)


def test_a_weight_update_empties_the_prefix_store(model_dir: Path, other_dir: Path) -> None:
    prompt = _prompt(40, 500)
    other = Qwen2ForCausalLM.from_pretrained(other_dir).eval()

    async def body(engine: EmbeddedEngine) -> tuple[GenerateOutput, GenerateOutput]:
        await engine.generate(prompt, GREEDY)
        again = await engine.generate([*prompt, 7, 8], GREEDY)  # a hit on the same weights
        await engine.update_weights(state_dict=other.state_dict(), version="1")
        return again, await engine.generate([*prompt, 7, 8], GREEDY)

    again, after = run(model_dir, body)
    assert again.cached_tokens == len(prompt)
    assert after.cached_tokens == 0 and after.output_ids == _hf_greedy(other, [*prompt, 7, 8], 16)


def test_release_memory_right_after_cancelled_requests_frees_the_cache(model_dir: Path) -> None:
    """A rollout that has enough groups cancels the rest and the train step frees the cache at
    once: the cancelled requests must not make the engine look busy."""
    long = SamplingParams(max_new_tokens=400, temperature=1.0, ignore_eos=True)

    async def body(engine: EmbeddedEngine) -> int:
        tasks = [asyncio.ensure_future(engine.generate(_prompt(30, 100 + i), long)) for i in range(3)]
        await _wait_for(lambda: engine.stats()["tokens_generated"] > 3)
        for task in tasks:
            task.cancel()
        await engine.release_memory()  # raised "needs an idle engine" before the sweep
        out = await engine.generate(_prompt(20), GREEDY)  # and the engine serves again
        return len(out.output_ids)

    assert run(model_dir, body) == GREEDY.max_new_tokens


def test_hits_of_very_different_lengths_stay_within_the_context(model_dir: Path) -> None:
    """Two next turns admitted together, one after a long prefix and one with a long new part:
    each is extended on its own, so neither reaches past the context limit (together, padded,
    they asked the cache for more positions than the limit and stopped the scheduler)."""
    sampling = SamplingParams(max_new_tokens=4, temperature=0.0, ignore_eos=True)

    async def body(engine: EmbeddedEngine) -> list[GenerateOutput]:
        long, short = _prompt(200, 100), _prompt(30, 700)
        first = await asyncio.gather(engine.generate(long, sampling), engine.generate(short, sampling))
        turns = [[*long, *first[0].output_ids, 1, 2], [*short, *first[1].output_ids, *_prompt(120, 900)]]
        return list(await asyncio.gather(*(engine.generate(t, sampling) for t in turns)))

    outputs = run(model_dir, body, max_context_len=256)
    assert [o.cached_tokens for o in outputs] == [203, 33]
    assert all(len(o.output_ids) == 4 for o in outputs)


def test_a_failure_while_admitting_fails_the_requests_instead_of_hanging(model_dir: Path) -> None:
    async def body(engine: EmbeddedEngine) -> str:
        def broken(*args: Any, **kwargs: Any) -> None:
            raise RuntimeError("prefill broke")

        engine.model.prefill = broken  # the scheduler thread fails admitting the request
        with pytest.raises(EngineError) as info:
            await asyncio.wait_for(engine.generate(_prompt(20), GREEDY), timeout=30)
        return str(info.value)

    assert "prefill broke" in run(model_dir, body)


# --- mixture of experts ----------------------------------------------------------------


def test_a_mixture_of_experts_generates_as_transformers_and_reports_its_routes(tmp_path: Path) -> None:
    """Qwen3-MoE: greedy output equal to transformers' generate; each output reports, for every
    position it ran, the experts transformers' router picks there; a second turn served from the
    prefix store reports the reused positions' routes too (they travel with the keys)."""
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    tokenizer = tiny_tokenizer()
    config = Qwen3MoeConfig(
        vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, moe_intermediate_size=16,
        num_experts=6, num_experts_per_tok=2, norm_topk_prob=True, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=512,
        initializer_range=0.1, eos_token_id=tokenizer.convert_tokens_to_ids("<|im_end|>"),
        pad_token_id=0)
    torch.manual_seed(0)
    hf_moe = Qwen3MoeForCausalLM(config).eval()
    hf_moe.save_pretrained(tmp_path / "moe")
    prompt = _prompt(30, 300)

    async def body(engine: EmbeddedEngine) -> tuple[GenerateOutput, GenerateOutput, list[int]]:
        first = await engine.generate(prompt, GREEDY.replace(max_new_tokens=12))
        turn = [*prompt, *first.output_ids, *_prompt(5, 800)]
        return first, await engine.generate(turn, GREEDY.replace(max_new_tokens=8)), turn

    first, second, turn = run(tmp_path / "moe", body)
    assert first.output_ids == _hf_greedy(hf_moe, prompt, 12)
    assert second.cached_tokens == len(prompt) + 11  # the first turn's positions, routes included
    for out, ids in ((first, prompt), (second, turn)):
        sequence = [*ids, *out.output_ids]
        routes = out.routed_experts
        assert routes is not None and (routes.positions, routes.layers, routes.topk) == (len(sequence) - 1, 2, 2)
        got = torch.frombuffer(bytearray(routes.data), dtype=torch.int16).view(-1, 2, 2).long()
        with torch.no_grad():
            router_logits = hf_moe(torch.tensor([sequence[:-1]]), output_router_logits=True).router_logits
        expected = torch.stack([torch.topk(r.softmax(-1), 2).indices for r in router_logits], dim=1)
        assert torch.equal(got.sort(-1).values, expected.sort(-1).values)
        assert RoutedExperts.from_json(json.loads(json.dumps(routes.to_json()))) == routes
        assert routes.head(5).data == routes.data[: 5 * 2 * 2 * 2]
    with pytest.raises(ValueError, match=r"do not hold \[3, 2, 2\] int16 values"):
        RoutedExperts(b"\0" * 10, 3, 2, 2)
    assert run(tmp_path / "moe", lambda e: e.generate(prompt, GREEDY)).routed_experts is not None
