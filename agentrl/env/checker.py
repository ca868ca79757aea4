"""``check_env``: does an environment honour the :class:`~agentrl.ToolEnv` contract?

Run it on every new env before training (``agentrl check-env ID``). Each check plays a short
scripted episode and raises :class:`~agentrl.errors.EnvCheckError` naming the check that
failed and what was seen.
"""

from __future__ import annotations

import contextlib
import copy
import json
from collections.abc import Mapping
from typing import Any

from jsonschema.exceptions import SchemaError

from agentrl.env.core import ToolEnv, task_set_of
from agentrl.env.leakage import Leak, canary_row, find_leaks, value_needles
from agentrl.env.messages import message_problem
from agentrl.env.rewards import SUCCESS_REWARD
from agentrl.errors import (
    AgentRLError,
    EnvCheckError,
    NoTaskSetError,
    ToolErrorKind,
    UnknownSplitError,
)
from agentrl.tools.calls import TOOL_NAME_PATTERN, ToolCall
from agentrl.tools.tool import schema_validator

CHECKS = (
    "type",
    "tool schemas",
    "reset",
    "determinism",
    "mcp servers",
    "final answer",
    "reset needed",
    "unknown tool",
    "malformed call",
    "bad arguments",
    "truncation",
    "unknown split",
    "oracle",
    "leakage",
    "close",
)
"""The checks :func:`check_env` runs, in order."""

_UNKNOWN_TOOL = "agentrl_check_no_such_tool"
ORACLE_SUCCESS_RATE = 0.95
"""Share of the oracle's episodes that must succeed (``ToolEnv.oracle_action`` promises it)."""


def check_env(
    env: Any,
    *,
    seed: int = 0,
    options: Mapping[str, Any] | None = None,
    oracle_episodes: int = 5,
) -> list[str]:
    """Checks ``env`` against the ToolEnv contract; returns the checks that did not apply.

    Checks: it is a ``ToolEnv``; tool schemas are valid OpenAI-style function schemas with
    valid JSON Schema parameters and unique names; ``reset`` returns ``(messages, info)`` with a
    non-empty, valid message list and the schemas in ``info``; ``reset(seed=s)`` twice gives the
    same task and observation, and so does the unseeded ``reset()`` after each; a final answer
    (no tool calls) terminates with a float reward; stepping a finished episode raises
    ``ResetNeeded``; an unknown tool, a malformed call and arguments that are not an object each
    come back as an error tool message counted in ``info`` without ending the episode;
    ``max_turns`` tool turns truncate; an unknown split is refused with
    :class:`~agentrl.errors.UnknownSplitError` (an env with a task set); when the env has a scripted oracle (its
    ``oracle_action`` does not raise :class:`~agentrl.errors.AgentRLError`), playing it on
    ``oracle_episodes`` tasks (the first of ``task_set("test")``, else seeds; a fixed task in
    ``options`` once) succeeds on at least 95% of them; no private value of a task (a field
    its ``task_fields`` does not declare public) reaches the policy side (see
    :func:`_check_leakage`); ``close()`` twice is fine.

    An env with ``mcp_servers`` also gets its servers checked: the first ``reset`` starts them
    (a server that does not start, or lists a tool that cannot be offered, fails ``reset``);
    then every server is connected and offers at least one tool, the tool schemas are checked
    again with the servers' tools among them, ``info["tools"]`` has every one of them, a call
    that breaks a server tool's schema comes back as a ``schema_violation`` message (validated
    here, never sent), and after ``close()`` no server of the env is left running.

    Args:
        env: The environment (closed at the end).
        seed: Seed for the reset checks (and the first oracle episode played on seeds).
        options: Passed to every ``reset`` (e.g. a fixed ``{"task": row}``).
        oracle_episodes: Episodes the oracle plays (0 skips that check).

    Returns:
        The checks skipped, each with why (``oracle: the env has no scripted oracle ...``); an
        empty list when every check ran. Any check that ran passed.

    Raises:
        EnvCheckError: The first failed check, named in the message.
    """
    if not isinstance(env, ToolEnv):
        _fail("type", f"expected an agentrl.ToolEnv, got {type(env).__name__}")
    try:
        return _check_contract(env, seed, options, oracle_episodes)
    except EnvCheckError:
        with contextlib.suppress(Exception):  # the failed check is the news, not a failing close
            env.close()
        raise


def _check_contract(env: ToolEnv, seed: int, options: Mapping[str, Any] | None,
                    oracle_episodes: int) -> list[str]:
    """:func:`check_env` on a ToolEnv."""
    skipped: list[str] = []
    _check_schemas(env)

    runs = []
    for _ in range(2):
        first, first_info = _reset_with_info(env, seed, options)
        first_task = _row_of(env)
        after, after_info = _reset_with_info(env, None, options)
        runs.append((first, first_task, after, _row_of(env)))
    for what, index in (("observations", 0), ("tasks", 1)):
        for call, offset in ((f"reset(seed={seed})", 0), (f"reset() after reset(seed={seed})", 2)):
            one, two = _canonical(runs[0][index + offset]), _canonical(runs[1][index + offset])
            if one != two:
                _fail(
                    "determinism",
                    f"{call} gave different {what}:\n  {one[:300]}\n  {two[:300]}\nDraw tasks "
                    "from self.np_random (seeded by reset), not global random",
                )

    if env.mcp_servers:
        _check_mcp(env, after_info, seed, options)

    obs, reward, terminated, truncated, info = _step(env, "final answer", "I am done.")
    if not terminated or truncated:
        _fail("final answer", f"a turn without tool calls must terminate (got terminated="
              f"{terminated}, truncated={truncated})")
    try:
        env.step("again")
    except Exception as exc:  # noqa: BLE001 - any exception type is inspected below
        if type(exc).__name__ != "ResetNeeded":
            _fail("reset needed", f"stepping a finished episode raised {type(exc).__name__}: {exc}"
                  " instead of gymnasium.error.ResetNeeded")
    else:
        _fail("reset needed", "stepping a finished episode did not raise ResetNeeded")

    _reset(env, seed, options)
    unknown = {"role": "assistant", "content": "", "tool_calls": [{"name": _UNKNOWN_TOOL, "arguments": {}}]}
    _expect_tool_error(env, "unknown tool", unknown, ToolErrorKind.UNKNOWN_TOOL)

    garbage = env.format.render("", [ToolCall("x", {"a": 1})])
    broken = garbage[: max(1, len(garbage) - 3)]
    try:
        env.format.parse(broken)
    except Exception:  # noqa: BLE001 - only checking that this text is malformed
        _reset(env, seed, options)
        _expect_tool_error(env, "malformed call", broken, ToolErrorKind.PARSE_ERROR)

    if not len(env.toolbox):
        skipped.append("bad arguments: the env has no tools to call")
    else:
        name = env.toolbox.names[0]
        bad = {"role": "assistant", "content": "", "tool_calls": [{"name": name, "arguments": [1, 2]}]}
        _reset(env, seed, options)
        _expect_tool_error(env, "bad arguments", bad, ToolErrorKind.MALFORMED_ARGUMENTS)

    _reset(env, seed, options)
    for turn in range(1, env.max_turns + 1):
        _, reward, terminated, truncated, info = _step(env, "truncation", unknown)
        if terminated:
            _fail("truncation", f"a tool-calling turn terminated the episode at turn {turn}")
        if truncated != (turn == env.max_turns):
            _fail("truncation", f"truncated={truncated} at turn {turn} with max_turns="
                  f"{env.max_turns}; it must be true exactly at turn max_turns")
        if reward != 0.0:
            _fail("truncation", f"non-final turns must give reward 0.0, got {reward!r}")

    skip = _check_unknown_split(env)
    if skip:
        skipped.append(f"unknown split: {skip}")

    if oracle_episodes <= 0:
        skipped.append("oracle: not asked for (oracle_episodes=0)")
    elif not _check_oracle(env, seed, options, oracle_episodes):
        skipped.append("oracle: the env has no scripted oracle (its oracle_action raises "
                       "AgentRLError), so no episode was played to success")

    skip = _check_leakage(env, seed, options, max(1, oracle_episodes))
    if skip:
        skipped.append(f"leakage: {skip}")

    try:
        env.close()
        env.close()
    except Exception as exc:  # noqa: BLE001
        _fail("close", f"close() is not idempotent: {type(exc).__name__}: {exc}")
    if env.mcp_servers:
        if env.mcp_status():
            _fail("close", "the last episode's MCP connections are still open after close()")
        if running := env.mcp_servers_left_running():
            _fail("close", f"shared MCP servers still run after close(): {running}")
    return skipped


def _fail(check: str, message: str) -> None:
    raise EnvCheckError(f"check_env: '{check}' failed: {message}")


def _check_schemas(env: ToolEnv) -> None:
    names = set()
    for schema in env.toolbox.schemas:
        fn = schema.get("function") if isinstance(schema, Mapping) else None
        if schema.get("type") != "function" or not isinstance(fn, Mapping):
            _fail("tool schemas", f"not an OpenAI-style function schema: {schema!r}")
        name = fn.get("name")
        if not isinstance(name, str) or not TOOL_NAME_PATTERN.match(name):
            _fail("tool schemas", f"invalid tool name {name!r}")
        if name in names:
            _fail("tool schemas", f"duplicate tool name {name!r}")
        names.add(name)
        if not fn.get("description"):
            _fail("tool schemas", f"tool {name!r} has no description (add a docstring)")
        params = fn.get("parameters")
        if not isinstance(params, Mapping) or params.get("type") != "object":
            _fail("tool schemas", f"tool {name!r}: parameters must be a JSON Schema of type object")
        try:
            schema_validator(params).check_schema(params)
        except SchemaError as exc:
            _fail("tool schemas", f"tool {name!r}: invalid JSON Schema: {exc.message}")


def _check_mcp(env: ToolEnv, info: Mapping[str, Any], seed: int,
               options: Mapping[str, Any] | None) -> None:
    """The "mcp servers" check, on the episode the determinism check left open."""
    status = env.mcp_status()
    labels = [s.get("name") for s in status]
    for server in env.mcp_servers:
        if server.label not in labels:
            _fail("mcp servers", f"MCP server {server.label!r} is not part of the episode "
                  f"(episode servers: {labels})")
    for entry in status:
        if not entry.get("connected"):
            _fail("mcp servers", f"MCP server {entry['name']!r} is not connected after reset")
        if not entry.get("tools"):
            _fail("mcp servers", f"MCP server {entry['name']!r} ({entry.get('server_info')}) "
                  "offers no tools")
    _check_schemas(env)
    listed = {s.get("function", {}).get("name") for s in info.get("tools", [])}
    mcp_tools = [name for entry in status for name in entry["tools"]]
    absent = [name for name in mcp_tools if name not in listed]
    if absent:
        _fail("mcp servers", f"info['tools'] lacks the MCP tools {absent}")
    for name in mcp_tools:
        tool = env.toolbox.get(name)
        if tool is not None and tool.parameters.get("required"):
            bad = {"role": "assistant", "content": "", "tool_calls": [{"name": name, "arguments": {}}]}
            if _expect_tool_error(env, "mcp servers", bad, ToolErrorKind.SCHEMA_VIOLATION):
                _reset(env, seed, options)  # max_turns=1: that turn ended the episode
            break


def _check_oracle(
    env: ToolEnv, seed: int, options: Mapping[str, Any] | None, episodes: int
) -> bool:
    """Plays the oracle on ``episodes`` tasks; returns False (nothing played) when
    ``oracle_action`` raises AgentRLError on the first turn (the env has none)."""
    plays = _plays(env, "oracle", seed, options, episodes)
    failures = []
    for index, (label, play_seed, play_options) in enumerate(plays):
        _, info = _reset_with_info(env, play_seed, play_options)
        reward, terminated, truncated, turn = 0.0, False, False, 0
        while not (terminated or truncated):
            try:
                action = env.oracle_action(env.state.task, list(env.messages))  # the expert knows the row
            except AgentRLError as exc:
                if index == 0 and turn == 0:
                    return False  # the env has no scripted oracle
                _fail("oracle", f"{label}: oracle_action raised {type(exc).__name__} at turn "
                      f"{turn + 1}: {exc}")
            except Exception as exc:  # noqa: BLE001 - reported as the failed check
                _fail("oracle", f"{label}: oracle_action raised {type(exc).__name__}: {exc}")
            _, reward, terminated, truncated, _ = _step(env, "oracle", action)
            turn += 1
        if not (terminated and reward >= SUCCESS_REWARD):
            end = "terminated" if terminated else "truncated"
            last = env.messages[-1]["content"] if env.messages else ""
            failures.append(f"{label}: reward {reward!r} ({end} after {turn} turns; last "
                            f"message {last!r:.150})")
    successes = len(plays) - len(failures)
    if successes < ORACLE_SUCCESS_RATE * len(plays):
        _fail(
            "oracle",
            f"the scripted oracle solved {successes} of {len(plays)} episodes; "
            f"ToolEnv.oracle_action must reach >= {ORACLE_SUCCESS_RATE:.0%} success (reward 1). "
            "Fix the oracle or the grader; an env without an oracle lets oracle_action raise "
            "AgentRLError (the default). Failed:\n  " + "\n  ".join(failures),
        )
    return True


_NO_SUCH_SPLIT = "agentrl-check-no-such-split"


def _check_unknown_split(env: ToolEnv) -> str | None:
    """The "unknown split" check: asking for a split the env lacks is an
    :class:`~agentrl.errors.UnknownSplitError` (a ``KeyError`` naming the split counts: the
    callers turn it into one). Returns why it did not apply (no task set), else ``None``."""
    try:
        rows = task_set_of(env, _NO_SUCH_SPLIT, 1)
    except NoTaskSetError:
        return "the env has no task set (its task_set raises NoTaskSetError)"
    except UnknownSplitError:
        return None
    except Exception as exc:  # noqa: BLE001 - reported as the failed check
        _fail("unknown split", f"task_set({_NO_SUCH_SPLIT!r}) raised {type(exc).__name__}: {exc}; "
              "call agentrl.env.check_split(self, split, SPLITS) first in task_set")
    _fail("unknown split", f"task_set({_NO_SUCH_SPLIT!r}) returned {len(rows)} task(s) instead of "
          "refusing the split; call agentrl.env.check_split(self, split, SPLITS) first in task_set")
    return None


def _plays(env: ToolEnv, check: str, seed: int, options: Mapping[str, Any] | None,
           episodes: int) -> list[tuple[str, int, Mapping[str, Any] | None]]:
    """The episodes a check plays: (label, seed, reset options). The first ``episodes`` tasks
    of ``task_set("test")``, else seeds; a fixed task (``options={"task": row}``) once, as
    more episodes would only repeat it."""
    plays: list[tuple[str, int, Mapping[str, Any] | None]] = []
    if not options:
        try:
            tasks = task_set_of(env, "test", episodes)
        except AgentRLError:  # no fixed task set (or no test split): play seeds instead
            tasks = []
        except Exception as exc:  # noqa: BLE001 - reported as the failed check
            _fail(check, f"task_set('test') raised {type(exc).__name__}: {exc}")
        for i, task in enumerate(tasks[:episodes]):
            label = str(task.get("id", task.get("task_id", f"test task {i}")))
            plays.append((label, seed + i, {"task": task}))
    wanted = 1 if options and "task" in options else episodes
    while len(plays) < wanted:
        i = len(plays)
        plays.append((f"reset(seed={seed + i})", seed + i, options))
    return plays


_SEARCHED_DIRS = ("/workspace", "/tmp", "/app", "/home", "/root")
"""Where the leakage check looks for private values in an episode's sandbox before the first
action: the workspace and the usual places a task puts files."""


def _check_leakage(env: ToolEnv, seed: int, options: Mapping[str, Any] | None,
                   episodes: int) -> str | None:
    """The "leakage" check: no private value of a task reaches the policy side.

    For each task the oracle check plays, the env plays it with every private value replaced
    by a canary (:func:`~agentrl.env.leakage.canary_row`; an env whose setup cannot start on
    such a row plays the real row, and its private strings of 8+ characters are looked for
    instead). Looked through: the first observation, reset's ``info`` (its ``task``), the
    task's public view (what ``agentrl serve-env`` and black-box agents get), the files in the
    episode's sandbox before the first action (:data:`_SEARCHED_DIRS`), the null policy's
    turn, and the answers to a call of every tool with the plainest arguments its schema
    allows. The oracle's episode is not: a tool may rightly give a private value to a proper
    request (a lookup tool serving the task's dictionary), which is the task, not a leak.

    Returns:
        Why the check did not run (the env declares no ``task_fields``), else ``None``.
    """
    fields = env.task_fields
    if fields is None:
        return ("the env declares no task_fields (agentrl.TaskFields), so nothing tells its "
                "answers from its questions: its tasks are all private (info['task'] is empty); "
                "declare which fields are public to have them checked")
    for label, play_seed, play_options in _plays(env, "leakage", seed, options, episodes):
        if play_options and "task" in play_options:
            row = dict(play_options["task"])
        else:
            _reset_with_info(env, play_seed, play_options)
            assert env.state is not None
            row = dict(env.state.task)
        leaks = _leaks_of(env, fields, row)
        if leaks:
            listed = "\n  ".join(str(leak) for leak in leaks[:10])
            _fail("leakage", f"task {label}: private task fields reach the policy side:\n  {listed}\n"
                  "Keep them out of make_prompt, the tools' outputs and the sandbox's files before "
                  "grading, or, if the policy may see them, list them in task_fields' public")
    return None


def _leaks_of(env: ToolEnv, fields: Any, row: dict[str, Any]) -> list[Leak]:
    """The leaks found playing ``row`` (see :func:`_check_leakage`)."""
    played, needles = canary_row(fields, row)
    try:
        observation, info = env.reset(options={"task": played})
    except Exception:  # noqa: BLE001 - its setup needs a private value: look for the values
        played, needles = row, value_needles(fields, row)
        observation, info = _reset_with_info(env, None, {"task": row})
    if not needles:
        return []
    leaks = [*find_leaks(needles, observation, "the first observation"),
             *find_leaks(needles, info, "reset's info"),
             *find_leaks(needles, env.public_task(played), "the task's public view"),
             *_sandbox_leaks(env, needles)]
    # the null policy's turn, then one plain call of each tool (a careless model's first
    # calls). The oracle's episode is not looked through: a tool may rightly answer a proper
    # request with a private value (a lookup tool serves the task's dictionary).
    try:
        info = env.step(env.null_action(env.state.task, list(env.messages)))[4]
    except Exception:  # noqa: BLE001 - a grader a canary breaks: the turn shows nothing
        info = {}
    leaks += find_leaks(needles, info, "the null policy's turn's info")
    env.reset(options={"task": played})
    for turn, call in enumerate(_probe_calls(env)[: env.max_turns], start=1):
        action = {"role": "assistant", "content": "", "tool_calls": [call]}
        try:
            observation, _, terminated, truncated, info = env.step(action)
        except Exception:  # noqa: BLE001 - a tool that breaks on plain arguments shows nothing
            break
        leaks += find_leaks(needles, [observation, info], f"the answer to {call['name']}() "
                            f"with plain arguments (turn {turn})")
        if terminated or truncated:
            break
    return list(dict.fromkeys(leaks))


def _probe_calls(env: ToolEnv) -> list[dict[str, Any]]:
    """One call per tool with the plainest arguments its schema allows (empty strings, zeros,
    the first enum value), as a model's first careless call: what a tool tells anyone."""
    plain = {"string": "", "integer": 0, "number": 0, "boolean": False, "array": [], "object": {}}
    calls = []
    for schema in env.toolbox.schemas:
        fn = schema["function"]
        properties = fn["parameters"].get("properties", {})
        arguments = {}
        for name in fn["parameters"].get("required", []):
            spec = properties.get(name, {})
            kind = spec.get("type")
            arguments[name] = (spec["enum"][0] if spec.get("enum") else
                               plain.get(kind if isinstance(kind, str) else "string", ""))
        calls.append({"name": fn["name"], "arguments": arguments})
    return calls


def _sandbox_leaks(env: ToolEnv, needles: Mapping[str, str]) -> list[Leak]:
    """The private values in files of the episode's sandbox (none without one)."""
    sandbox = getattr(env, "sandbox", None)
    if sandbox is None:
        return []
    wanted = [n for n in needles if n and "\n" not in n]  # grep -f reads one pattern per line
    if not wanted:
        return []
    command = "grep -rIHoF -f - " + " ".join(_SEARCHED_DIRS) + " 2>/dev/null; true"
    result = env._run_sync(sandbox.exec(command, stdin="\n".join(wanted) + "\n", timeout=60))
    leaks = []
    for line in result.stdout.splitlines():  # path:needle
        for needle in wanted:
            if line.endswith(":" + needle):
                leaks.append(Leak(needles[needle], f"the sandbox's file {line[:-len(needle) - 1]} "
                                  "before the first action"))
    return leaks


def _row_of(env: ToolEnv) -> dict[str, Any] | None:
    """The whole task row of the episode just reset (the grader's, not ``info["task"]``)."""
    return copy.deepcopy(dict(env.state.task)) if env.state is not None else None


def _reset(env: ToolEnv, seed: int, options: Mapping[str, Any] | None) -> list[dict]:
    return _reset_with_info(env, seed, options)[0]


def _reset_with_info(
    env: ToolEnv, seed: int | None, options: Mapping[str, Any] | None
) -> tuple[list[dict], dict]:
    call = f"reset(seed={seed})" if seed is not None else "reset()"
    try:
        result = env.reset(seed=seed, options=dict(options) if options else None)
    except Exception as exc:  # noqa: BLE001 - reported as the failed check
        _fail("reset", f"{call} raised {type(exc).__name__}: {exc}")
    if not isinstance(result, tuple) or len(result) != 2:
        _fail("reset", f"reset() must return (observation, info), got {_shape(result)}")
    obs, info = result
    if not isinstance(obs, list) or not obs:
        _fail("reset", "the first observation must be a non-empty list of messages")
    for i, message in enumerate(obs):
        problem = message_problem(message)
        if problem:
            _fail("reset", f"observation[{i}]: {problem}")
    if obs[0]["role"] not in ("system", "user"):
        _fail("reset", f"the first message must be system or user, got {obs[0]['role']!r}")
    if not isinstance(info, dict) or "tools" not in info:
        _fail("reset", "info must be a dict with the tool schemas under 'tools'")
    return obs, info


def _step(env: ToolEnv, check: str, action: Any) -> tuple:
    try:
        result = env.step(action)
    except Exception as exc:  # noqa: BLE001 - reported as the failed check
        _fail(check, f"step({action!r:.120}) raised {type(exc).__name__}: {exc}")
    if not isinstance(result, tuple) or len(result) != 5:
        _fail(check, "step() must return (observation, reward, terminated, truncated, info), "
              f"got {_shape(result)}")
    obs, reward, terminated, truncated, info = result
    if not isinstance(obs, list) or any(message_problem(m) for m in obs):
        _fail(check, f"step observation must be a list of valid messages, got {obs!r:.200}")
    if isinstance(reward, bool) or not isinstance(reward, int | float):
        _fail(check, f"reward must be a float, got {type(reward).__name__}")
    if not isinstance(terminated, bool) or not isinstance(truncated, bool):
        _fail(check, "terminated and truncated must be bools")
    if not isinstance(info, dict):
        _fail(check, f"info must be a dict, got {type(info).__name__}")
    return result


def _expect_tool_error(env: ToolEnv, check: str, action: Any, kind: ToolErrorKind) -> bool:
    """Steps ``action``, expecting one ``kind`` error message; returns ``truncated``."""
    obs, _, terminated, truncated, info = _step(env, check, action)
    if terminated:
        _fail(check, "a failed tool call must not end the episode")
    if len(obs) != 1 or obs[0]["role"] != "tool" or "Error" not in obs[0]["content"]:
        _fail(check, f"expected one error tool message, got {obs!r:.300}")
    if info.get("tool_errors", {}).get(kind.value) != 1:
        _fail(check, f"info['tool_errors'] must count one {kind.value!r}, got {info.get('tool_errors')!r}")
    return truncated


def _canonical(obs: Any) -> str:
    return json.dumps(obs, sort_keys=True, default=repr)


def _shape(value: Any) -> str:
    if isinstance(value, tuple):
        return f"a tuple of {len(value)}"
    return type(value).__name__
