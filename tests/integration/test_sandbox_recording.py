"""The command log a sandboxed env keeps of each episode (``metadata["commands"]``): every
operation goes through to the sandbox unchanged and is recorded with its phase, turn, exit
code and the head of its output, and the log stays bounded."""

from __future__ import annotations

import asyncio

import pytest

from agentrl.sandbox import create_sandbox
from agentrl.sandbox.recording import MAX_ENTRIES, OUTPUT_HEAD, CommandLog, RecordingSandbox

pytestmark = pytest.mark.integration


def _in_sandbox(body):
    """Runs ``body(recording, position)`` over a started process sandbox, then closes it."""

    async def main():
        inner = create_sandbox("process")
        await inner.start()
        position = {"phase": "setup", "turn": 0}
        try:
            return await body(RecordingSandbox(inner, CommandLog(lambda: (position["phase"], position["turn"]))),
                              position)
        finally:
            await inner.close()

    return asyncio.run(main())


def test_each_operation_runs_in_the_sandbox_and_is_logged_with_its_phase():
    _in_sandbox(_operations)


async def _operations(recording, position):
    await recording.write_file("notes.txt", "hello")
    position.update(phase="tools", turn=1)
    result = await recording.exec("cat notes.txt; echo oops >&2; exit 3")
    assert (result.exit_code, result.stdout) == (3, "hello")  # the sandbox's own answer
    assert await recording.read_file("notes.txt") == b"hello"
    shell = await recording.open_shell()
    assert (await shell.run("echo $((6 * 7))")).stdout.strip() == "42"
    await shell.close()
    position.update(phase="grade", turn=2)
    await recording.exec(["python3", "-c", "print('graded')"])
    entries = recording.log.to_list()
    assert [(e["phase"], e["turn"], e["kind"]) for e in entries] == [
        ("setup", 0, "write"), ("tools", 1, "exec"), ("tools", 1, "read"), ("tools", 1, "shell"),
        ("grade", 2, "exec")]
    assert entries[0]["bytes"] == 5 and entries[0]["command"] == "notes.txt"
    assert entries[1]["exit_code"] == 3 and entries[1]["output"] == "hello\noops\n"
    assert entries[4]["command"] == "python3 -c 'print('\"'\"'graded'\"'\"')'"
    assert all(e["duration_s"] >= 0 for e in entries)


def test_the_log_keeps_the_head_of_a_long_output_and_a_bounded_number_of_entries():
    _in_sandbox(_long_and_many)


async def _long_and_many(recording, _):
    await recording.exec(f"python3 -c \"print('x' * {OUTPUT_HEAD * 3})\"")
    first = recording.log.entries[0]
    assert first["output"].startswith("x" * OUTPUT_HEAD) and "more characters]" in first["output"]
    assert first["output_chars"] == OUTPUT_HEAD * 3 + 1
    for _ in range(MAX_ENTRIES + 5):
        await recording.write_file("f", "1")
    entries = recording.log.to_list()
    assert len(entries) == MAX_ENTRIES + 1 and entries[-1] == {"kind": "dropped", "count": 6}


def test_closing_the_wrapper_leaves_the_lent_sandbox_to_its_pool():
    _in_sandbox(_close)


async def _close(recording, _):
    await recording.close()
    assert not recording.closed and not recording.inner.closed  # closed is the lent sandbox's
    assert (await recording.inner.exec("echo still here")).stdout.strip() == "still here"
    await recording.inner.close()
    assert recording.closed
