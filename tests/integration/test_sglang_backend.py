"""The SGLang client against servers that speak SGLang's native API (backed by the embedded
engine, as SGLang itself cannot serve on CPU), directly and through the real ``sglang-router``."""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from safetensors.torch import save_file

from agentrl.engine.base import SamplingParams
from agentrl.engine.embedded import EmbeddedEngine, load_tokenizer
from agentrl.engine.model import read_checkpoint
from agentrl.engine.sglang import SGLangEngine
from agentrl.errors import EngineError
from agentrl.models import build_tiny_model
from tests.support.distributed import free_port

SEEDED = SamplingParams(max_new_tokens=16, sampling_seed=5, stop_token_ids=(3,))


def wait_http(url: str, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(url, timeout=2) as answer:
                if answer.status == 200:
                    return
        except OSError:
            pass
        assert time.monotonic() < deadline, f"{url} never answered 200"
        time.sleep(0.2)


@contextlib.contextmanager
def servers(count: int, procs: list | None = None) -> Iterator[list[str]]:
    """``count`` SGLang-compatible servers on the tiny model; their URLs (their processes are
    appended to ``procs``)."""
    procs = [] if procs is None else procs
    urls = []
    try:
        for _ in range(count):
            port = free_port()
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "agentrl.engine.sglang_compat_server",
                 "--model-path", str(build_tiny_model()), "--port", str(port)],
                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE))
            urls.append(f"http://127.0.0.1:{port}")
        for url in urls:
            wait_http(f"{url}/health")
        yield urls
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(timeout=30)


@contextlib.contextmanager
def router(workers: list[str]) -> Iterator[str]:
    pytest.importorskip("sglang_router", reason="sglang-router is not installed (pip install sglang-router)")
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "sglang_router.launch_router", "--host", "127.0.0.1",
                             "--port", str(port), "--worker-urls", *workers, "--policy", "cache_aware",
                             "--log-level", "warn", "--prometheus-port", str(free_port())],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_http(f"{url}/health")
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=30)


async def reference(tokens: list[int], sampling: SamplingParams, path=None) -> list[int]:
    engine = EmbeddedEngine.from_pretrained(path or build_tiny_model())
    try:
        return (await engine.generate(tokens, sampling)).output_ids
    finally:
        await engine.close()


def test_client_generates_updates_weights_pauses_and_aborts(tmp_path):
    async def scenario(urls: list[str]) -> None:
        engine = await SGLangEngine.connect(urls, tokenizer=load_tokenizer(build_tiny_model()))
        try:
            assert engine.max_context_len == 4096 and await engine.health()
            out = await engine.generate([5, 6, 7], SEEDED, rid="r0-g0-s0-t0")
            assert out.output_ids == await reference([5, 6, 7], SEEDED)
            assert len(out.output_logprobs) == len(out.output_ids) and out.weight_version == "0"
            assert out.finish_reason in ("stop", "length")

            # both workers serve; an episode's turns stay on its worker
            await asyncio.gather(*(engine.generate([5, 6], SEEDED, rid=f"r0-g{i}-s0-t0") for i in range(4)))
            assert set(engine._affinity.values()) == set(engine.workers)
            before = engine._affinity["r0-g1-s0"]
            await engine.generate([5, 6], SEEDED, rid="r0-g1-s0-t1")
            assert engine._affinity["r0-g1-s0"] == before

            # weights from disk, with a version, on every worker
            halved = tmp_path / "halved"
            shutil.copytree(build_tiny_model(), halved)
            state = {k: (v * 0.5).contiguous() for k, v in read_checkpoint(build_tiny_model()).items()}
            save_file(state, str(halved / "model.safetensors"))
            await engine.update_weights(path=str(halved), version="7")
            expected = await reference([5, 6, 7], SEEDED, path=halved)
            for i in range(2):
                got = await engine.generate([5, 6, 7], SEEDED, rid=f"w{i}-t0")
                assert (got.weight_version, got.output_ids) == ("7", expected)
            with pytest.raises(EngineError, match="update_weights_from_disk"):
                await engine.update_weights(path=str(tmp_path / "missing"), version="8")
            assert engine.weight_version == "7"

            # and from tensors, in several buckets; the version moves with the last bucket
            original = read_checkpoint(build_tiny_model())
            engine.bucket_bytes = 64 * 1024
            await engine.update_weights(state_dict=original, version="9")
            for i in range(2):
                got = await engine.generate([5, 6, 7], SEEDED, rid=f"t{i}-t0")
                assert (got.weight_version, got.output_ids) == ("9", await reference([5, 6, 7], SEEDED))
            with pytest.raises(EngineError, match="update_weights_from_tensor"):
                await engine.update_weights(state_dict={"no.such.weight": original["lm_head.weight"]
                                                        if "lm_head.weight" in original else
                                                        next(iter(original.values()))}, version="10")
            expected = await reference([5, 6, 7], SEEDED)

            # pause in abort mode ends what runs with "abort"; abort-all leaves the servers idle
            long = SamplingParams(max_new_tokens=4000, ignore_eos=True, sampling_seed=1)
            running = asyncio.create_task(engine.generate([5], long, rid="long-t0"))
            await asyncio.sleep(0.5)
            await engine.pause("abort")
            assert (await running).finish_reason == "abort"
            await engine.resume()
            running = asyncio.create_task(engine.generate([5], long, rid="long2-t0"))
            await asyncio.sleep(0.5)
            await engine.abort()
            aborted = await running
            assert aborted.finish_reason == "abort" and 0 < len(aborted.output_ids) < 4000

            # SGLang's contract: unknown sampling keys are a 400, reported, not retried
            with pytest.raises(EngineError, match="HTTP 400"):
                await engine._request("POST", f"{urls[0]}/generate", {
                    "input_ids": [1], "sampling_params": {"max_tokens": 3}})
            await engine.release_memory()
            assert (await engine.generate([5, 6, 7], SEEDED, rid="after-t0")).output_ids == expected
        finally:
            await engine.close()

    with servers(2) as urls:
        asyncio.run(scenario(urls))


def test_through_the_sglang_router():
    async def scenario(urls: list[str], router_url: str) -> None:
        engine = await SGLangEngine.connect(urls, router_url=router_url, max_retries=3,
                                            tokenizer=load_tokenizer(build_tiny_model()))
        try:
            expected = await reference([5, 6, 7], SEEDED)
            outs = await asyncio.gather(*(engine.generate([5, 6, 7], SEEDED, rid=f"r0-g{i}-s0-t0")
                                          for i in range(8)))
            assert all(o.output_ids == expected for o in outs)
        finally:
            await engine.close()

    with servers(2) as urls, router(urls) as router_url:
        asyncio.run(scenario(urls, router_url))


@pytest.mark.parametrize("through_router", [True, False], ids=["router", "client-routing"])
def test_a_server_killed_mid_rollout_loses_no_sample(through_router):
    """Episodes on a server that dies continue on the other (the router retries them, or the
    client fails over): every sample of the rollout is present once and none failed."""
    from agentrl.records.sample import Status
    from agentrl.rollout import RolloutRunner, env_factory, load_data_source
    from agentrl.rollout.config import RolloutConfig
    from agentrl.run.context import make_rollout_context

    async def scenario(urls: list[str], router_url: str | None, procs: list) -> None:
        engine = await SGLangEngine.connect(urls, router_url=router_url,
                                            tokenizer=load_tokenizer(build_tiny_model()))
        try:
            args = RolloutConfig(env="calc", max_turns=3, rollout_batch_size=8, n_samples_per_prompt=4,
                                 rollout_max_response_len=64, rollout_concurrency=32)
            runner = RolloutRunner.from_context(make_rollout_context(args, engine, env_factory(args)),
                                             load_data_source(args))
            rollout = asyncio.create_task(runner.generate(0))
            await asyncio.sleep(0.3)
            assert not rollout.done()
            procs[0].kill()
            batch = await rollout
            await runner.close()
            keys = [(s.group_id, s.index) for s in batch.samples]
            assert len(keys) == 32 and len(set(keys)) == 32
            assert {s.status for s in batch.samples} <= {Status.COMPLETED, Status.TRUNCATED}
            if router_url is None:
                assert engine.down == {urls[0]}
        finally:
            await engine.close()

    procs: list = []
    with servers(2, procs) as urls:
        if through_router:
            with router(urls) as router_url:
                asyncio.run(scenario(urls, router_url, procs))
        else:
            asyncio.run(scenario(urls, None, procs))


def test_fault_tolerance_restarts_a_dead_server_with_the_latest_weights(tmp_path):
    """Servers started as Ray actors under --use-fault-tolerance: one is killed mid-rollout; the
    rollout loses no sample, and the server comes back on its port serving the latest weights."""
    import ray

    from agentrl.placement.cluster import ClusterConfig, start_ray
    from agentrl.placement.servers import launch_servers
    from agentrl.rollout.config import RolloutConfig
    from tests.support.servers import rollout_with_a_server_killed

    cluster = ClusterConfig(rollout_num_gpus=2, use_fault_tolerance=True, rollout_health_check_interval=0.5)
    args = RolloutConfig(env="calc", max_turns=3, rollout_batch_size=8, n_samples_per_prompt=4,
                         rollout_max_response_len=64, rollout_concurrency=32, rollout_backend="sglang-compat",
                         router_policy="none")

    async def scenario() -> None:
        engine = await launch_servers(args, cluster, build_tiny_model())
        try:
            await engine.update_weights(path=str(build_tiny_model()), version="5")
            await rollout_with_a_server_killed(engine, args, restart_s=120)
            restarted = engine.servers.urls[0]
            with urllib.request.urlopen(f"{restarted}/model_info") as answer:
                assert json.load(answer)["weight_version"] == "5"
            got = await engine.generate([5, 6, 7], SEEDED, rid="after-t0")
            assert got.output_ids == await reference([5, 6, 7], SEEDED)
        finally:
            await engine.close()

    start_ray(cluster)
    try:
        asyncio.run(scenario())
    finally:
        ray.shutdown()


def test_a_server_that_never_comes_up_is_reported():
    async def scenario() -> None:
        with pytest.raises(EngineError, match="did not answer /health_generate"):
            await SGLangEngine.connect([f"http://127.0.0.1:{free_port()}"], wait_s=1.0)

    asyncio.run(scenario())


@pytest.mark.parametrize("weight_sync", ["tensor", "broadcast"])
def test_train_py_uses_already_running_servers(tmp_path, weight_sync):
    """--rollout-engine-urls: train.py starts no server; it plays, trains and pushes weights (as
    tensors, asynchronously: in flight while episodes run; or broadcast over a gloo group) to
    the ones it was given."""

    root = Path(__file__).resolve().parents[2]
    rm = tmp_path / "rm.py"  # every group's rewards differ: real gradients, so the weights move
    rm.write_text("def rm(args, sample):\n    return float(sample.index == 0)\n")
    with servers(1) as urls:
        done = subprocess.run(
            [sys.executable, str(root / "train.py"), "--env", "calc", "--rollout-batch-size", "2",
             "--n-samples-per-prompt", "2", "--max-turns", "2", "--rollout-max-response-len", "12",
             "--num-rollout", "2", "--no-use-ray", "--rollout-backend", "sglang-compat",
             "--rollout-engine-urls", *urls, "--weight-sync", weight_sync, "--output-dir", str(tmp_path / "run"),
             "--lr", "1e-2", "--custom-rm-path", str(rm), "--save-hf", str(tmp_path / "hf"),
             "--save-interval", "2", *(["--async-training"] if weight_sync == "tensor" else [])],
            cwd=tmp_path, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-3000:]
        with urllib.request.urlopen(f"{urls[0]}/model_info") as answer:
            assert json.load(answer)["weight_version"] == "2"  # the server outlives the run

        async def served_equals_trained() -> None:
            engine = await SGLangEngine.connect(urls)
            try:
                served = (await engine.generate([5, 6, 7], SEEDED, rid="probe-t0")).output_logprobs
            finally:
                await engine.close()
            trained = EmbeddedEngine.from_pretrained(tmp_path / "hf" / "rollout_00002")
            try:
                expected = (await trained.generate([5, 6, 7], SEEDED)).output_logprobs
            finally:
                await trained.close()
            assert served == pytest.approx(expected, abs=1e-5)
            untrained = EmbeddedEngine.from_pretrained(build_tiny_model())
            try:
                before = (await untrained.generate([5, 6, 7], SEEDED)).output_logprobs
            finally:
                await untrained.close()
            assert served != pytest.approx(before, abs=1e-5)  # training moved them

        asyncio.run(served_equals_trained())
    second = [json.loads(line) for line in
              (tmp_path / "run" / "trajectories" / "rollout_00001.jsonl").read_text().splitlines()]
    if weight_sync == "broadcast":
        assert {s["weight_version"] for s in second} == {"1"}
    for sample in second:  # the compatible server reports each token's version
        trained = [v for v, m in zip(sample["token_versions"], sample["loss_mask"], strict=True) if m]
        assert set(trained) <= ({1} if weight_sync == "broadcast" else {0, 1})
        assert "versions_inexact" not in sample["metadata"]
