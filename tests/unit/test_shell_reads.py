"""The shell session's two marker reads (stdout and stderr) end together: on an error, a timeout
or the caller's cancellation the other is cancelled, and nothing is left for asyncio to report
as "never retrieved" (a Ctrl-C during a sandbox command printed such a traceback)."""

import asyncio

import pytest

from agentrl.sandbox.shell import _both_markers


def run_reporting(coroutine_factory) -> list[str]:
    """Runs the scenario and returns what the loop's exception handler was given."""
    reported: list[str] = []

    async def main() -> None:
        asyncio.get_running_loop().set_exception_handler(lambda loop, ctx: reported.append(ctx["message"]))
        await coroutine_factory()
        await asyncio.sleep(0.05)  # let cancelled reads finish and be collected

    asyncio.run(main())
    return reported


async def forever():
    await asyncio.Event().wait()


async def ends_at_eof():
    await asyncio.sleep(0.01)
    raise EOFError("shell exited")


async def answers(value):
    return value


def test_both_answers_come_back_in_order():
    async def scenario():
        assert await _both_markers(answers("out"), answers("err"), 5) == ("out", "err")
    assert run_reporting(scenario) == []


def test_the_first_error_ends_both_reads():
    async def scenario():
        with pytest.raises(EOFError):
            await _both_markers(forever(), ends_at_eof(), 5)
    assert run_reporting(scenario) == []


def test_a_timeout_ends_both_reads():
    async def scenario():
        with pytest.raises(TimeoutError):
            await _both_markers(forever(), forever(), 0.05)
    assert run_reporting(scenario) == []


def test_cancelling_the_caller_leaves_nothing_unretrieved():
    async def scenario():
        call = asyncio.ensure_future(_both_markers(forever(), ends_at_eof(), 5))
        await asyncio.sleep(0)
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
    assert run_reporting(scenario) == []


def test_cancelling_every_task_at_once_leaves_nothing_unretrieved():
    """What asyncio.run's shutdown does on Ctrl-C: the caller and both reads cancelled in one go
    (asyncio.gather under wait_for reported "_GatheringFuture exception was never retrieved")."""
    async def scenario():
        call = asyncio.ensure_future(_both_markers(forever(), forever(), 5))
        await asyncio.sleep(0.01)
        for task in asyncio.all_tasks():
            if task is not asyncio.current_task():
                task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
    assert run_reporting(scenario) == []
