"""OpenEnv both ways, against the real ``openenv`` package (.venv-openenv): its client drives
``agentrl serve-env``; agentrl's ``openenv`` env consumes served envs; bad input on both sides."""

from __future__ import annotations

import asyncio
import contextlib
import http.server
import json
import os
import shlex
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import psutil
import pytest
from aiohttp import web

from agentrl.env import make_env
from agentrl.errors import EnvServerError, EnvServerLost
from agentrl_envs.openenv.client import describe_server
from tests.support.distributed import free_port
from tests.support.leakage import assert_public_only
from tests.support.openenv_servers import (
    DRIVER,
    OPENENV_PYTHON,
    drive,
    openenv_missing,
    running,
    serve_env,
)
from tests.support.sandboxes import backend_skip_reason

pytestmark = pytest.mark.skipif(openenv_missing() is not None, reason=str(openenv_missing()))


def oracle_turn(direct, task, history):
    turn = direct.oracle_action(task, history)
    return turn if isinstance(turn, dict) else {"role": "assistant", "content": turn}


async def play(env, oracle_env, task_row, oracle_task):
    """One oracle episode on ``env`` (the oracle of ``oracle_env`` on ``oracle_task``)."""
    await env.areset(options={"task": task_row})
    while True:
        turn = oracle_turn(oracle_env, oracle_task, list(env.messages))  # the transcript, calls parsed
        _, reward, terminated, truncated, _ = await env.astep(turn)
        if terminated or truncated:
            return reward, terminated


def direct_rewards(env_id: str, count: int, **kwargs) -> list[float]:
    env = make_env(env_id, **kwargs)

    async def run():
        out = []
        for task in env.task_set("test", limit=count):
            out.append((await play(env, env, task, task))[0])
        await env.aclose()
        return out

    return asyncio.run(run())


def needs(backend: str) -> pytest.MarkDecorator:
    """Skips where the sandbox back-end is missing, saying why (bubblewrap or Docker absent)."""
    reason = backend_skip_reason(backend)
    return pytest.mark.skipif(reason is not None, reason=str(reason))


SERVED = [
    pytest.param("calc", {}, 6, id="calc"),
    pytest.param("swe-tools", {}, 2, id="swe-tools", marks=needs("bwrap")),
    pytest.param("harbor", {}, 1, id="harbor", marks=needs("docker")),
]


@pytest.mark.parametrize(("env_id", "kwargs", "count"), SERVED)
def test_openenvs_client_plays_served_envs_with_the_direct_rewards(env_id, kwargs, count):
    """openenv's MCPToolClient: list tools, reset on the task API's tasks, one call_tool per
    turn (final_answer for a text answer); rewards and terminations equal the direct env's.
    No private field of a task reaches the client: not in an observation, not in the task API."""
    expected = direct_rewards(env_id, count, **kwargs)
    direct = make_env(env_id, **kwargs)
    rows = direct.task_set("test", limit=count)
    with serve_env(env_id) as (url, _):
        episodes = drive(url, env_id, "oracle", "test", str(count), env_kwargs=kwargs, timeout=900)
        name = describe_server(url).env_name
        served = {f"/{path}": _post(url, f"/{name}/{path}", body)
                  for path, body in (("task_range", {"split": "test", "start": 0, "stop": count}),
                                     ("task", {"split": "test", "index": 0}))}
    assert [e["reward"] for e in episodes] == expected
    assert all(e["done"] and e["terminated"] for e in episodes)
    assert sum(expected) == count  # the oracle solves them: the rewards are not all zero by accident
    for episode, row in zip(episodes, rows, strict=True):
        # what the client has before its first action (later observations answer the oracle's
        # calls, which know the fix; check_env's canary check covers the env's tool outputs)
        reset = episode["seen"][0]
        assert reset["task"] == direct.public_task(row)
        assert_public_only(direct, row, reset, f"episode {episode['index']}'s reset observation")
    assert served["/task_range"]["tasks"] == [direct.public_task(row) for row in rows]
    for row in rows:
        assert_public_only(direct, row, served, "the task API")
    direct.close()


def _post(url: str, path: str, body: dict) -> dict:
    request = urllib.request.Request(url + path, data=json.dumps(body).encode(), method="POST",
                                     headers={"content-type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as answer:
        return json.load(answer)


def test_a_served_env_consumed_back_gives_the_direct_rewards_episode_by_episode():
    """agentrl env -> serve-env -> openenv-v0: the same tools, prompts and rewards."""
    direct = make_env("calc")
    expected = direct_rewards("calc", 12)
    with serve_env("calc") as (url, _):
        remote = make_env("openenv", url=url)
        assert remote.toolbox.schemas == direct.toolbox.schemas
        with pytest.raises(urllib.error.HTTPError) as refused:  # an unknown split: 404, saying why
            _post(url, "/calc/task_range", {"split": "bogus", "start": 0, "stop": 2})
        assert refused.value.code == 404
        assert "no task split 'bogus'; available splits: 'train', 'test'" in refused.value.read().decode()

        async def run():
            rows = remote.task_set("test", limit=12)
            graded = direct.task_set("test", limit=12)  # the whole rows stay in the server
            assert [r["task"] for r in rows] == [direct.public_task(t) for t in graded]
            rewards = []
            for row, task in zip(rows, graded, strict=True):
                observation, info = await remote.areset(options={"task": row})
                prompt, _ = await direct.areset(options={"task": task})
                assert observation == prompt and info["max_turns"] == direct.max_turns
                assert info["task"] == {"id": task["id"], "split": "test", "index": row["index"]}
                rewards.append((await play(remote, direct, row, task))[0])
            await remote.aclose()
            return rewards

        assert asyncio.run(run()) == expected


def test_bad_input_is_answered_in_openenvs_error_format_and_the_server_keeps_serving():
    with serve_env("calc") as (url, proc):
        checks = {c["check"]: c for c in drive(url, "calc", "errors")}
        assert proc.poll() is None
    assert "reset before stepping" in checks["step_before_reset"]["error"]
    assert "EXECUTION_ERROR" in checks["step_before_reset"]["error"]
    unknown = checks["unknown_tool"]
    assert unknown["error"]["error_type"] == "tool_not_found" and not unknown["done"]
    assert "calc-v0" in unknown["error"]["message"] and "Available tools: calculator" in unknown["result"]
    assert checks["schema_violation"]["error"]["error_type"] == "invalid_args"
    assert "VALIDATION_ERROR" in checks["malformed_action"]["error"]
    assert checks["final"] == {"check": "final", "done": True, "reward": 0.0}
    assert "reset before stepping" in checks["step_after_end"]["error"]
    assert checks["still_serving"]["ok"]


def test_the_session_limit_refuses_one_more_and_admits_it_when_one_frees():
    with serve_env("calc", "--max-sessions", "1") as (url, _):
        holder = make_env("openenv", url=url)
        waiter = make_env("openenv", url=url, admission_timeout=1.0)

        async def run():
            task = holder.task_set("test", limit=1)[0]
            await holder.areset(options={"task": task})
            with pytest.raises(EnvServerError, match=rf"{url}: no free session within 1 s \(1 of 1 in use\)"):
                await waiter.areset(options={"task": task})
            patient = make_env("openenv", url=url, admission_timeout=30.0)
            admitted = asyncio.create_task(patient.areset(options={"task": task}))
            await asyncio.sleep(0.5)
            assert not admitted.done()
            await holder.aclose()  # frees the one session
            observation, _ = await asyncio.wait_for(admitted, 30)
            assert observation
            await patient.aclose()
            await waiter.aclose()

        asyncio.run(run())


@needs("bwrap")
def test_clients_killed_mid_episode_leave_no_sandbox_or_process(request):
    """Two openenv clients hold swe-tools episodes (a sandbox each) and are killed with SIGKILL;
    the server closes their sessions (at the latest after --session-timeout) and nothing of
    theirs is left: no workspace, no process. Then SIGTERM with a session open cleans too."""
    # not under tmp_path: pytest makes its folders private, and the sandbox's own uid must
    # reach its workspace
    root = Path(tempfile.mkdtemp(prefix="agentrl-openenv-sandboxes-"))
    root.chmod(0o755)
    request.addfinalizer(lambda: shutil.rmtree(root, ignore_errors=True))
    # --session-timeout 15: long enough that both sessions are still there when the clients are
    # ready on a loaded machine, short enough for the wait below
    # bwrap: the sandboxes are folders and processes to count (auto would pick Docker if it answers)
    with serve_env("swe-tools", "--session-timeout", "15", "--env-kwarg", "sandbox=bwrap",
                   env={"AGENTRL_SANDBOX_ROOT": str(root)}) as (url, server):
        clients = [subprocess.Popen([str(OPENENV_PYTHON), str(DRIVER), url, "swe-tools", BWRAP, "hold", "test"],
                                    stdout=subprocess.PIPE, text=True) for _ in range(2)]
        for client in clients:
            assert '"ready": true' in client.stdout.readline()
        assert len(workspaces(root)) == 2 and sandbox_processes(server.pid)
        for client in clients:
            client.kill()
            client.wait()
        deadline = time.monotonic() + 90
        while workspaces(root) or sandbox_processes(server.pid):
            assert time.monotonic() < deadline, (workspaces(root), sandbox_processes(server.pid))
            time.sleep(0.5)
        assert server.poll() is None
        holder = subprocess.Popen([str(OPENENV_PYTHON), str(DRIVER), url, "swe-tools", BWRAP, "hold", "test"],
                                  stdout=subprocess.PIPE, text=True)
        try:
            assert '"ready": true' in holder.stdout.readline()
            assert len(workspaces(root)) == 1
            os.killpg(server.pid, signal.SIGTERM)
            server.wait(timeout=60)
        finally:
            holder.kill()
            holder.wait()
    assert workspaces(root) == []


BWRAP = '{"sandbox": "bwrap"}'


def workspaces(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir() if p.name.startswith("ws-"))


def sandbox_processes(pid: int) -> list[str]:
    """The server's descendants that are sandbox processes (bwrap and what runs in it)."""
    with contextlib.suppress(psutil.NoSuchProcess):
        return [p.name() for p in psutil.Process(pid).children(recursive=True) if p.name() != "python"]
    return []


def test_unreachable_and_non_openenv_servers_fail_with_the_url():
    port = free_port()
    with pytest.raises(EnvServerLost, match=rf"http://127.0.0.1:{port}: cannot reach the server"):
        make_env("openenv", url=f"http://127.0.0.1:{port}")
    with pytest.raises(ValueError, match="url must be an http"):
        make_env("openenv", url="127.0.0.1:8000")
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.SimpleHTTPRequestHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        with pytest.raises(EnvServerError, match=rf"{url}: GET /schema answered HTTP 404"):
            make_env("openenv", url=url)
    finally:
        server.shutdown()
        server.server_close()


def test_a_server_that_dies_or_hangs_mid_episode_fails_the_episode_within_the_timeout():
    with serve_env("calc") as (url, server):
        env = make_env("openenv", url=url)

        async def dies():
            task = env.task_set("test", limit=1)[0]
            await env.areset(options={"task": task})
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()
            with pytest.raises(EnvServerLost, match=rf"{url}: (the connection broke|the server closed the session)"):
                await env.astep({"role": "assistant", "content": "", "tool_calls": [
                    {"name": "calculator", "arguments": {"expression": "1+1"}}]})
            await env.aclose()

        asyncio.run(dies())

    async def hangs():
        # an OpenEnv look-alike whose sessions never answer (an error path only)
        async def schema(request):
            return web.json_response({"action": {"title": "CallToolAction"}, "observation": {}, "state": {}})

        async def mcp(request):
            return web.json_response({"jsonrpc": "2.0", "id": 1, "result": {"tools": []}})

        async def ws(request):
            socket = web.WebSocketResponse()
            await socket.prepare(request)
            await never_answered.wait()  # holds the session open and says nothing
            return socket

        never_answered = asyncio.Event()
        app = web.Application()
        app.add_routes([web.get("/schema", schema), web.post("/mcp", mcp), web.get("/ws", ws)])
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]
        url = f"http://127.0.0.1:{port}"
        env = await asyncio.to_thread(make_env, "openenv", url=url, message_timeout=1.0)
        started = time.monotonic()
        with pytest.raises(EnvServerLost, match=rf"{url}: no answer to reset within 1 s"):
            await env.areset(seed=0)
        assert time.monotonic() - started < 10
        await env.aclose()
        never_answered.set()
        await runner.cleanup()

    asyncio.run(hangs())


def test_serve_env_refuses_a_remote_host_without_the_flag_and_bad_ids_at_start():
    done = subprocess.run([str(OPENENV_PYTHON), "-m", "agentrl", "serve-env", "calc", "--host", "0.0.0.0"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    assert "--host 0.0.0.0 is not a loopback address" in done.stderr and "--allow-remote" in done.stderr
    assert "Traceback" not in done.stderr
    done = subprocess.run([str(OPENENV_PYTHON), "-m", "agentrl", "serve-env", "no-such-env"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode != 0 and "no-such-env" in done.stderr and "Traceback" not in done.stderr


def calculate_then_answer(text: str, rid: str) -> str:
    """A scripted policy for calc: one calculator call, then an answer."""
    if "<tool_response>" in text:
        return "Answer: 2"
    return '<tool_call>\n{"name": "calculator", "arguments": {"expression": "1+1"}}\n</tool_call>'


def test_episodes_of_a_server_that_went_away_are_played_again_under_fault_tolerance():
    """The server is killed while a rollout's episodes wait for the model, and started again on
    the same port: their next step fails (env_server_lost), and with the retries of
    --use-fault-tolerance each is played again from its start; every sample is present once."""
    from agentrl.chat import ChatRenderer
    from agentrl.engine.base import SamplingParams
    from agentrl.env.factory import EnvFactory
    from agentrl.records.sample import Status
    from agentrl.rollout.buffer import RolloutDataSourceWithBuffer
    from agentrl.rollout.config import RolloutConfig
    from agentrl.rollout.episode import RolloutContext
    from agentrl.rollout.runner import RolloutRunner
    from tests.support.engines import ScriptedEngine
    from tests.support.tokenizers import tiny_tokenizer

    port = free_port()
    command = [str(OPENENV_PYTHON), "-m", "agentrl", "serve-env", "calc", "--port", str(port)]
    with running(command, port=port) as (url, first):
        config = RolloutConfig(env="openenv", rollout_batch_size=2, n_samples_per_prompt=2, max_turns=3)
        factory = EnvFactory("openenv", env_kwargs={"url": url, "connect_timeout": 120.0}, sandbox_retries=3)
        tokenizer = tiny_tokenizer()
        engine = ScriptedEngine(tokenizer, calculate_then_answer, delay_s=1.0)
        ctx = RolloutContext(config, engine, ChatRenderer(tokenizer, "hermes"),
                             SamplingParams(max_new_tokens=256), 2048, factory)
        runner = RolloutRunner.from_context(ctx, RolloutDataSourceWithBuffer(config, envs=factory))
        second: list[subprocess.Popen[str]] = []

        async def main():
            rollout = asyncio.create_task(runner.generate(0))
            await asyncio.sleep(0.5)  # every episode has its session and waits for the model
            os.killpg(first.pid, signal.SIGKILL)
            first.wait()
            second.append(subprocess.Popen(command, text=True, stdout=subprocess.DEVNULL,
                                           stderr=subprocess.DEVNULL, start_new_session=True))
            try:
                return (await rollout).samples
            finally:
                await runner.close()
                await factory.aclose()

        try:
            samples = asyncio.run(main())
        finally:
            for proc in second:
                os.killpg(proc.pid, signal.SIGTERM)
                proc.wait(timeout=60)
    assert sorted((s.group_id, s.index) for s in samples) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert all(s.status is Status.COMPLETED for s in samples), [s.metadata.get("error") for s in samples]
    assert all(s.metadata.get("sandbox_retries", 0) >= 1 for s in samples)


def test_the_openenv_env_passes_gymnasiums_and_agentrls_checkers_on_a_served_env():
    import gymnasium
    from gymnasium.utils.env_checker import check_env as gymnasium_check_env

    from agentrl.env import check_env
    from agentrl.errors import UnknownSplitError

    with serve_env("calc") as (url, _):
        env = gymnasium.make("agentrl/openenv-v0", url=url)
        try:
            gymnasium_check_env(env.unwrapped)  # seeds reach the server: equal seeds, equal episodes
        finally:
            env.close()
        remote = make_env("openenv", url=url)
        # no scripted oracle here, and no task fields: the server keeps the rows (and their
        # private fields) to itself
        assert [s.split(":")[0] for s in check_env(remote)] == ["oracle", "leakage"]
        with pytest.raises(UnknownSplitError, match=r"has no task split 'dev'; available splits: 'train', 'test'"):
            remote.task_set("dev")
        remote.close()


def test_an_agent_through_the_gateway_plays_a_served_env():
    """The OpenAI SDK example agent, through agentrl's gateway, on served calc: the gateway and
    the episode records work on the openenv env as on calc itself."""
    from agentrl.eval.runner import EvalSet, evaluate_sets
    from agentrl.rollout.build import env_factory
    from agentrl.rollout.config import RolloutConfig
    from agentrl.run.context import make_rollout_context
    from tests.support.engines import ScriptedEngine
    from tests.support.tokenizers import tiny_tokenizer

    agent = Path(__file__).resolve().parents[2] / "examples" / "openai_sdk_agent.py"
    with serve_env("calc") as (url, _):
        config = RolloutConfig(env="openenv", env_kwarg=[f"url={url}"], agent_function_path=f"{agent}:run",
                               eval_max_prompts=2, rollout_max_context_len=4096, rollout_max_response_len=512)
        envs = env_factory(config)
        rows = make_env("calc").task_set("test", 2)  # the scripted model knows the answers; the
        # served rows (the agent's task) hold the public fields only

        def moves(text: str, rid: str) -> str:
            task = next(r for r in rows if r["question"] in text)
            if "<tool_response>" not in text:
                return ('<tool_call>\n{"name": "calculator", "arguments": {"expression": "'
                        + task["expression"] + '"}}\n</tool_call>')
            return f"The result is in.\nAnswer: {task['answer']}"

        async def play():
            engine = ScriptedEngine(tiny_tokenizer(), moves)
            engine.max_context_len = 4096
            ctx = make_rollout_context(config, engine, envs)
            try:
                return await evaluate_sets(ctx, [EvalSet("openenv", None, "openenv", "test")], "o")
            finally:
                await ctx.aclose()
                await envs.aclose()

        [(metrics, groups)] = asyncio.run(play()).values()
    samples = [s for g in groups for s in g]
    assert metrics["success_rate"] == 1.0, [s.metadata.get("error") for s in samples]
    assert all(s.metadata["finish"] == "agent" and s.metadata["gateway_calls"] == 2 for s in samples)
    assert metrics["gateway"] == {"segments": 2, "rewrites": 0, "dropped_replies": 0}


def test_the_guides_commands_run_as_written(tmp_path):
    """docs/guides/openenv.md's commands, each as the guide writes it but for the port (a free
    one for the guide's 8000) and, for train.py, one rollout into a folder of the test's: the
    server, then train.py and `agentrl eval` against it. The eval command once played the
    default oracle, which a served env lacks, and failed every episode."""
    import sys

    from tests.support.doc_commands import REPO, bash_commands

    guide = [c for w, c in bash_commands() if w.startswith("docs/guides/openenv.md:")]
    [serve] = [c for c in guide if c.startswith(".venv-openenv/bin/python -m agentrl serve-env calc")]
    [train] = [c for c in guide if c.startswith("python train.py --env openenv")]
    [evaluate] = [c for c in guide if c.startswith("python -m agentrl eval --env openenv")]
    port = str(free_port())

    def as_run(command: str, python: str) -> list[str]:
        words = shlex.split(command.replace("8000", port))
        return [python, *words[1:]]

    with running(as_run(serve, str(OPENENV_PYTHON)), port=int(port), cwd=REPO):
        trained = subprocess.run([*as_run(train, sys.executable), "--num-rollout", "1", "--no-progress",
                                  "--output-dir", str(tmp_path / "run")],
                                 cwd=REPO, capture_output=True, text=True, timeout=600)
        assert trained.returncode == 0, trained.stderr[-3000:]
        [row] = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
        assert row["rollout/failed"] == 0 and row["rollout/groups"] > 0  # episodes played on the server
        evaluated = subprocess.run(as_run(evaluate, sys.executable), cwd=tmp_path, capture_output=True,
                                   text=True, timeout=600)
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    assert "success rate" in evaluated.stdout and "Traceback" not in evaluated.stderr
