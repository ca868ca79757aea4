"""The one evaluation (agentrl eval and train.py's --eval-*): policies, pass@k, seeds, errors."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import re

import pytest

from agentrl import ToolEnv, register_env
from agentrl.cli import main
from agentrl.env import registry
from agentrl.eval.metrics import pass_at_k, summarize
from agentrl.eval.runner import run_evaluation
from agentrl.records.sample import Sample, Status
from agentrl.rollout.config import RolloutConfig
from agentrl.rollout.data import RolloutDataSource
from agentrl.run.evaluate import EvalConfig, evaluate
from tests.unit.test_rollout_episode import calc_policy, make_ctx
from tests.unit.test_rollout_runner import TASKS


def run(policy="oracle", env="calc", split="test", **flags):
    config = RolloutConfig(env=env, **flags)
    config.validate()
    summary, groups = asyncio.run(evaluate(config, EvalConfig(policy=policy, split=split)))
    (metrics,) = summary["sets"].values()
    return metrics, [s for g in next(iter(groups.values())) for s in g]


def test_oracle_solves_and_null_fails():
    oracle, samples = run("oracle", eval_max_prompts=20, rollout_concurrency=4)
    assert oracle["success_rate"] == 1.0 and oracle["n_samples"] == 20 and oracle["n_prompts"] == 20
    assert oracle["pass@1"] == 1.0 and not any(k.startswith("pass@") and k != "pass@1" for k in oracle)
    assert oracle["mean_turns"] == 2.0 and oracle["tool_calls"] == 20 and oracle["tool_errors"] == {}
    assert {s.metadata["task_id"] for s in samples} == {f"calc-test-0-{i}" for i in range(20)}
    null, _ = run("null", eval_max_prompts=20)
    assert null["success_rate"] == 0.0 and null["mean_turns"] == 1.0


def test_samples_per_task_share_a_group_and_pass_at_k_keys():
    metrics, samples = run(eval_max_prompts=3, n_samples_per_eval_prompt=4)
    assert metrics["n_samples"] == 12 and metrics["pass@1"] == metrics["pass@2"] == metrics["pass@4"] == 1.0
    assert sorted(s.index for s in samples if s.metadata["task_id"] == "calc-test-0-0") == [0, 1, 2, 3]


def _group(gid, *rewards):
    return [Sample(group_id=gid, index=i, reward=r, status=Status.COMPLETED) for i, r in enumerate(rewards)]


def test_pass_at_k_is_averaged_over_prompts():
    # prompt a: 1 of 2 solved -> pass@1 = 0.5, pass@2 = 1; prompt b: none solved.
    metrics = summarize([_group("a", 1.0, 0.0), _group("b", 0.0, 0.0)])
    assert metrics["pass@1"] == 0.25 and metrics["pass@2"] == 0.5 and metrics["success_rate"] == 0.25


def test_summarize_counts_only_full_successes():
    metrics = summarize([_group(0, 1.0, 0.5, 0.0), _group(1, 1.0, 1.0, 0.0)])
    assert metrics["pass@1"] == pytest.approx((1 / 3 + 2 / 3) / 2)
    assert metrics["pass@2"] == pytest.approx((pass_at_k(3, 1, 2) + pass_at_k(3, 2, 2)) / 2)
    assert metrics["pass@3"] == 1.0 and metrics["mean_reward"] == pytest.approx(3.5 / 6)


def test_a_failed_sample_never_counts_as_a_success():
    group = _group(0, 1.0, 1.0)
    group[1].status = Status.FAILED
    group[1].metadata["error"] = "RuntimeError: grader bug\nmore"
    metrics = summarize([group])
    assert metrics["success_rate"] == 0.5 and metrics["failed"] == 1
    assert metrics["errors"] == {"RuntimeError: grader bug": 1}


class Exploding(ToolEnv):
    """No task set; the grader raises for odd numbers."""

    def sample_task(self):
        return {"n": int(self.np_random.integers(100))}

    def make_prompt(self, task):
        return [{"role": "user", "content": str(task["n"])}]

    def compute_reward(self, task, final, state):
        if task["n"] % 2:
            raise RuntimeError("grader bug")
        return 1.0


@pytest.fixture
def isolated_registry(monkeypatch):
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))


def test_env_errors_are_recorded_not_fatal(isolated_registry):
    register_env("exploding-v0", entry_point=Exploding)
    metrics, samples = run("null", env="exploding", eval_max_prompts=30)
    failed = [s for s in samples if s.status is Status.FAILED]
    assert failed and all("grader bug" in s.metadata["error"] for s in failed)
    assert metrics["failed"] == len(failed) and metrics["n_samples"] == 30


class Glossary(ToolEnv):
    """Splits, an oracle, and tasks without an ``id`` key (the README's shape)."""

    default_max_turns = 2

    def task_set(self, split="test", limit=None):
        words = {"train": ["apple", "pear"], "test": ["plum", "fig", "kiwi"]}[split]
        return [{"word": w} for w in words][:limit]

    def make_prompt(self, task):
        return [{"role": "user", "content": f"Define {task['word']}."}]

    def compute_reward(self, task, final, state):
        return task["word"] in final["content"]

    def oracle_action(self, task, history):
        return {"role": "assistant", "content": f"{task['word']}: a fruit"}


def test_tasks_without_an_id_evaluate_with_several_samples(isolated_registry, tmp_path, capsys):
    """Regression: tasks without ``id`` got one id per sample, so pass@2 had n=1 and crashed."""
    register_env("glossary-eval-v0", entry_point=Glossary)
    out = tmp_path / "glossary.json"
    code = main(["eval", "--env", "glossary-eval", "--n-samples", "4", "--output", str(out)])
    assert code == 0, capsys.readouterr()
    metrics = json.loads(out.read_text())["sets"]["glossary-eval"]
    assert metrics["n_prompts"] == 3 and metrics["n_samples"] == 12
    assert metrics["pass@1"] == metrics["pass@4"] == 1.0 and metrics["mean_reward"] == 1.0


def test_eval_seeds_never_equal_training_seeds(isolated_registry):
    register_env("exploding-seeds-v0", entry_point=Exploding)
    config = RolloutConfig(env="exploding-seeds", n_samples_per_prompt=2, n_samples_per_eval_prompt=2,
                           eval_max_prompts=50)
    train = RolloutDataSource(config)
    train_seeds = {s.metadata["seed"] for g in train.get_samples(500) for s in g}
    _, samples = run("null", env="exploding-seeds", eval_max_prompts=50, n_samples_per_eval_prompt=2)
    eval_seeds = [s.metadata["seed"] for s in samples]
    assert len(set(eval_seeds)) == 50  # one seed per prompt, shared by its samples
    assert not train_seeds & set(eval_seeds)


def test_eval_of_an_env_without_an_oracle_is_refused_at_start(isolated_registry, capsys):
    register_env("exploding-no-oracle-v0", entry_point=Exploding)
    code = main(["eval", "--env", "exploding-no-oracle", "--limit", "3"])  # oracle: the default
    captured = capsys.readouterr()
    assert code == 1 and captured.out == ""  # no episode was played
    assert "--policy oracle (the default) plays the env's scripted expert, and Exploding has none" in captured.err
    assert "--policy model" in captured.err


@pytest.mark.parametrize("argv, message", [
    (["--split", "dev"], "dev"),
    (["--limit", "0"], "--eval-max-prompts must be >= 1, got 0"),
    (["--limit", "-3"], "--eval-max-prompts must be >= 1, got -3"),
    (["--n-samples", "0"], "--n-samples-per-eval-prompt must be >= 1"),
    (["--output", "/proc/no/such/dir/out.json"], "--output '/proc/no/such/dir/out.json' cannot be written"),
    # a server backend is never ignored: eval plays on servers you name, and only for the model
    (["--policy", "model", "--rollout-backend", "vllm"], "give their --rollout-engine-urls"),
    (["--rollout-backend", "sglang", "--rollout-engine-urls", "http://127.0.0.1:9"],
     "--rollout-backend sglang serves --policy model; --policy oracle uses no engine"),
])
def test_bad_eval_flags_are_named(argv, message, capsys):
    code = main(["eval", "--env", "calc", *argv])
    err = capsys.readouterr().err
    assert code == 1 and message in err and "Traceback" not in err


def test_eval_flags_are_train_py_flags():
    """The CLI takes train.py's names; the short ones are aliases of the same options."""
    from agentrl.cli import build_parser

    parsed = build_parser().parse_args(["eval", "--env", "calc", "--temperature", "0.5", "--limit", "2",
                                        "--rollout-max-response-len", "16", "--concurrency", "3"])
    from agentrl.run.evaluate import parse_eval_config

    rollout, _ = parse_eval_config(parsed)
    assert (rollout.eval_temperature, rollout.eval_max_prompts, rollout.rollout_max_response_len,
            rollout.rollout_concurrency) == (0.5, 2, 16, 3)


def half_right(text, rid):
    """Right for samples 0 and 1 of each prompt, wrong for 2 and 3."""
    reply = calc_policy(text, rid)
    index = int(re.search(r"-s(\d+)", rid).group(1))
    return re.sub(r"Answer: .*", "Answer: -999", reply) if "Answer:" in reply and index >= 2 else reply


def test_named_sets_and_env_test_split_in_training(tmp_path):
    data = tmp_path / "mini.jsonl"
    data.write_text("".join(json.dumps(t) + "\n" for t in TASKS[:3]))
    config = RolloutConfig(env="calc", max_turns=3, eval_prompt_data=[["mini", str(data)]],
                           eval_env=["calc"], n_samples_per_eval_prompt=4, eval_max_prompts=2)
    config.validate()
    ctx = make_ctx(half_right)
    ctx = dataclasses.replace(ctx, config=config)
    result = asyncio.run(run_evaluation(ctx, step=7))
    assert result["step"] == 7 and set(result["sets"]) == {"mini", "calc"}
    for name in ("mini", "calc"):
        metrics = result["sets"][name]
        assert metrics["n_prompts"] == 2 and metrics["n_samples"] == 8
        assert metrics["pass@1"] == pytest.approx(0.5)
        assert metrics["pass@2"] == pytest.approx(pass_at_k(4, 2, 2))
        assert metrics["pass@4"] == 1.0
        assert metrics["mean_reward"] == pytest.approx(0.5)


def test_a_truncated_turn_keeps_its_text_in_the_episode(tmp_path):
    """Regression: a turn cut by the token cap was missing from the eval episode's messages."""
    config = RolloutConfig(env="calc", max_turns=3, eval_env=["calc"], eval_max_prompts=1)
    ctx = dataclasses.replace(make_ctx(lambda text, rid: "word " * 200, max_new_tokens=8), config=config)
    from agentrl.eval.runner import eval_sets, evaluate_sets

    results = asyncio.run(evaluate_sets(ctx, eval_sets(config), "eval0"))
    (sample,) = results["calc"][1][0]
    assert sample.metadata["finish"] == "length"
    last = sample.metadata["messages"][-1]
    assert last["role"] == "assistant" and last["content"].startswith("word") and last["content"] == sample.response


def test_outputs_and_table(tmp_path, capsys):
    out = tmp_path / "out" / "calc.json"
    assert main(["eval", "--env", "calc", "--limit", "5", "--output", str(out)]) == 0
    table = capsys.readouterr().out
    assert "success rate" in table and "pass@1" in table and "grading" in table
    summary = json.loads(out.read_text())
    metrics = summary["sets"]["calc"]
    assert summary["policy"] == "oracle" and metrics["success_rate"] == 1.0 and metrics["n_samples"] == 5
    lines = (tmp_path / "out" / "calc.episodes.jsonl").read_text().splitlines()
    assert len(lines) == 5 and json.loads(lines[0])["messages"][0]["role"] == "system"


def test_a_misspelled_eval_flag_gets_a_suggestion(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["eval", "--env", "calc", "--limt", "3"])
    assert exc.value.code == 2
    assert "--limt: did you mean --limit?" in capsys.readouterr().err


def test_the_table_says_what_cut_the_truncated_episodes(capsys):
    # the tiny model's replies run into an 8-token limit: truncated by the reply length
    code = main(["eval", "--env", "calc", "--policy", "model", "--limit", "2", "--max-turns", "1",
                 "--rollout-max-response-len", "8"])
    out = capsys.readouterr().out
    assert code == 0
    assert "statuses          truncated=2" in out
    assert "  truncated by    a reply at --rollout-max-response-len 2" in out
