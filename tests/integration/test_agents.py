"""Black-box agents solve env tasks through the gateway: the real ``openai`` SDK, the OpenAI
Agents SDK and mini-swe-agent (its commands in the episode's sandbox), graded by the env.

The model behind the gateway is scripted to write the env oracle's moves as tool calls, so that
each client's whole loop (tool calls, tool results, final answer, submission) is exercised;
every client and env is the real one.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path

import pytest

import agentrl_envs  # noqa: F401 - registers the built-in envs
from agentrl.eval.runner import EvalSet, evaluate_sets
from agentrl.records.sample import Status
from agentrl.rollout.build import env_factory
from agentrl.rollout.config import RolloutConfig
from agentrl.rollout.episode import action_text
from agentrl.run.context import make_rollout_context
from tests.support.engines import ScriptedEngine
from tests.support.sandboxes import backend_skip_reason
from tests.support.tokenizers import tiny_tokenizer

pytestmark = pytest.mark.integration

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
NEEDS_BWRAP = pytest.mark.skipif(backend_skip_reason("bwrap") is not None,
                                 reason=f"command agents run in bubblewrap: {backend_skip_reason('bwrap')}")


class OracleModel(ScriptedEngine):
    """Writes the oracle's moves for whichever task the conversation is about."""

    def __init__(self, envs, moves) -> None:
        env = envs()
        self.tasks = env.task_set("test", 4)
        self.env = env
        self.moves = moves
        super().__init__(tiny_tokenizer(), self._policy)
        self.max_context_len = 4096

    def _policy(self, text: str, rid: str) -> str:
        task = next(t for t in self.tasks if self._marker(t) in text)
        answered = text.count("<tool_response>")
        return self.moves(self.env, task, answered)

    @staticmethod
    def _marker(task) -> str:
        return str(task.get("question") or task.get("problem_statement"))[:60]


def calc_moves(env, task, answered: int) -> str:
    if answered == 0:
        return action_text(env, env.oracle_action(task, []))
    return f"The result is in.\nAnswer: {task['answer']}"


def _bash(command: str) -> str:
    return ('<tool_call>\n' + json.dumps({"name": "bash", "arguments": {"command": command}})
            + '\n</tool_call>')


def swe_moves(env, task, answered: int) -> str:
    if answered == 0:
        fix = task["fix"]
        script = (f"import pathlib\np = pathlib.Path({fix['path']!r})\ns = p.read_text()\n"
                  f"p.write_text(s.replace({fix['old']!r}, {fix['new']!r}))\n")
        return _bash(f"python3 - <<'EOF'\n{script}EOF\necho $(hostname) > where.txt")
    return _bash("echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT")


def _evaluate(env: str, agent: str, moves, limit: int = 2):
    config = RolloutConfig(env=env, agent_function_path=agent, eval_max_prompts=limit,
                           rollout_max_context_len=4096, rollout_max_response_len=512)
    envs = env_factory(config)

    async def play():
        engine = OracleModel(envs, moves)
        ctx = make_rollout_context(config, engine, envs)
        try:
            return await evaluate_sets(ctx, [EvalSet(env, None, env, "test")], "t")
        finally:
            await ctx.aclose()
            await envs.aclose()

    [(metrics, groups)] = asyncio.run(play()).values()
    return metrics, [s for g in groups for s in g]


@pytest.mark.parametrize("agent", ["openai_sdk_agent.py:run", "openai_sdk_agent.py:run_sync",
                                   "openai_agents_agent.py:run"])
def test_openai_clients_solve_calc_through_the_gateway(agent):
    metrics, samples = _evaluate("calc", f"{EXAMPLES}/{agent}", calc_moves)
    assert metrics["success_rate"] == 1.0, [s.metadata.get("error") for s in samples]
    for sample in samples:
        sample.check()
        assert sample.status is Status.COMPLETED and sample.metadata["finish"] == "agent"
        assert sample.metadata["gateway_calls"] == 2 and sum(sample.loss_mask) > 0
        assert [s["reason"] for s in sample.metadata["segments"]] == ["start"]
        assert sample.metadata["gateway"] == {"calls": 2, "segments": 1, "rewrites": 0,
                                              "replies": 2, "dropped_replies": 0}
        assert "Answer: " in sample.metadata["messages"][-1]["content"]
    assert metrics["gateway"] == {"segments": len(samples), "rewrites": 0, "dropped_replies": 0}


def test_mini_swe_agent_solves_swe_tools_in_the_episode_sandbox(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)  # a command run on the host would write where.txt here
    metrics, samples = _evaluate("swe-tools", f"{EXAMPLES}/mini_swe_agent.py:run", swe_moves,
                                 limit=1)
    [sample] = samples
    assert sample.status is Status.COMPLETED, sample.metadata.get("error")
    assert metrics["success_rate"] == 1.0 and sample.reward == 1.0
    assert sample.metadata["gateway_calls"] == 2
    assert not (tmp_path / "where.txt").exists()  # the commands ran in the sandbox
    # the one grading path: the grader's commands are logged as grading, the agent's as tools
    commands = [c for c in sample.metadata["commands"] if c.get("kind") != "dropped"]
    assert any(c["phase"] == "tools" and "where.txt" in c["command"] for c in commands)
    grading = [c for c in commands if c["phase"] == "grade"]
    assert grading and not any("where.txt" in c["command"] for c in grading)


def test_agentrl_eval_policy_openai_plays_calc_through_the_gateway(monkeypatch):
    """``agentrl eval --policy openai`` against agentrl's own gateway: native tool calls in,
    the env's loop played, usage counted."""
    import threading

    from agentrl.cli import build_parser
    from agentrl.gateway import Gateway
    from agentrl.gateway.server import default_sampling, renderer_for
    from agentrl.run.evaluate import evaluate, parse_eval_config

    envs = env_factory(RolloutConfig(env="calc"))
    engine = OracleModel(envs, calc_moves)
    renderer = renderer_for(engine, "hermes")
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    gateway = Gateway(engine, renderer, default_sampling(renderer, 256), 4096)
    asyncio.run_coroutine_threadsafe(gateway.start(), loop).result(30)

    async def session():
        return gateway.open_session("eval-openai", client_sampling=True)

    key = asyncio.run_coroutine_threadsafe(session(), loop).result(30).key
    try:
        namespace = build_parser().parse_args(
            ["eval", "--env", "calc", "--policy", "openai", "--base-url", f"{gateway.url}/v1",
             "--model", gateway.model, "--api-key-env", "AGENTRL_TEST_GATEWAY_KEY", "--limit", "2"])
        monkeypatch.setenv("AGENTRL_TEST_GATEWAY_KEY", key)
        summary, _ = asyncio.run(evaluate(*parse_eval_config(namespace)))
    finally:
        asyncio.run_coroutine_threadsafe(gateway.stop(), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)
        asyncio.run(envs.aclose())
    [metrics] = summary["sets"].values()
    assert metrics["success_rate"] == 1.0 and metrics["tool_calls"] == 2
    assert metrics["usage"]["completion_tokens"] > 0


def answer_moves(env, task, answered: int) -> str:
    return f"Answer: {task['answer']}"


def _evaluate_command(command: str, timeout: float = 120.0, *, on_host: bool = False):
    config = RolloutConfig(env="calc", agent_command=command, eval_max_prompts=1,
                           agent_timeout=timeout, rollout_max_context_len=4096, agent_on_host=on_host)
    envs = env_factory(config)

    async def play():
        ctx = make_rollout_context(config, OracleModel(envs, answer_moves), envs)
        try:
            return await evaluate_sets(ctx, [EvalSet("calc", None, "calc", "test")], "c")
        finally:
            await ctx.aclose()
            await envs.aclose()

    [(metrics, groups)] = asyncio.run(play()).values()
    return metrics, groups[0][0]


@NEEDS_BWRAP
def test_a_cli_agent_runs_unmodified_from_agent_command():
    metrics, sample = _evaluate_command(f"{sys.executable} {EXAMPLES}/cli_agent.py")
    assert sample.status is Status.COMPLETED, sample.metadata.get("error")
    assert metrics["success_rate"] == 1.0 and sample.metadata["gateway_calls"] == 2


def test_agents_get_the_tasks_public_view_only(tmp_path):
    """The side being graded never sees the grader's row: a function agent's ``task``, a
    command agent's stdin and ``$AGENTRL_TASK_FILE`` hold calc's public fields (no answer, no
    expression), and the episodes still score 1 (the env grades with the whole row)."""
    from agentrl.env import make_env
    from tests.support.leakage import assert_public_only

    seen = tmp_path / "function.jsonl"
    agent = tmp_path / "recording_agent.py"
    agent.write_text(f"import json, sys\nsys.path.insert(0, {str(EXAMPLES)!r})\n"
                     "from openai_sdk_agent import run as solve\n\n"
                     "async def run(task, endpoint):\n"
                     f"    with open({str(seen)!r}, 'a') as out:\n"
                     "        out.write(json.dumps(task) + '\\n')\n"
                     "    return await solve(task, endpoint)\n")
    metrics, samples = _evaluate("calc", f"{agent}:run", calc_moves)
    assert metrics["success_rate"] == 1.0, [s.metadata.get("error") for s in samples]

    command = (f"tee {tmp_path}/stdin.json | {sys.executable} {EXAMPLES}/cli_agent.py && "
               f'cp "$AGENTRL_TASK_FILE" {tmp_path}/file.json')
    metrics, sample = _evaluate_command(command, on_host=True)  # where the test can read them
    assert metrics["success_rate"] == 1.0, sample.metadata.get("error")

    env = make_env("calc")
    rows = {row["id"]: row for row in env.task_set("test", limit=4)}
    given = [json.loads(line) for line in seen.read_text().splitlines()]
    given += [json.loads((tmp_path / name).read_text()) for name in ("stdin.json", "file.json")]
    assert len(given) == 4
    for task in given:
        row = rows[task["id"]]
        assert task == env.public_task(row) == {"id": row["id"], "split": "test", "question": row["question"]}
        assert_public_only(env, row, task, "an agent's task")
    env.close()


@NEEDS_BWRAP
def test_a_command_agent_runs_sandboxed_seeing_nothing_of_the_host(tmp_path, monkeypatch, caplog):
    """By default the agent program runs in a bubblewrap sandbox: its own workspace as working
    directory, the host's current directory, home and other files invisible, the host's files
    unwritable; it still reaches the gateway and solves the task. A relative path to the
    agent's file is rewritten; a file directly in the current directory stays hidden (a
    warning says so at start, the episode fails with the program's error)."""
    here = tmp_path / "project"
    (here / "agents").mkdir(parents=True)
    (here / "secret.txt").write_text("the user's file")
    (here / "agents" / "cli_agent.py").write_text((EXAMPLES / "cli_agent.py").read_text())
    monkeypatch.chdir(here)
    probe = (f"test \"$(pwd)\" = /workspace && test ! -e {here}/secret.txt && "
             "test ! -e /root/.bashrc && test -s \"$AGENTRL_TASK_FILE\" && "
             f"{{ touch {here}/written 2>/dev/null; true; }} && ")  # if it lands, not on the host
    metrics, sample = _evaluate_command(probe + "python agents/cli_agent.py")
    assert sample.status is Status.COMPLETED, sample.metadata.get("error")
    assert metrics["success_rate"] == 1.0 and sample.metadata["gateway_calls"] == 2
    assert not (here / "written").exists()
    (here / "agent.py").write_text("print('in the current directory')\n")
    with caplog.at_level("WARNING", logger="agentrl.rollout.agents"):
        _, sample = _evaluate_command("python agent.py")
    assert "names agent.py, a file in the current directory" in caplog.text
    assert sample.status is Status.FAILED and "agent.py" in sample.metadata["error"]
    # on the host the same checks fail: it runs in the current directory
    _, sample = _evaluate_command(probe + "python agents/cli_agent.py", on_host=True)
    assert sample.status is Status.FAILED


@NEEDS_BWRAP
def test_a_failing_command_fails_its_sample_with_its_stderr():
    _, sample = _evaluate_command("echo broken agent >&2; exit 3")
    assert sample.status is Status.FAILED and "exit code 3" in sample.metadata["error"]
    assert "broken agent" in sample.metadata["error"]


def test_a_command_past_its_timeout_is_killed_with_everything_it_started(tmp_path):
    marker = tmp_path / "still-running"
    command = f"(sleep 4; touch {marker}) & sleep 30"
    started = time.monotonic()
    _, sample = _evaluate_command(command, timeout=1.0, on_host=True)  # on the host: it could touch
    assert time.monotonic() - started < 20
    assert sample.status is Status.FAILED and "--agent-timeout 1 s" in sample.metadata["error"]
    time.sleep(4.5)
    assert not marker.exists()  # the background child was killed too


def test_agent_episodes_still_running_when_the_batch_is_full_are_stopped(tmp_path):
    """Three groups are submitted for a batch of one: the fast one is kept; the agents of the
    two slow ones get their calls aborted, their sessions stop, and their samples come back
    unfinished (aborted), neither failed nor trained on."""
    from agentrl.rollout.data import RolloutDataSource
    from agentrl.rollout.runner import RolloutRunner

    keep = tmp_path / "keep.py"
    keep.write_text("def keep(args, group):\n    return True\n")
    config = RolloutConfig(env="calc", agent_function_path=f"{EXAMPLES}/openai_sdk_agent.py:run",
                           rollout_batch_size=1, n_samples_per_prompt=1, over_sampling_batch_size=3,
                           dynamic_sampling_filter_path=str(keep), rollout_max_context_len=4096)
    envs = env_factory(config)

    async def play():
        engine = OracleModel(envs, calc_moves)
        engine.delay_s = lambda rid: 0.0 if "-g0-" in rid else 30.0
        ctx = make_rollout_context(config, engine, envs)
        # the test split: the tasks the scripted model knows
        runner = RolloutRunner.from_context(ctx, RolloutDataSource(config, envs=envs, split="test"))
        try:
            started = time.monotonic()
            batch = await runner.generate(0)
            return batch, time.monotonic() - started
        finally:
            await runner.close()
            await ctx.aclose()
            await envs.aclose()

    batch, wall = asyncio.run(play())
    assert wall < 25  # the slow agents were stopped, not waited for
    [[kept]] = batch.groups
    assert kept.status is Status.COMPLETED and kept.reward == 1.0
    assert batch.metrics["rollout/aborted_groups"] == 2 and batch.metrics["rollout/failed"] == 0
