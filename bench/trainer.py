"""Train-step throughput of the Megatron actor against plain torch on the same model and batch.

One GRPO step (forward, per-token log-probs at the rollout temperature, clipped policy loss,
backward, gradient clipping, Adam) on a batch of ``--samples`` sequences of up to ``--seq-len``
tokens (``--lengths rl``, the default: prompt and response lengths vary as in a rollout batch,
see :func:`make_samples`; ``fixed``: all ``--seq-len``), in ``--micro-batch-size``
micro-batches (the actor packs each: its rows concatenated without padding); tokens/s counts
real tokens, and ``padding_fraction`` is the share of the actor's computed positions that are
padding:

* megatron: ``MegatronActor.train`` (megatron-core GPTModel, DDP, Megatron optimizer, our
  vocab-parallel log-probs, advantages by group id);
* torch: the equivalent transformers model (same weights), the same loss written inline,
  ``torch.optim.AdamW`` and ``clip_grad_norm_``.

Rounds alternate between the two in one process; the headline is the ratio of median tokens/s,
``trainer_vs_torch_tokens_per_s`` (target >= 1.0 on CPU, >= 1.2 on CUDA). Peak memory (max RSS) of each is
measured in a separate child process per side (RSS never shrinks within a process), as the peak
RSS over the process's RSS after importing the libraries, while building the model and stepping.

``--device cuda`` (a GPU machine): a ~0.5B-parameter Qwen2-shaped random model in bf16, and
``trainer_mfu`` = model FLOPs per second (6 x parameters x tokens, plus attention) / the GPU's
bf16 matmul rate measured first by this script. On CPU the same figure is
``trainer_cpu_peak_fraction``: over the CPU's matmul rate in the run's dtype, measured the same
way (2048^3, torch's threads).

``--bf16`` trains in bfloat16 on both sides (the actor's ``--bf16``: bf16 parameters, fp32
masters; torch: autocast to bf16 over fp32 parameters). ``--lora-rank R`` trains LoRA adapters
on every linear layer on both sides (the actor's ``--lora-rank``; torch: peft's LoRA), and the
model FLOPs count 4 instead of 6 x parameters (no weight gradients for the frozen base).

    python bench/trainer.py [--samples 16] [--seq-len 256] [--micro-batch-size 4] [--rounds 5]
        [--model DIR] [--bf16] [--lora-rank R]
    python bench/trainer.py --device cuda
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from _memory import peak_rss_mib

from agentrl.models import build_tiny_model
from agentrl.records.sample import Sample, Status, Turn

TEMPERATURE = 1.0
GPU_CONFIG = {  # ~0.5B parameters, Qwen2.5-0.5B's shape
    "model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"], "vocab_size": 151936,
    "hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24,
    "num_attention_heads": 14, "num_key_value_heads": 2, "max_position_embeddings": 4096,
    "rope_theta": 1000000.0, "rms_norm_eps": 1e-6, "tie_word_embeddings": True,
    "torch_dtype": "bfloat16", "hidden_act": "silu",
}


def make_samples(count: int, seq_len: int, vocab: int, lengths: str = "rl",
                 prompt_len: int = 32) -> list[Sample]:
    """``count`` samples in groups of 4 of at most ``seq_len`` tokens.

    ``lengths="fixed"``: every sample ``seq_len`` tokens, ``prompt_len`` of them prompt.
    ``lengths="rl"``: shaped like a multi-turn rollout batch: each group's prompt drawn from
    ``[seq_len / 8, seq_len / 2]`` tokens, each sample's response from ``[seq_len / 16, seq_len
    - prompt]`` (uniform, seed 0), so that samples of one micro-batch differ in length as they do
    in RL.
    """
    generator = torch.Generator().manual_seed(0)

    def uniform(low: int, high: int) -> int:
        return int(torch.randint(low, max(low, high) + 1, (1,), generator=generator))

    out = []
    prompt: list[int] = []
    for i in range(count):
        if i % 4 == 0:
            size = prompt_len if lengths == "fixed" else uniform(seq_len // 8, seq_len // 2)
            prompt = torch.randint(10, vocab, (size,), generator=generator).tolist()
        n = seq_len - len(prompt) if lengths == "fixed" else uniform(seq_len // 16, seq_len - len(prompt))
        response = torch.randint(10, vocab, (n,), generator=generator).tolist()
        out.append(Sample(group_id=i // 4, index=i % 4, tokens=prompt + response, response_length=n,
                          loss_mask=[1] * n, rollout_log_probs=[-1.0] * n, reward=float(i % 2),
                          status=Status.COMPLETED, turns=[Turn("assistant", 0, n)]))
    return out


def padding_fraction(samples: list[Sample], micro: int) -> float:
    """The share of the positions the trainer computes that are padding: each micro-batch of
    ``micro`` rows (the actor's order) is padded to its longest row."""
    computed = real = 0
    for start in range(0, len(samples), micro):
        rows = [len(s.tokens) for s in samples[start : start + micro]]
        computed += len(rows) * max(rows)
        real += sum(rows)
    return 1.0 - real / computed


def measured_padding_fraction(actor: Any, samples: list[Sample]) -> float:
    """The share of the positions the actor's model computes over ``samples`` (one log-prob
    pass, the micro-batches a step uses) that are padding, counted at the embedding's input."""
    from agentrl.trainer.hf_convert import unwrap_model

    computed = [0]

    def count(module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        computed[0] += (args[0] if args else kwargs["input_ids"]).numel()

    handle = unwrap_model(actor.model).embedding.register_forward_pre_hook(count, with_kwargs=True)
    try:
        actor.logprobs(samples)
    finally:
        handle.remove()
    return 1.0 - sum(len(s.tokens) for s in samples) / computed[0]


def torch_step_fn(model_dir: Path, samples: list[Sample], micro: int, lr: float, device: str,
                  bf16: bool = False, lora_rank: int = 0):
    """The plain-torch step: returns a function doing one optimizer step over ``samples``."""
    import contextlib

    from transformers import AutoModelForCausalLM

    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).to(device).train()
    if lora_rank:
        import peft

        model = peft.get_peft_model(model, peft.LoraConfig(
            r=lora_rank, lora_alpha=16, target_modules="all-linear", lora_dropout=0.0))
    autocast = (functools.partial(torch.autocast, "cpu", dtype=torch.bfloat16)
                if bf16 and device == "cpu" else contextlib.nullcontext)
    trained = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trained, lr=lr, betas=(0.9, 0.98), weight_decay=0.0)
    longest = max(len(s.tokens) for s in samples)  # a padded batch (right padding, mask 0)
    tokens = torch.tensor([s.tokens + [0] * (longest - len(s.tokens)) for s in samples], device=device)
    rewards = torch.tensor([s.reward for s in samples], device=device)
    groups = torch.tensor([s.group_id for s in samples], device=device)
    mask = torch.zeros(tokens.shape[0], tokens.shape[1] - 1, device=device)
    for row, s in enumerate(samples):
        mask[row, s.prompt_length - 1 : s.prompt_length - 1 + s.response_length] = 1.0

    def step() -> None:
        # GRPO advantages (the same formula, inline)
        adv = torch.zeros_like(rewards)
        for g in groups.unique():
            r = rewards[groups == g]
            adv[groups == g] = (r - r.mean()) / (r.std() + 1e-6)
        optimizer.zero_grad(set_to_none=True)
        denominator = mask.sum()
        for start in range(0, tokens.shape[0], micro):
            ids = tokens[start : start + micro]
            with autocast():
                logits = model(input_ids=ids).logits[:, :-1].float() / TEMPERATURE
            logp = logits.log_softmax(-1).gather(-1, ids[:, 1:, None])[..., 0]
            ratio = torch.exp(logp - logp.detach())
            a = adv[start : start + micro, None]
            pg = torch.maximum(-ratio * a, -ratio.clamp(0.8, 1.2) * a)
            loss = (pg * mask[start : start + micro]).sum() / denominator
            loss.backward()
        torch.nn.utils.clip_grad_norm_(trained, 1.0)
        optimizer.step()

    return step


def megatron_step_fn(model_dir: Path, samples: list[Sample], micro: int, lr: float,
                     max_tokens: int | None = None, bf16: bool | None = None, lora_rank: int = 0):
    """The Megatron actor's step; ``max_tokens``: packed micro-batches of that many real tokens
    (``--use-dynamic-batch-size --max-tokens-per-gpu``) instead of ``micro`` padded rows."""
    from agentrl.trainer.actor import MegatronActor
    from agentrl.trainer.config import TrainerConfig

    flags: dict[str, Any] = ({"use_dynamic_batch_size": True, "max_tokens_per_gpu": max_tokens}
                             if max_tokens else {"micro_batch_size": micro})
    flags.update(bf16=bf16, lora_rank=lora_rank)
    actor = MegatronActor(TrainerConfig(lr=lr, clip_grad=1.0, **flags),
                          hf_checkpoint=model_dir, rollout_temperature=TEMPERATURE)
    return actor, lambda: actor.train(samples)


def timed(fn) -> float:
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    start = time.perf_counter()
    fn()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return time.perf_counter() - start


def model_dir_for(args: argparse.Namespace) -> Path:
    if args.device != "cuda":
        return Path(args.model) if args.model else build_tiny_model()
    from transformers import Qwen2Config, Qwen2ForCausalLM

    folder = Path(tempfile.mkdtemp(prefix="agentrl-bench-"))
    torch.manual_seed(0)
    Qwen2ForCausalLM(Qwen2Config(**GPU_CONFIG)).to(torch.bfloat16).save_pretrained(folder)
    return folder


def matmul_flops(device: str = "cuda", dtype: torch.dtype = torch.bfloat16) -> float:
    """The device's measured matmul rate (FLOP/s): 8192^3 on a GPU, 2048^3 on a CPU (torch's
    threads), best of a few."""
    n = 8192 if device == "cuda" else 2048
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    for _ in range(3):
        a @ b
    seconds = min(timed(lambda: a @ b) for _ in range(10 if device == "cuda" else 5))
    return 2 * n**3 / seconds


def model_flops_per_token(model_dir: Path, config: dict[str, Any], seq_len: int, lora: bool) -> float:
    """Training FLOPs per token: 6 x parameters (4 with a frozen base: no weight gradients) plus
    attention's 12 x layers x hidden x sequence."""
    from transformers import AutoModelForCausalLM

    params = sum(p.numel() for p in AutoModelForCausalLM.from_pretrained(model_dir).parameters())
    layers, hidden = config["num_hidden_layers"], config["hidden_size"]
    return (4 if lora else 6) * params + 12 * layers * hidden * seq_len


def child(args: argparse.Namespace) -> None:
    """One side alone: its peak RSS while building the model and taking two steps, over the RSS
    it had before (interpreter, torch and the libraries both sides import)."""
    model_dir = model_dir_for(args)
    vocab = json.loads((model_dir / "config.json").read_text())["vocab_size"]
    samples = make_samples(args.samples, args.seq_len, vocab, args.lengths)
    import megatron.core  # noqa: F401 - both sides pay for the imports before the baseline
    import transformers  # noqa: F401

    def work() -> None:
        fn = (megatron_step_fn(model_dir, samples, args.micro_batch_size, 1e-5, args.max_tokens_per_gpu,
                               args.bf16 or None, args.lora_rank)[1]
              if args.child == "megatron"
              else torch_step_fn(model_dir, samples, args.micro_batch_size, 1e-5, args.device,
                                 args.bf16, args.lora_rank))
        for _ in range(2):
            fn()

    print(json.dumps({"peak_over_base_mib": peak_rss_mib(work)}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=16)
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--micro-batch-size", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--max-tokens-per-gpu", type=int, default=None,
                        help="the Megatron side packs micro-batches of this many real tokens "
                        "(--use-dynamic-batch-size); default: --micro-batch-size padded rows")
    parser.add_argument("--lengths", default="rl", choices=["rl", "fixed"],
                        help="rl: variable prompt and response lengths, as in a rollout batch; "
                        "fixed: every sample --seq-len tokens")
    parser.add_argument("--model", default=None, help="HF model directory (default: tiny model)")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--bf16", action="store_true", help="train in bfloat16 on both sides")
    parser.add_argument("--lora-rank", type=int, default=0, help="train LoRA adapters of this rank")
    parser.add_argument("--skip-memory", action="store_true", help="skip the peak-memory children")
    parser.add_argument("--child", choices=["megatron", "torch"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(args)

    model_dir = model_dir_for(args)
    config = json.loads((model_dir / "config.json").read_text())
    samples = make_samples(args.samples, args.seq_len, config["vocab_size"], args.lengths)
    tokens = sum(len(s.tokens) for s in samples)  # real tokens: padding is not throughput
    actor, megatron = megatron_step_fn(model_dir, samples, args.micro_batch_size, 1e-5,
                                       args.max_tokens_per_gpu, args.bf16 or None, args.lora_rank)
    plain = torch_step_fn(model_dir, samples, args.micro_batch_size, 1e-5, args.device, args.bf16,
                          args.lora_rank)
    megatron(), plain()  # warm-up
    rates: dict[str, list[float]] = {"megatron": [], "torch": []}
    for _ in range(args.rounds):
        rates["megatron"].append(tokens / timed(megatron))
        rates["torch"].append(tokens / timed(plain))
        print(f"megatron {rates['megatron'][-1]:8.0f} tok/s   torch {rates['torch'][-1]:8.0f} tok/s")
    median = {k: statistics.median(v) for k, v in rates.items()}
    memory = {}
    if args.device == "cpu" and not args.skip_memory:
        for side in ("megatron", "torch"):
            run = subprocess.run([sys.executable, __file__, "--child", side, "--samples",
                                  str(args.samples), "--seq-len", str(args.seq_len),
                                  "--lengths", args.lengths,
                                  *(["--max-tokens-per-gpu", str(args.max_tokens_per_gpu)]
                                    if args.max_tokens_per_gpu else []),
                                  "--micro-batch-size", str(args.micro_batch_size),
                                  *(["--bf16"] if args.bf16 else []),
                                  "--lora-rank", str(args.lora_rank),
                                  *(["--model", args.model] if args.model else [])],
                                 capture_output=True, text=True, check=True)
            memory[side] = json.loads(run.stdout.strip().splitlines()[-1])["peak_over_base_mib"]
        print(f"peak memory over the libraries' baseline: megatron {memory['megatron']:.0f} MiB, "
              f"torch {memory['torch']:.0f} MiB")
        print(json.dumps({"name": "trainer_peak_mem_mib", "value": {k: round(v) for k, v in memory.items()}}))
    flops_per_token = model_flops_per_token(model_dir, config, args.seq_len, bool(args.lora_rank))
    if args.device == "cuda":
        mfu = median["megatron"] * flops_per_token / matmul_flops()
        print(json.dumps({"name": "trainer_mfu", "value": round(mfu, 3), "target": ">= 0.35"}))
    else:
        dtype = torch.bfloat16 if args.bf16 else torch.float32
        peak = matmul_flops("cpu", dtype)
        print(json.dumps({"name": "trainer_cpu_peak_fraction",
                          "value": round(median["megatron"] * flops_per_token / peak, 3),
                          "target": "report", "cpu_matmul_gflops": round(peak / 1e9, 1),
                          "dtype": str(dtype).removeprefix("torch."),
                          "megatron_tokens_per_s": round(median["megatron"]),
                          "torch_tokens_per_s": round(median["torch"])}))
    # the plain-torch side pads each micro-batch to its longest row, as the actor did before
    print(json.dumps({"name": "padding_fraction", "value": round(measured_padding_fraction(actor, samples), 3),
                      "target": "< 0.05",
                      "padded_micro_batches_would_be": round(padding_fraction(samples, args.micro_batch_size), 3),
                      "micro_batches": len(actor._micro(actor._as_batch(samples)))}))
    ratio = median["megatron"] / median["torch"]
    print(json.dumps({"name": "trainer_vs_torch_tokens_per_s", "value": round(ratio, 3),
                      "target": ">= 1.2" if args.device == "cuda" else ">= 1.0"}))


if __name__ == "__main__":
    main()
