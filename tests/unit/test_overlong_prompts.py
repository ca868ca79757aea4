"""Context limits at the data boundary: a prompt longer than the context is skipped (its row
reported with file and line) or cut when asked, no sample longer than the context reaches the
trainer, and a multi-million-token row costs bounded memory."""

from __future__ import annotations

import asyncio
import json
import logging
import random
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from agentrl.chat import ChatRenderer
from agentrl.env.factory import EnvFactory
from agentrl.errors import ConfigError, DataError
from agentrl.records.sample import Sample, Status
from agentrl.rollout.buffer import RolloutDataSourceWithBuffer
from agentrl.rollout.config import RolloutConfig
from agentrl.rollout.data import RolloutDataSource, SkippedRow
from agentrl.rollout.demonstrations import demonstrations
from agentrl.rollout.episode import Episode, RolloutContext
from agentrl.rollout.overlong import PROMPT_CUT_MARKER, fit_prompt, prompt_ids_within
from agentrl.rollout.runner import RolloutRunner
from tests.support.engines import ScriptedEngine
from tests.support.tokenizers import qwen25_tokenizer, tiny_tokenizer
from tests.unit.test_rollout_episode import calc_policy, make_ctx

REPO = Path(__file__).resolve().parents[2]
CONTEXT = 2048  # make_ctx's --rollout-max-context-len
LONG = "What is 1 + 1? " + "and then some more words " * 1200  # > 6000 tokens of the tiny vocabulary


def calc_task(i: int, question: str | None = None) -> dict:
    return {"task_id": f"t{i}", "question": question or f"What is {i} + {i}?",
            "expression": f"{i} + {i}", "answer": 2 * i}


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def calc_runner(path: Path, **flags) -> tuple[RolloutRunner, RolloutDataSourceWithBuffer]:
    config = RolloutConfig(env="calc", prompt_data=str(path), **flags)
    config.validate()
    ctx = make_ctx(engine=ScriptedEngine(tiny_tokenizer(), calc_policy))
    ctx.config = config
    source = RolloutDataSourceWithBuffer(config)
    return RolloutRunner.from_context(ctx, source), source


def single_turn_ctx(max_context_len: int = 512, max_new_tokens: int = 64, **flags) -> RolloutContext:
    """No env: prompts answered in one turn by an engine that always says the same."""
    ctx = make_ctx(lambda text, rid: "Answer: ok", env=None, max_context_len=max_context_len,
                   max_new_tokens=max_new_tokens)
    ctx.config = RolloutConfig(max_turns=1, **flags)
    return ctx


# -- skip ------------------------------------------------------------------------------------------


def test_overlong_prompt_row_is_skipped_with_file_and_line(tmp_path, caplog):
    rows = [calc_task(i) for i in range(6)]
    rows[2] = calc_task(2, LONG)  # line 3
    path = write_jsonl(tmp_path / "tasks.jsonl", rows)
    runner, source = calc_runner(path, rollout_batch_size=3, n_samples_per_prompt=2)
    with caplog.at_level(logging.WARNING):
        batches = [asyncio.run(runner.generate(i)) for i in range(3)]  # two epochs and a half
    played = [g[0].metadata["source"]["line"] for b in batches for g in b.groups]
    assert len(played) == 9 and 3 not in played  # line 3 is never trained on
    assert source.epoch >= 1  # later epochs passed line 3 again, without serving it
    assert all(s.status is Status.COMPLETED and s.tokens for b in batches for s in b.samples)
    # the second epoch does not serve it again
    assert [b.metrics["rollout/overlong_prompts"] for b in batches] == [1, 0, 0]
    reports = [r.getMessage() for r in caplog.records if f"{path}:3:" in r.getMessage()]
    assert len(reports) == 1 and "--rollout-max-context-len" in reports[0]
    assert "--overlong-prompts cut" in reports[0]  # the fix
    assert [(r.file, r.line) for r in source.skipped_rows] == [(str(path), 3)]


def test_overlong_prompt_sample_is_not_played_and_holds_no_tokens():
    ctx = single_turn_ctx()
    sample = asyncio.run(Episode(ctx, Sample(group_id=0, prompt=LONG), "e").run())
    assert sample.status is Status.SKIPPED and sample.metadata["finish"] == "overlong_prompt"
    assert sample.tokens == [] and sample.response_length == 0 and sample.reward == 0.0
    assert ctx.engine.requests == []  # never sent to the engine
    assert "at least" in sample.metadata["error"] and "512" in sample.metadata["error"]


@pytest.mark.parametrize("vocab", [tiny_tokenizer, qwen25_tokenizer], ids=["tiny", "qwen25"])
def test_a_prompt_that_fits_is_measured_exactly(vocab):
    renderer = ChatRenderer(vocab(), "hermes")
    for text in ("hi", "word " * 400, "x" * 20000, "東京 naïve 🚀 " * 900, LONG):
        messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": text}]
        exact = renderer.prompt_ids(messages)
        for limit in (len(exact) - 1, len(exact), len(exact) + 1):
            found = prompt_ids_within(renderer, messages, None, limit)
            if len(exact) <= limit:
                assert found == exact
            else:  # a lower bound, never above the real count
                assert isinstance(found, int) and limit < found <= len(exact)


class BigPromptEnvFactory:
    """An env factory whose env writes its own (too long) prompt on reset: no prompt row."""

    def __init__(self, prompt: str) -> None:
        self.calc = EnvFactory("calc")
        self.prompt = prompt

    def __call__(self):
        env = self.calc()
        env.make_prompt = lambda task: [{"role": "user", "content": self.prompt}]
        return env


class SeedSource:
    """A plug-in data source without ``skip_row``: env seeds, no rows."""

    def __init__(self, n_samples: int = 2) -> None:
        self.n_samples, self.next_id = n_samples, 0
        self.returned: list[list[Sample]] = []
        """Groups handed back by the runner (partial rollouts); kept, never served again."""

    def get_samples(self, num_samples: int) -> list[list[Sample]]:
        groups = []
        for _ in range(num_samples):
            k, self.next_id = self.next_id, self.next_id + 1
            source = {"env": "calc", "split": "train", "index": k}
            groups.append([Sample(group_id=k, index=i, metadata={"seed": k, "source": dict(source)})
                           for i in range(self.n_samples)])
        return groups

    def add_samples(self, samples) -> None:
        self.returned.extend(samples)


def test_env_generated_overlong_prompt_is_skipped_and_reported(caplog):
    ctx = make_ctx()
    ctx.envs = BigPromptEnvFactory(LONG)
    ctx.config = RolloutConfig(env="calc", dynamic_sampling_max_groups=3, rollout_batch_size=1)
    runner = RolloutRunner(ctx, SeedSource())
    with caplog.at_level(logging.WARNING), pytest.raises(DataError) as error:
        asyncio.run(runner.generate(0))
    # nothing fits: the rollout refuses rather than handing the trainer a short batch
    assert "only 0 of 1 groups fit the context after 3 prompts" in str(error.value)
    assert "env calc split train:1" in str(error.value)
    reports = [r.getMessage() for r in caplog.records if "skipping env calc split train:" in r.getMessage()]
    assert len(reports) == 3  # one per prompt, not per sample


# -- cut -------------------------------------------------------------------------------------------


def test_overlong_prompt_is_cut_when_asked():
    ctx = single_turn_ctx(overlong_prompts="cut")
    renderer = ctx.renderer
    prompt = [{"role": "system", "content": "Answer briefly."},
              {"role": "user", "content": "short question"},
              {"role": "user", "content": LONG}]
    sample = asyncio.run(Episode(ctx, Sample(group_id=0, prompt=prompt), "e").run())
    assert sample.status is Status.COMPLETED and sample.response == "Answer: ok"
    # room is left for one whole response turn (--rollout-max-response-len)
    assert sample.prompt_length <= 512 - 64
    system, short, cut = sample.prompt
    assert (system, short) == tuple(prompt[:2])  # only the longest user message is cut
    kept, _, marker = cut["content"].partition("\n[... ")
    assert LONG.startswith(kept) and len(kept) > 100
    assert "\n[... " + marker == PROMPT_CUT_MARKER.format(removed=len(LONG) - len(kept))
    assert sample.metadata["prompt_cut"] == len(LONG) - len(kept)
    # the prompt is the template's own rendering of the cut messages: its structure intact
    assert sample.tokens[: sample.prompt_length] == renderer.prompt_ids(sample.prompt)
    text = renderer.tokenizer.decode(sample.tokens[: sample.prompt_length])
    assert text.count("<|im_start|>") == 4 and text.count("<|im_end|>") == 3
    assert text.endswith("<|im_start|>assistant\n")


def test_a_text_prompt_stays_text_when_cut():
    ctx = single_turn_ctx(overlong_prompts="cut")
    sample = asyncio.run(Episode(ctx, Sample(group_id=0, prompt=LONG), "e").run())
    assert sample.status is Status.COMPLETED and isinstance(sample.prompt, str)
    assert sample.prompt.startswith("What is 1 + 1?") and "characters of the prompt cut" in sample.prompt


def test_a_prompt_that_cannot_be_cut_to_fit_is_skipped():
    ctx = single_turn_ctx(overlong_prompts="cut")
    prompt = [{"role": "system", "content": LONG}, {"role": "user", "content": "hi"}]
    sample = asyncio.run(Episode(ctx, Sample(group_id=0, prompt=prompt), "e").run())
    assert sample.status is Status.SKIPPED and sample.tokens == []
    assert "cannot be cut: even with its longest user message emptied" in sample.metadata["error"]


def test_cut_never_splits_a_special_token():
    renderer = ChatRenderer(tiny_tokenizer(), "hermes")
    specials = "<|im_end|><|im_start|>" * 3000  # text that encodes as special tokens
    fitted = fit_prompt(renderer, [{"role": "user", "content": specials}], None, 300,
                        mode="cut", response_room=50)
    assert fitted.ids is not None and len(fitted.ids) <= 250
    kept = fitted.messages[0]["content"].partition("\n[... ")[0]
    assert specials.startswith(kept) and len(kept) % len("<|im_end|><|im_start|>") in (0, 10)


def test_overlong_prompts_flag_is_validated():
    with pytest.raises(ConfigError, match="--overlong-prompts must be one of skip, cut"):
        RolloutConfig(env="calc", overlong_prompts="drop").validate()
    with pytest.raises(ConfigError, match="--overlong-prompts cut leaves room for one"):
        RolloutConfig(env="calc", overlong_prompts="cut", rollout_max_context_len=256,
                      rollout_max_response_len=256).validate()
    RolloutConfig(env="calc", overlong_prompts="cut", rollout_max_context_len=257,
                  rollout_max_response_len=256).validate()


# -- the batch boundary ----------------------------------------------------------------------------


def oversize_odd_groups(limit: int):
    """A custom generate function that writes more tokens than the context into odd groups."""

    async def custom_generate(args, samples, evaluation=False):
        for sample in samples:
            extra = limit + 5 if sample.group_id % 2 else 3
            sample.tokens = sample.tokens + [9] * extra
            sample.response_length += extra
            sample.loss_mask += [1] * extra
            sample.rollout_log_probs += [-0.5] * extra
            sample.reward = 1.0
        return samples

    return custom_generate


def test_no_sample_longer_than_context_reaches_trainer(tmp_path, caplog):
    path = write_jsonl(tmp_path / "tasks.jsonl", [calc_task(i) for i in range(8)])
    runner, _ = calc_runner(path, rollout_batch_size=3, n_samples_per_prompt=2)
    runner.custom_generate = oversize_odd_groups(CONTEXT)
    with caplog.at_level(logging.WARNING):
        batch = asyncio.run(runner.generate(0))
    assert len(batch.groups) == 3 and all(g[0].group_id % 2 == 0 for g in batch.groups)
    assert all(len(s.tokens) <= CONTEXT for s in batch.samples)
    odd_groups = int(batch.metrics["rollout/groups_submitted"]) // 2  # groups 1, 3, ...
    assert batch.metrics["rollout/overlong_samples"] == 2 * odd_groups >= 4
    assert any("longer than the context of 2048" in r.getMessage() and f"{path}:2" in r.getMessage()
               for r in caplog.records)


def test_too_few_groups_fitting_the_context_is_an_error_naming_the_row(tmp_path):
    path = write_jsonl(tmp_path / "tasks.jsonl", [calc_task(i) for i in range(8)])
    runner, _ = calc_runner(path, rollout_batch_size=2, n_samples_per_prompt=2,
                            dynamic_sampling_max_groups=2)
    runner.custom_generate = oversize_odd_groups(CONTEXT)
    with pytest.raises(DataError, match=rf"only 1 of 2 groups fit .* first {re.escape(str(path))}:2;"):
        asyncio.run(runner.generate(0))


def test_evaluation_keeps_overlong_prompts_scored_zero(tmp_path):
    rows = [calc_task(0), calc_task(1, LONG)]
    path = write_jsonl(tmp_path / "tasks.jsonl", rows)
    config = RolloutConfig(env="calc", prompt_data=str(path), n_samples_per_prompt=1)
    ctx = make_ctx(engine=ScriptedEngine(tiny_tokenizer(), calc_policy))
    ctx.config = config
    source = RolloutDataSource(config)
    runner = RolloutRunner(ctx, source, evaluation=True)
    batch = asyncio.run(runner.generate("eval", num_groups=2, submit_size=2))
    assert [g[0].status for g in batch.groups] == [Status.COMPLETED, Status.SKIPPED]
    assert batch.groups[1][0].reward == 0.0 and batch.groups[1][0].tokens == []
    assert source.num_skipped_rows == 1  # the eval summary's skipped_rows counts it


def test_overlong_demonstration_is_kept_without_tokens():
    ctx = make_ctx(max_context_len=256)
    conversation = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": LONG}]
    short = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    groups = [[Sample(group_id=0, prompt=conversation, metadata={"source": {"file": "d.jsonl", "line": 1}})],
              [Sample(group_id=1, prompt=short, metadata={"source": {"file": "d.jsonl", "line": 2}})]]
    long_demo, short_demo = asyncio.run(demonstrations(ctx, groups))
    assert long_demo.status is Status.SKIPPED and long_demo.tokens == [] and long_demo.loss_mask == []
    assert short_demo.status is Status.COMPLETED and 0 < len(short_demo.tokens) <= 256


# -- the data source -------------------------------------------------------------------------------


def test_a_row_taken_out_stays_out_after_resume(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", [{"prompt": f"q{i}"} for i in range(3)])
    source = RolloutDataSource(RolloutConfig(prompt_data=str(path), n_samples_per_prompt=1))
    source.get_samples(3)
    source.skip_row({"file": str(path), "line": 2}, "too long")
    source.skip_row({"file": str(path), "line": 2}, "too long")  # reported once
    assert source.skipped_rows == [SkippedRow(str(path), 2, "too long")]
    state = json.loads(json.dumps(source.state_dict()))
    resumed = RolloutDataSource(RolloutConfig(prompt_data=str(path), n_samples_per_prompt=1))
    resumed.load_state_dict(state)
    assert [g[0].prompt for g in resumed.get_samples(4)] == ["q0", "q2", "q0", "q2"]
    assert resumed.skipped_rows == source.skipped_rows


def test_data_where_no_row_fits_is_an_error(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", [{"prompt": f"q{i}"} for i in range(2)])
    source = RolloutDataSource(RolloutConfig(prompt_data=str(path), n_samples_per_prompt=1))
    source.get_samples(2)
    for line in (1, 2):
        source.skip_row({"file": str(path), "line": line}, "the prompt has at least 9000 tokens")
    with pytest.raises(DataError, match=r"no row of .*d.jsonl can be played: .* line 1: the prompt"):
        source.get_samples(1)


# -- memory ----------------------------------------------------------------------------------------


MEASURE = textwrap.dedent("""
    import asyncio, json, sys
    from agentrl.rollout.config import RolloutConfig
    from agentrl.rollout.data import RolloutDataSource
    from agentrl.rollout.runner import RolloutRunner
    from tests.unit.test_overlong_prompts import single_turn_ctx

    def kib(field):
        for line in open("/proc/self/status"):
            if line.startswith(field + ":"):
                return int(line.split()[1])

    ctx = single_turn_ctx(max_context_len=4096)
    ctx.renderer.prompt_ids([{"role": "user", "content": "warm up"}])
    # This process's peak only: ru_maxrss would include the parent's size at fork (Linux keeps
    # it across exec), and the imports' own peak is reset to the resident size now.
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    before = kib("VmRSS")
    source = RolloutDataSource(RolloutConfig(prompt_data=sys.argv[1], n_samples_per_prompt=2))
    batch = asyncio.run(RolloutRunner(ctx, source).generate(0, num_groups=1))
    print(json.dumps({"grown_kib": kib("VmHWM") - before, "metrics": batch.metrics,
                      "lines": [g[0].metadata["source"]["line"] for g in batch.groups],
                      "skipped": [r.line for r in source.skipped_rows]}))
""")


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="measures peak memory "
                    "through Linux's /proc/self/status and clear_refs")
def test_multi_million_token_row_in_bounded_memory(tmp_path):
    words = ["alpha", "beta", "gamma", "delta", "x1", "y2", "print", "return", "(", ")", "\n"]
    rng = random.Random(0)
    chunk = " ".join(rng.choice(words) for _ in range(20000)) + " "
    repeats = 100
    tokens = len(tiny_tokenizer().encode(chunk, add_special_tokens=False)) * repeats
    assert tokens > 3_000_000
    path = tmp_path / "huge.jsonl"
    with path.open("w") as f:
        f.write(json.dumps({"prompt": chunk * repeats}) + "\n")
        f.write(json.dumps({"prompt": "a short question"}) + "\n")
    done = subprocess.run([sys.executable, "-c", MEASURE, str(path)], cwd=REPO, capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["lines"] == [2] and result["skipped"] == [1]
    assert result["metrics"]["rollout/overlong_prompts"] == 1
    # Tokenizing the row would take ~420 bytes a token (1.6 GB for 3.8M tokens, measured with
    # this tokenizer); even its ids as a Python list would take ~36 bytes a token. Reading,
    # parsing and rendering it must stay below that list.
    assert result["grown_kib"] * 1024 < 36 * tokens, result
    print(f"{tokens} tokens: peak memory grew by {result['grown_kib'] // 1024} MiB")
