"""The embedded engine's reuse of earlier turns: tokens computed per turn and rollout time, with
the prefix store and without it (``--sglang-disable-radix-cache``), on the same model.

Each of ``--episodes`` concurrent episodes is shaped like a multi-turn tool episode: a prompt
of ``--prompt-len`` tokens, then ``--turns`` turns, each generating ``--new-tokens`` tokens
(greedy, end-of-sequence ignored) and appending an env reply of ``--reply-len`` tokens, so turn
k's prompt is turn k-1's prompt, its output and the reply, as in a token-in/token-out rollout.
The two engines run the same episodes one after the other, alternating over ``--repeats``.

    python bench/prefix_cache.py [--model smollm2-135m-instruct] [--episodes 8] [--turns 5]
        [--prompt-len 1024] [--new-tokens 32] [--reply-len 128] [--repeats 2]

Prints per-turn prompt tokens and computed tokens, then JSON lines
``{"name": "prefix_cache_tokens_recomputed_per_turn", ...}`` (turns after the first: positions
computed that an earlier turn had computed already; 0 is perfect reuse) and
``{"name": "prefix_cache_rollout_speedup", ...}`` (time without / with the store).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import time

from agentrl.engine import EmbeddedEngine, SamplingParams
from agentrl.engine.embedded import DEFAULT_PREFIX_CACHE_BYTES
from agentrl.models.catalog import resolve_checkpoint


async def play(engine: EmbeddedEngine, episodes: int, turns: int, prompt_len: int,
               new_tokens: int, reply_len: int, vocab: int) -> tuple[float, list[dict]]:
    """Plays the episodes; returns the wall time and, per turn, prompt and computed tokens."""
    rng = random.Random(0)
    sampling = SamplingParams(max_new_tokens=new_tokens, temperature=0.0, ignore_eos=True)
    contexts = [[rng.randrange(100, vocab) for _ in range(prompt_len)] for _ in range(episodes)]
    replies = [[[rng.randrange(100, vocab) for _ in range(reply_len)] for _ in range(turns)]
               for _ in range(episodes)]
    per_turn = []
    start = time.perf_counter()
    for turn in range(turns):
        before = engine.stats()
        outputs = await asyncio.gather(*(engine.generate(c, sampling) for c in contexts))
        after = engine.stats()
        per_turn.append({
            "turn": turn + 1,
            "prompt_tokens": after["prompt_tokens"] - before["prompt_tokens"],
            "computed": after["prompt_tokens_computed"] - before["prompt_tokens_computed"],
            "reused": sum(o.cached_tokens for o in outputs),
        })
        # what an earlier turn computed already: the previous context and all but the last output
        for i, out in enumerate(outputs):
            contexts[i] = [*contexts[i], *out.output_ids, *replies[i][turn]]
    return time.perf_counter() - start, per_turn


async def main_async(args: argparse.Namespace) -> None:
    model = resolve_checkpoint(args.model)
    engines = {
        "with the store": EmbeddedEngine.from_pretrained(model, max_batch_size=args.episodes,
                                                         prefix_cache_bytes=DEFAULT_PREFIX_CACHE_BYTES),
        "without": EmbeddedEngine.from_pretrained(model, max_batch_size=args.episodes,
                                                  prefix_cache_bytes=0),
    }
    vocab = engines["without"].model.config.vocab_size
    times: dict[str, list[float]] = {name: [] for name in engines}
    turns: dict[str, list[dict]] = {}
    try:
        for _ in range(args.repeats):
            for name, engine in engines.items():
                seconds, turns[name] = await play(engine, args.episodes, args.turns, args.prompt_len,
                                                  args.new_tokens, args.reply_len, vocab)
                times[name].append(seconds)
                await engine.release_memory()  # each repeat starts with an empty store
                print(f"{name:15s} {seconds:7.1f} s", flush=True)
    finally:
        for engine in engines.values():
            await engine.close()
    for name, rows in turns.items():
        print(f"{name}:")
        for row in rows:
            print(f"  turn {row['turn']}: {row['prompt_tokens']:6d} prompt tokens, "
                  f"{row['computed']:6d} computed, {row['reused']:6d} reused")
    later = turns["with the store"][1:]
    # per episode and turn: computed beyond what the turn added (its reply and the last output)
    added = args.reply_len + 1
    recomputed = statistics.mean(r["computed"] / args.episodes - added for r in later)
    without = statistics.mean(r["computed"] / args.episodes - added for r in turns["without"][1:])
    speedup = statistics.median(times["without"]) / statistics.median(times["with the store"])
    print(json.dumps({"name": "prefix_cache_tokens_recomputed_per_turn", "value": round(recomputed, 1),
                      "target": "report", "without_the_store": round(without, 1),
                      "added_per_turn": added}))
    print(json.dumps({"name": "prefix_cache_rollout_speedup", "value": round(speedup, 3),
                      "target": "report", "seconds_with": round(statistics.median(times["with the store"]), 1),
                      "seconds_without": round(statistics.median(times["without"]), 1)}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--episodes", type=int, default=8)
    parser.add_argument("--turns", type=int, default=5)
    parser.add_argument("--prompt-len", type=int, default=1024)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--reply-len", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=2)
    asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    main()
