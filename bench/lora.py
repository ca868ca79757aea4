"""LoRA against full fine-tuning on the Megatron actor (CPU): optimizer state, peak memory, step
time and the bytes one weight update sends to the engines.

Per model (the tiny model, and with ``--half-b`` a random Qwen2.5-0.5B-shaped model), each side in
a child process of its own so peak memory is its own: one GRPO step on the same batch with full
fine-tuning and with ``--lora-rank`` adapters on every linear layer. Prints per side the optimizer
state (Adam's moments, and fp32 master copies where the optimizer keeps them), the peak resident
memory over the libraries' baseline, the step time, and the weight-sync payload: the merged
Hugging Face state dict (what the disk, tensor and object-store paths send) against the adapters
alone (what an engine that loads adapters natively would take).

Headline figures (one JSON line each): ``lora_optimizer_state_fraction`` (LoRA / full optimizer
bytes, per model; report), ``lora_step_time_ratio`` (LoRA / full step seconds; report),
``lora_sync_bytes_fraction`` (adapter / merged bytes per update; report) and, with ``--vllm``,
``lora_vllm_update_s`` (seconds of one update to a vLLM server, adapters alone and merged).

    python bench/lora.py [--rank 8] [--half-b] [--vllm] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from _memory import peak_rss_mib

from agentrl.models import build_tiny_model

HALF_B = {  # Qwen2.5-0.5B's shape
    "model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"], "vocab_size": 151936,
    "hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24,
    "num_attention_heads": 14, "num_key_value_heads": 2, "max_position_embeddings": 4096,
    "rope_theta": 1000000.0, "rms_norm_eps": 1e-6, "tie_word_embeddings": True, "hidden_act": "silu",
}


def model_dir(name: str, root: Path) -> Path:
    if name == "tiny":
        return build_tiny_model()
    import transformers

    out = root / "half-b"
    if not (out / "model.safetensors").is_file():
        config = transformers.Qwen2Config(**{k: v for k, v in HALF_B.items() if k not in ("model_type", "architectures")})
        transformers.Qwen2ForCausalLM(config).save_pretrained(out)
    return out


def samples(count: int, length: int):
    from agentrl.records.sample import Sample, Status, Turn

    generator = torch.Generator().manual_seed(0)
    out = []
    for i in range(count):
        n = length // 2
        tokens = torch.randint(3, 4000, (length,), generator=generator).tolist()  # within the tiny vocabulary
        out.append(Sample(group_id=i // 2, index=i % 2, tokens=tokens, response_length=n, loss_mask=[1] * n,
                          rollout_log_probs=[-1.0] * n, reward=float(i % 2), status=Status.COMPLETED,
                          turns=[Turn("assistant", 0, n)]))
    return out


def child(args: argparse.Namespace) -> None:
    """One side: build, warm up, time ``--rounds`` steps, report as one JSON line."""
    from agentrl.trainer.actor import MegatronActor
    from agentrl.trainer.config import TrainerConfig
    from agentrl.trainer.hf_weights import export_lora_state_dict

    flags = {"lr": 1e-5, "micro_batch_size": 2}
    if args.child == "lora":
        flags.update(lora_rank=args.rank, lora_alpha=2.0 * args.rank)
    batch = samples(args.samples, args.length)
    made: dict[str, object] = {}
    times: list[float] = []

    def work() -> None:  # the model, its optimizer's state and the steps: what the run holds
        made["actor"] = actor = MegatronActor(TrainerConfig(**flags), hf_checkpoint=args.model,
                                              total_steps=args.rounds + 1)
        actor.train(batch)  # warm-up: the optimizer's state exists from here on
        for _ in range(args.rounds):
            start = time.perf_counter()
            actor.train(batch)
            times.append(time.perf_counter() - start)

    peak = peak_rss_mib(work)
    actor = made["actor"]
    state_bytes = 0
    for inner in getattr(actor.optimizer, "chained_optimizers", [actor.optimizer]):
        torch_optimizer = inner.optimizer  # megatron's wrapper around torch's Adam
        for per_param in torch_optimizer.state.values():
            for value in per_param.values():
                if torch.is_tensor(value) and value.dim() > 0:  # Adam's moments, not its step count
                    state_bytes += value.numel() * value.element_size()
    merged = sum(t.numel() * t.element_size() for t in actor.hf_state_dict().values())
    adapters = (sum(t.numel() * t.element_size() for t in export_lora_state_dict(actor.model).values())
                if args.child == "lora" else 0)
    trainable = sum(p.numel() for p in actor.model.parameters() if p.requires_grad)
    print(json.dumps({"optimizer_state_bytes": state_bytes, "peak_over_base_mib": peak,
                      "step_s": statistics.median(times), "merged_sync_bytes": merged,
                      "adapter_sync_bytes": adapters, "trainable_params": trainable}))


def run_side(side: str, model: Path, args: argparse.Namespace) -> dict:
    command = [sys.executable, __file__, "--child", side, "--model", str(model), "--rank", str(args.rank),
               "--rounds", str(args.rounds), "--samples", str(args.samples), "--length", str(args.length)]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{side} on {model} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def vllm_update_seconds(rank: int, pushes: int) -> dict[str, float]:
    """Median seconds of one weight update to a vLLM server (started with --enable-lora) for the
    tiny model's LoRA policy: the adapters alone (``--weight-sync adapter``) and the merged
    weights through disk (``--weight-sync disk``), each written, loaded and in service."""
    import asyncio

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from agentrl.engine.vllm import VLLMEngine
    from agentrl.placement.servers import vllm_lora_args
    from agentrl.run.weights import AdapterSync, DiskSync
    from agentrl.trainer.actor import MegatronActor
    from agentrl.trainer.config import TrainerConfig
    from tests.support.vllm import vllm_server

    actor = MegatronActor(TrainerConfig(lr=1e-3, lora_rank=rank, lora_alpha=2.0 * rank),
                          hf_checkpoint=build_tiny_model(), total_steps=2)
    actor.train(samples(8, 128))
    with tempfile.TemporaryDirectory() as tmp, vllm_server(
            Path(tmp) / "vllm.log", server_args=vllm_lora_args(rank),
            env={"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"}) as url:
        async def measure() -> dict[str, float]:
            engine = await VLLMEngine.connect([url])
            try:
                out = {}
                for name, sync in (("adapter", AdapterSync(engine, actor, Path(tmp) / "adapter")),
                                   ("merged", DiskSync(engine, actor, Path(tmp) / "merged"))):
                    times = []
                    for version in range(1, pushes + 1):
                        start = time.perf_counter()
                        await sync.push(str(version))
                        times.append(time.perf_counter() - start)
                    out[name] = round(statistics.median(times), 3)
                return out
            finally:
                await engine.close()

        return asyncio.run(measure())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rank", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--length", type=int, default=128)
    parser.add_argument("--half-b", action="store_true", help="also the 0.5B-shaped model (minutes, ~10 GB)")
    parser.add_argument("--vllm", action="store_true",
                        help="also time one weight update to a vLLM server: adapters alone vs merged weights")
    parser.add_argument("--child", choices=["full", "lora"], help=argparse.SUPPRESS)
    parser.add_argument("--model", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(args)
    fractions, ratios, sync = {}, {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in ["tiny", *(["0.5B"] if args.half_b else [])]:
            model = model_dir("tiny" if name == "tiny" else "half-b", Path(tmp))
            full, lora = run_side("full", model, args), run_side("lora", model, args)
            print(f"{name}: optimizer state {full['optimizer_state_bytes'] / 2**20:.1f} MiB full, "
                  f"{lora['optimizer_state_bytes'] / 2**20:.2f} MiB LoRA r={args.rank} "
                  f"({lora['trainable_params']:,} of {full['trainable_params']:,} parameters trained); "
                  f"peak {full['peak_over_base_mib']:.0f} vs {lora['peak_over_base_mib']:.0f} MiB; "
                  f"step {full['step_s']:.3f} vs {lora['step_s']:.3f} s; sync {full['merged_sync_bytes'] / 2**20:.1f} MiB "
                  f"merged vs {lora['adapter_sync_bytes'] / 2**20:.2f} MiB adapters")
            fractions[name] = round(lora["optimizer_state_bytes"] / full["optimizer_state_bytes"], 5)
            ratios[name] = round(lora["step_s"] / full["step_s"], 3)
            sync[name] = round(lora["adapter_sync_bytes"] / lora["merged_sync_bytes"], 5)
            print(json.dumps({"name": f"lora_peak_mem_mib_{name}", "value": {
                "full": round(full["peak_over_base_mib"]), "lora": round(lora["peak_over_base_mib"])}}))
    print(json.dumps({"name": "lora_optimizer_state_fraction", "value": fractions, "target": "report"}))
    print(json.dumps({"name": "lora_step_time_ratio", "value": ratios, "target": "report"}))
    print(json.dumps({"name": "lora_sync_bytes_fraction", "value": sync, "target": "report"}))
    if args.vllm:
        seconds = vllm_update_seconds(args.rank, pushes=3)
        print(f"vLLM update (tiny model): adapters alone {seconds['adapter']} s, merged weights {seconds['merged']} s")
        print(json.dumps({"name": "lora_vllm_update_s", "value": seconds, "target": "report"}))


if __name__ == "__main__":
    main()
