"""Drives an OpenEnv server with the ``openenv`` package's own client (run in .venv-openenv).

    openenv_driver.py URL ENV_ID ENV_KWARGS_JSON oracle SPLIT COUNT
        plays the direct env's scripted oracle through openenv's MCPToolClient on the first
        COUNT tasks of SPLIT (the oracle reads the direct env's rows: the server sends public
        fields only); prints one JSON line per episode: index, reward, done, terminated, and
        seen (every observation the client received, as JSON)
    openenv_driver.py URL ENV_ID ENV_KWARGS_JSON hold SPLIT
        opens a session, resets on task 0, plays one oracle turn, prints {"ready": true} and
        waits to be killed (a client that disappears mid-episode)
    openenv_driver.py URL ENV_ID ENV_KWARGS_JSON errors
        the bad-input checks on one session; prints one JSON line per check
"""

from __future__ import annotations

import asyncio
import base64
import io
import json
import shlex
import sys
import tarfile

from openenv.core.env_server.mcp_types import CallToolAction
from openenv.core.mcp_client import MCPToolClient

from agentrl.env import make_env


def harbor_oracle(direct, task, history):
    """Harbor's oracle mounts the solution into its own env's sandbox, which a client of the
    server has not got: this one sends the solution through the bash tool instead."""
    harbor = direct.harbor_task(task)
    if any(m.get("tool_calls") for m in history if m.get("role") == "assistant"):
        return {"role": "assistant", "content": "", "tool_calls": [{"name": "submit", "arguments": {}}]}
    packed = io.BytesIO()
    with tarfile.open(fileobj=packed, mode="w:gz") as tar:
        tar.add(harbor.solution_dir, arcname=".")
    payload = base64.b64encode(packed.getvalue()).decode()
    variables = " ".join(f"{k}={shlex.quote(v)}" for k, v in harbor.solution_env.items())
    command = (f"mkdir -p /tmp/solution && echo {payload} | base64 -d | tar -xzf - -C /tmp/solution && "
               f"env {variables} bash /tmp/solution/solve.sh")
    return {"role": "assistant", "content": "",
            "tool_calls": [{"name": "bash", "arguments": {"command": command, "timeout": 600}}]}


def oracle_action(direct, task, history):
    if (direct.env_id or "").startswith("harbor"):
        turn = harbor_oracle(direct, task, history)
    else:
        turn = direct.oracle_action(task, history)
    turn = turn if isinstance(turn, dict) else {"role": "assistant", "content": turn}
    message, calls, _ = direct._read_action(turn)
    if calls:
        call = calls[0]
        return message, CallToolAction(tool_name=call.name, arguments=dict(call.arguments))
    return message, CallToolAction(tool_name="final_answer", arguments={"content": message["content"]})


def grader_row(direct, split, index):
    """The whole task row, which only the direct env has: the server sends its public view."""
    return direct.task_set(split, limit=index + 1)[index]


async def play(client, direct, split, index):
    """One oracle episode; returns its last step and every observation the client received."""
    result = await client.reset(split=split, index=index)
    task, history = grader_row(direct, split, index), list(result.observation.messages)
    seen = [result.observation.model_dump(mode="json")]
    while True:
        message, action = oracle_action(direct, task, history)
        history.append(message)
        step = await client.step(action)
        seen.append(step.observation.model_dump(mode="json"))
        history.extend(step.observation.metadata.get("messages", []))
        if step.done:
            return step, seen


async def main() -> None:
    url, env_id, kwargs, mode = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), sys.argv[4]
    direct = make_env(env_id, **kwargs)
    async with MCPToolClient(base_url=url, message_timeout_s=600) as client:
        if mode == "oracle":
            split, count = sys.argv[5], int(sys.argv[6])
            for index in range(count):
                step, seen = await play(client, direct, split, index)
                print(json.dumps({"index": index, "reward": step.reward, "done": step.done,
                                  "terminated": step.observation.metadata.get("terminated"),
                                  "seen": seen}), flush=True)
        elif mode == "hold":
            result = await client.reset(split=sys.argv[5], index=0)
            task, history = grader_row(direct, sys.argv[5], 0), list(result.observation.messages)
            _, action = oracle_action(direct, task, history)
            await client.step(action)
            print(json.dumps({"ready": True}), flush=True)
            await asyncio.sleep(3600)
        elif mode == "errors":
            await errors(client, direct)
    direct.close()


async def errors(client, direct) -> None:
    def report(check, **fields):
        print(json.dumps({"check": check, **fields}), flush=True)

    try:
        await client.step(CallToolAction(tool_name="calculator", arguments={"expression": "1+1"}))
    except Exception as exc:  # noqa: BLE001 - the error the server sent, whatever its form
        report("step_before_reset", error=str(exc))
    await client.reset(split="test", index=0)
    step = await client.step(CallToolAction(tool_name="no_such_tool", arguments={}))
    report("unknown_tool", error=step.observation.error.model_dump(mode="json") if step.observation.error else None,
           result=step.observation.result, done=step.done)
    step = await client.step(CallToolAction(tool_name="calculator", arguments={"expression": 5}))
    report("schema_violation", error=step.observation.error.model_dump(mode="json") if step.observation.error else None,
           done=step.done)
    try:
        await client._send_and_receive({"type": "step", "data": {"type": "call_tool", "arguments": []}})
    except Exception as exc:  # noqa: BLE001
        report("malformed_action", error=str(exc))
    step = await client.step(CallToolAction(tool_name="final_answer", arguments={"content": "Answer: 0"}))
    report("final", done=step.done, reward=step.reward)
    try:
        await client.step(CallToolAction(tool_name="final_answer", arguments={"content": "again"}))
    except Exception as exc:  # noqa: BLE001
        report("step_after_end", error=str(exc))
    await client.reset(split="test", index=1)
    report("still_serving", ok=True)


if __name__ == "__main__":
    asyncio.run(main())
