"""On a CUDA machine, both server backends through one set of tests (``scripts/gpu-check.sh``
runs them): a real SGLang server (``pip install -e '.[gpu]'``) and a real vLLM server (``pip
install vllm``) on the tiny model, driven by our clients, started by agentrl's own command lines.

* step-0 log-prob agreement between the server and the bf16 Megatron trainer (mean |diff| <= 0.1,
  the reference systems' check);
* weight updates from disk round-trip (and, for SGLang, from tensors);
* a short colocated ``train.py`` run completes, each server releasing its memory while the
  trainer steps (SGLang's memory saver, vLLM's sleep mode).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from agentrl.engine.base import SamplingParams
from agentrl.engine.http import HTTPEngine
from agentrl.engine.model import read_checkpoint
from agentrl.engine.sglang import SGLangEngine
from agentrl.engine.vllm import VLLMEngine
from agentrl.models import build_tiny_model
from agentrl.placement.servers import _merged, server_command, vllm_defaults
from agentrl.records.sample import Sample, Status, Turn
from agentrl.rollout.config import RolloutConfig
from tests.support.distributed import free_port

REPO = Path(__file__).resolve().parents[2]
INSTALL = {"sglang": "pip install -e '.[gpu]'", "vllm": "pip install vllm"}
CLIENTS: dict[str, type[HTTPEngine]] = {"sglang": SGLangEngine, "vllm": VLLMEngine}
COLOCATED_FLAGS = {"sglang": ["--sglang-mem-fraction-static", "0.2", "--sglang-enable-memory-saver"],
                   "vllm": ["--vllm-gpu-memory-utilization", "0.2", "--vllm-enable-sleep-mode"]}


def command(backend: str, port: int) -> tuple[list[str], dict[str, str]]:
    if backend == "sglang":
        args = {"mem-fraction-static": "0.2", "skip-server-warmup": None}
        return server_command("sglang", build_tiny_model(), port=port, server_args=args, seed=0), {}
    args = _merged(vllm_defaults(RolloutConfig(env="calc"), gpu=True), {"gpu-memory-utilization": "0.2"})
    return (server_command("vllm", build_tiny_model(), port=port, server_args=args, seed=0),
            {"VLLM_SERVER_DEV_MODE": "1"})


@pytest.fixture(scope="module", params=["sglang", "vllm"])
def backend(request) -> str:
    if importlib.util.find_spec(request.param) is None:
        pytest.skip(f"{request.param} is not installed ({INSTALL[request.param]})")
    return request.param


@pytest.fixture(scope="module")
def server(backend) -> Iterator[str]:
    port = free_port()
    argv, env = command(backend, port)
    proc = subprocess.Popen(argv, env={**os.environ, **env}, start_new_session=True)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=120)


def test_server_and_the_bf16_trainer_agree_at_step_zero(backend, server):
    from agentrl.trainer.actor import MegatronActor
    from agentrl.trainer.config import TrainerConfig

    async def play() -> list[Sample]:
        engine = await CLIENTS[backend].connect([server], wait_s=600)
        try:
            prompts = [[1, 20 + i, 30, 40 + i, 2] for i in range(8)]
            outs = await asyncio.gather(*(engine.generate(p, SamplingParams(max_new_tokens=32), rid=f"s{i}-t0")
                                          for i, p in enumerate(prompts)))
        finally:
            await engine.close()
        return [Sample(group_id=i // 4, index=i % 4, tokens=p + o.output_ids, response_length=len(o.output_ids),
                       loss_mask=[1] * len(o.output_ids), rollout_log_probs=o.output_logprobs,
                       reward=float(i % 2), status=Status.COMPLETED,
                       turns=[Turn("assistant", 0, len(o.output_ids))])
                for i, (p, o) in enumerate(zip(prompts, outs, strict=True))]

    samples = asyncio.run(play())
    actor = MegatronActor(TrainerConfig(lr=1e-5, micro_batch_size=4), hf_checkpoint=build_tiny_model())
    metrics = actor.train(samples)
    print(json.dumps({"name": f"{backend}_vs_trainer_logprob_abs_diff", "value": metrics["logprob_abs_diff"]}))
    assert metrics["logprob_abs_diff"] <= 0.1


def test_weight_updates_round_trip(backend, server, tmp_path):
    from safetensors.torch import save_file

    halved_dir = tmp_path / "halved"
    halved_dir.mkdir()
    for item in build_tiny_model().iterdir():
        if item.suffix != ".safetensors":
            (halved_dir / item.name).write_bytes(item.read_bytes())
    halved = {k: (v * 0.5).contiguous() for k, v in read_checkpoint(build_tiny_model()).items()}
    save_file(halved, str(halved_dir / "model.safetensors"))

    async def scenario() -> None:
        engine = await CLIENTS[backend].connect([server], wait_s=600)
        greedy = SamplingParams(max_new_tokens=16, temperature=0.0)
        try:
            before = await engine.generate([1, 20, 30], greedy, rid="a-t0")
            await engine.update_weights(path=str(halved_dir), version="1")
            changed = await engine.generate([1, 20, 30], greedy, rid="b-t0")
            assert changed.weight_version == "1"
            assert changed.output_logprobs != pytest.approx(before.output_logprobs, abs=1e-3)
            if backend == "sglang":  # tensors: CUDA IPC to a server on the same GPU
                await engine.update_weights(state_dict=halved, version="2")
                assert (await engine.generate([1, 20, 30], greedy, rid="c-t0")).weight_version == "2"
            await engine.update_weights(path=str(build_tiny_model()), version="3")
            back = await engine.generate([1, 20, 30], greedy, rid="d-t0")
            assert back.weight_version == "3" and back.output_ids == before.output_ids
        finally:
            await engine.close()

    asyncio.run(scenario())


def test_short_colocated_training_run(backend, tmp_path):
    out = tmp_path / "run"
    done = subprocess.run(
        [sys.executable, str(REPO / "train.py"), "--env", "calc", "--rollout-batch-size", "4",
         "--n-samples-per-prompt", "4", "--max-turns", "2", "--rollout-max-response-len", "32", "--num-rollout", "2",
         "--rollout-backend", backend, "--colocate", *COLOCATED_FLAGS[backend], "--output-dir", str(out)],
        cwd=tmp_path, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = (out / "trajectories" / "rollout_00001.jsonl").read_text().splitlines()
    assert {json.loads(line)["weight_version"] for line in lines} == {"1"}
