"""``_finish_stepped``: the task that finishes a publish stepped by hand (DESIGN.md section 5).

It plays the part of the task that would have run the publish coroutine, so a cancel of it
must reach the coroutine as it would under its own task, and end the task cancelled. The
first three are plain asyncio (no broker: the stepping is nats-py-independent); the last
overflows nats-py's buffer against a real broker.
"""

from __future__ import annotations

import asyncio
import logging

import trio

from cotal_trio.natsio import Message, open_connection, open_loop
from cotal_trio.natsio._conn import _finish_stepped


def _stepped(body):
    """A coroutine stepped once by hand, as ``publish_nowait`` does: (coroutine, what it awaits)."""
    coro = body()
    return coro, coro.send(None)


def test_a_cancel_that_lands_once_the_awaited_future_is_done_ends_the_task_cancelled():
    # Issue 16 (lint ASYNC): the awaited future is done and the task's wakeup scheduled when the
    # cancel arrives, so asyncio throws CancelledError into the task itself. Swallowed, the
    # publish ran on to its end and the task reported success: a cancel lost.
    async def main() -> tuple[bool, list[str]]:
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        resumed: list[str] = []

        async def publish() -> None:
            await fut
            resumed.append("ran on after the cancel")

        coro, awaited = _stepped(publish)
        task = loop.create_task(_finish_stepped(coro, awaited, "s"))
        await asyncio.sleep(0)  # the task now waits on the future
        fut.set_result(None)  # its wakeup is scheduled ...
        task.cancel()  # ... and the cancel lands before that wakeup runs
        await asyncio.wait([task])
        return task.cancelled(), resumed

    assert asyncio.run(main()) == (True, [])


def test_a_cancel_while_the_future_is_pending_ends_the_task_cancelled():
    async def main() -> tuple[bool, list[str]]:
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        seen: list[str] = []

        async def publish() -> None:
            try:
                await fut
            except asyncio.CancelledError:
                seen.append("cancelled")
                raise

        coro, awaited = _stepped(publish)
        task = loop.create_task(_finish_stepped(coro, awaited, "s"))
        await asyncio.sleep(0)
        task.cancel()
        await asyncio.wait([task])
        return task.cancelled(), seen

    assert asyncio.run(main()) == (True, ["cancelled"])


def test_the_awaited_outcome_is_read_by_the_coroutine_and_a_failure_logged(caplog):
    async def main() -> list[str]:
        loop = asyncio.get_running_loop()
        first, second = loop.create_future(), loop.create_future()
        steps: list[str] = []

        async def publish() -> None:
            steps.append(f"first gave {await first}")
            try:
                await second
            except OSError as exc:
                steps.append(f"second raised {exc}")
            raise ValueError("the buffer is gone")

        coro, awaited = _stepped(publish)
        task = loop.create_task(_finish_stepped(coro, awaited, "agents.x"))
        await asyncio.sleep(0)
        first.set_result(7)
        await asyncio.sleep(0)
        second.set_exception(OSError("socket closed"))
        await task  # a failure of the publish is logged, not raised
        return steps

    # at_level: `cotal check` run in-process by an earlier test leaves cotal.natsio at ERROR
    with caplog.at_level(logging.WARNING, logger="cotal.natsio"):
        assert asyncio.run(main()) == ["first gave 7", "second raised socket closed"]
    assert [r.getMessage() for r in caplog.records] == ["publish to agents.x failed: the buffer is gone"]


async def test_publishes_past_the_buffer_limit_are_finished_not_failed(plain_broker: str, caplog) -> None:
    # Against a real broker: past nats-py's 2 MiB outgoing buffer a publish suspends on its
    # forced flush (an ``asyncio.wait_for``). Each such publish failed at once with "await
    # wasn't used with future" (the swallowed first error hid it) and its flush was never
    # waited for; finished as a task would, no publish fails and each task ends cleanly.
    chunk = b"x" * 900_000
    tasks: list[asyncio.Task[None]] = []
    with caplog.at_level(logging.WARNING, logger="cotal.natsio"), trio.fail_after(20):
        send, receive = trio.open_memory_channel[Message](20)
        async with open_loop():
            async with open_connection(plain_broker) as watcher:
                await watcher.subscribe("big", on_message=send.send_nowait)
                await watcher.flush()
                async with open_connection(plain_broker) as conn:
                    for i in range(8):
                        conn.publish_nowait("big", bytes([i]) + chunk)
                        tasks += [task for task in conn._stepped if task not in tasks]
                    assert tasks, "the buffer limit was not reached: the test proves nothing"
                await watcher.flush()
                got = [(await receive.receive()).data[0] for _ in range(8)]
    assert got == list(range(8))
    assert [(task.done(), task.cancelled(), task.exception()) for task in tasks] == [(True, False, None)] * len(tasks)
    assert [r.getMessage() for r in caplog.records if "failed" in r.getMessage()] == []
