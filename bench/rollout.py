"""Rollout throughput: concurrent episodes against the ideal critical path and slime's loop,
and the embedded engine against transformers' ``generate()``.

(a) ``--episodes`` (64) episodes x 3 turns on the built-in tiny model (real sampling, 16 new
tokens a turn, counted as a finished turn), each turn's tool taking 100 ms (an async sleep; a
random-init model writes no tool calls, so a forced tool-call format reads every turn as a call
to it):

* ``rollout_wall_over_ideal``: wall time of the episode runner / the ideal critical path. The
  ideal is what a perfect scheduler would need: for each turn, the engine generating all the
  episodes' requests as one concurrent batch (measured right after, on the very inputs the run
  produced, with nothing else running), plus the 100 ms tool. Target <= 1.15.
* ``rollout_speedup_vs_sequential``: wall time of slime's custom-generate loop (one sample
  at a time: generate, tool, generate, ...; ``examples/custom_generate.py``) / the runner's.

(b) ``engine_vs_hf_generate``: engine tokens/s at 16 concurrent requests / transformers
``generate()`` on the same model and prompts (``bench/engine_throughput.py``). Target >= 2.

``--backend vllm`` plays (a) against a real vLLM server started here (the ideal critical path is
measured on that server too), and reports ``rollout_wall_over_ideal`` with ``"backend":
"vllm"``; (b) is then left out.

    python bench/rollout.py [--episodes 64] [--skip-sequential] [--backend embedded|vllm]
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import statistics
import sys
import time
from pathlib import Path

import agentrl
from agentrl.chat import ChatRenderer
from agentrl.engine import EmbeddedEngine, Engine, SamplingParams
from agentrl.models import build_tiny_model
from agentrl.records.sample import Sample
from agentrl.rollout.config import RolloutConfig
from agentrl.rollout.custom import load_custom_generate, run_custom_generate
from agentrl.rollout.episode import Episode, RolloutContext

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from tests.support.engines import EveryTurnCalls, FixedLengthTurns  # noqa: E402

TOOL_S = 0.1
TURNS = 3
NEW_TOKENS = 16


@agentrl.tool
async def wait() -> str:
    """Waits 100 ms, like a quick tool (a test run, a file read)."""
    await asyncio.sleep(TOOL_S)
    return "ok"


class WaitEnv(agentrl.ToolEnv):
    tools = [wait]

    def make_prompt(self, task):
        return [{"role": "user", "content": f"Task {task['i']}: call wait, then report."}]

    def compute_reward(self, task, final, state):
        return 0.0


def context(engine: Engine) -> RolloutContext:
    renderer = ChatRenderer(engine.tokenizer, EveryTurnCalls("wait"))
    sampling = SamplingParams(max_new_tokens=NEW_TOKENS, ignore_eos=True)
    factory = lambda: WaitEnv(max_turns=TURNS, tool_call_format=EveryTurnCalls("wait"))  # noqa: E731
    return RolloutContext(RolloutConfig(max_turns=TURNS), FixedLengthTurns(engine), renderer, sampling, 1024,
                          factory)


async def concurrent_run(ctx: RolloutContext, n: int) -> tuple[float, list[Sample]]:
    samples = [Sample(group_id=i, metadata={"task": {"i": i}}) for i in range(n)]
    started = time.perf_counter()
    await asyncio.gather(*(Episode(ctx, s, f"ep{s.group_id}").run() for s in samples))
    return time.perf_counter() - started, samples


async def ideal_critical_path(engine: Engine, samples: list[Sample]) -> float:
    """Per turn: one concurrent batch of every episode's request for that turn, then the tool."""
    total = 0.0
    sampling = SamplingParams(max_new_tokens=NEW_TOKENS, ignore_eos=True)
    for turn in range(TURNS):
        inputs = []
        for s in samples:
            starts = [t.start for t in s.turns if t.role == "assistant"]
            inputs.append(s.tokens[: s.prompt_length + starts[turn]])
        started = time.perf_counter()
        await asyncio.gather(*(engine.generate(ids, sampling) for ids in inputs))
        total += time.perf_counter() - started + TOOL_S
    return total


async def sequential_run(ctx: RolloutContext, n: int) -> float:
    """slime's custom-generate loop over all samples, one at a time."""
    fn = load_custom_generate(str(ROOT / "examples" / "custom_generate.py"))
    samples = [Sample(group_id=0, index=i, metadata={"task": {"i": i}}) for i in range(n)]
    started = time.perf_counter()
    await run_custom_generate(fn, ctx, samples, "seq")
    elapsed = time.perf_counter() - started
    bad = [s for s in samples if s.metadata.get("turns") != TURNS]
    if bad:
        raise RuntimeError(f"the sequential loop played {bad[0].metadata.get('turns')} turns")
    return elapsed


def engine_vs_hf(model_dir: Path) -> float:
    spec = importlib.util.spec_from_file_location("engine_throughput", ROOT / "bench" / "engine_throughput.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["engine_throughput"] = module
    spec.loader.exec_module(module)
    return module.engine_vs_hf_generate(model_dir)["ratio"]


async def rollout_figures(args: argparse.Namespace) -> dict[str, float]:
    if args.backend == "vllm":
        import tempfile

        from agentrl.engine.embedded import load_tokenizer
        from agentrl.engine.vllm import VLLMEngine
        from tests.support.vllm import vllm_server

        with tempfile.TemporaryDirectory() as tmp, vllm_server(Path(tmp) / "vllm.log") as url:
            engine = await VLLMEngine.connect([url], tokenizer=load_tokenizer(build_tiny_model()),
                                              concurrency=args.episodes)
            return await figures_on(engine, args)
    engine = EmbeddedEngine.from_pretrained(build_tiny_model(), max_batch_size=args.episodes)
    return await figures_on(engine, args)


async def figures_on(engine: Engine, args: argparse.Namespace) -> dict[str, float]:
    """The rollout figures on ``engine`` (closed at the end)."""
    try:
        ctx = context(engine)
        await concurrent_run(ctx, 8)  # warm-up
        ratios, walls = [], []
        for _ in range(args.repeats):
            wall, samples = await concurrent_run(ctx, args.episodes)
            assert all(s.metadata["turns"] == TURNS for s in samples), "episodes must play 3 turns"
            ideal = await ideal_critical_path(engine, samples)
            ratios.append(wall / ideal)
            walls.append(wall)
            print(f"runner: {args.episodes} episodes x {TURNS} turns in {wall:.2f} s; ideal "
                  f"critical path {ideal:.2f} s; ratio {wall / ideal:.3f}")
        figures = {"rollout_wall_over_ideal": statistics.median(ratios)}
        if not args.skip_sequential:
            sequential = await sequential_run(ctx, args.episodes)
            print(f"brief's loop, one sample at a time: {sequential:.2f} s")
            figures["rollout_speedup_vs_sequential"] = sequential / statistics.median(walls)
        return figures
    finally:
        await engine.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--skip-sequential", action="store_true")
    parser.add_argument("--skip-engine", action="store_true")
    parser.add_argument("--backend", choices=("embedded", "vllm"), default="embedded",
                        help="what serves the policy (vllm: a real vLLM server started here)")
    args = parser.parse_args()
    figures = asyncio.run(rollout_figures(args))
    targets = {"rollout_wall_over_ideal": "<= 1.15", "rollout_speedup_vs_sequential": "> 1",
               "engine_vs_hf_generate": ">= 2"}
    if not args.skip_engine and args.backend == "embedded":
        figures["engine_vs_hf_generate"] = engine_vs_hf(build_tiny_model())
    for name, value in figures.items():
        print(json.dumps({"name": name, "value": round(value, 3), "target": targets[name],
                          **({"backend": args.backend} if name.startswith("rollout_") else {})}))


if __name__ == "__main__":
    main()
