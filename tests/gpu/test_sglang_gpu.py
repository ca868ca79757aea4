"""On a CUDA machine with SGLang installed (``pip install -e '.[gpu]'``): a real SGLang server on
the tiny model, driven by our client. Step-0 log-prob agreement between SGLang and the bf16
Megatron trainer (mean |diff| <= 0.1), weight updates from disk and from tensors round-trip, and
a short colocated ``train.py --rollout-backend sglang`` run completes."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest

from agentrl.models import build_tiny_model
from agentrl.rollout.engine.base import SamplingParams
from agentrl.rollout.engine.model import read_checkpoint
from agentrl.rollout.engine.sglang import SGLangEngine
from agentrl.rollout.sample import Sample, Status, Turn
from tests.support.distributed import free_port

pytest.importorskip("sglang", reason="SGLang is not installed (pip install -e '.[gpu]')")
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def server():
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "sglang.launch_server", "--model-path", str(build_tiny_model()),
                             "--host", "127.0.0.1", "--port", str(port), "--mem-fraction-static", "0.2",
                             "--random-seed", "0", "--skip-server-warmup"])
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(timeout=120)


def test_sglang_and_the_bf16_trainer_agree_at_step_zero(server):
    from agentrl.trainer.actor import MegatronActor
    from agentrl.trainer.config import TrainerConfig

    async def play() -> list[Sample]:
        engine = await SGLangEngine.connect([server], wait_s=600)
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
    print(json.dumps({"name": "sglang_vs_trainer_logprob_abs_diff", "value": metrics["logprob_abs_diff"]}))
    assert metrics["logprob_abs_diff"] <= 0.1


def test_weight_updates_round_trip(server, tmp_path):
    async def scenario() -> None:
        engine = await SGLangEngine.connect([server], wait_s=600)
        greedy = SamplingParams(max_new_tokens=16, temperature=0.0)
        try:
            before = await engine.generate([1, 20, 30], greedy, rid="a-t0")
            halved = {k: (v * 0.5).contiguous() for k, v in read_checkpoint(build_tiny_model()).items()}
            await engine.update_weights(state_dict=halved, version="1")
            changed = await engine.generate([1, 20, 30], greedy, rid="b-t0")
            assert changed.weight_version == "1"
            await engine.update_weights(path=str(build_tiny_model()), version="2")
            back = await engine.generate([1, 20, 30], greedy, rid="c-t0")
            assert back.weight_version == "2" and back.output_ids == before.output_ids
            assert changed.output_logprobs != pytest.approx(before.output_logprobs, abs=1e-3)
        finally:
            await engine.close()

    asyncio.run(scenario())


def test_short_colocated_training_run(tmp_path):
    out = tmp_path / "run"
    done = subprocess.run(
        [sys.executable, str(REPO / "train.py"), "--env", "calc", "--rollout-batch-size", "4",
         "--n-samples-per-prompt", "4", "--max-turns", "2", "--rollout-max-response-len", "32", "--num-rollout", "2",
         "--rollout-backend", "sglang", "--colocate", "--sglang-mem-fraction-static", "0.2",
         "--sglang-enable-memory-saver", "--output-dir", str(out)],
        cwd=tmp_path, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = (out / "trajectories" / "rollout_00001.jsonl").read_text().splitlines()
    assert {json.loads(line)["weight_version"] for line in lines} == {"1"}
