"""The ledger reader from trio (cotal_trio/state/ledger_threads.py; issue 15 item 7)."""

from __future__ import annotations

import threading

import pytest
import trio

from cotal_trio.core.errors import CodecError, Unavailable
from cotal_trio.state.ledger_threads import BlockingCalls, read_in_threads

CEILING_S = 10


async def test_each_read_runs_off_the_trio_thread_and_returns_its_rows():
    trio_thread = threading.get_ident()
    seen: list[int] = []

    def read(owner: str, actor: str):
        seen.append(threading.get_ident())
        return (owner, actor), None

    with trio.fail_after(CEILING_S):
        assert await read_in_threads(read, max_threads=2)("u_x", "cli") == (("u_x", "cli"), None)
    assert seen and seen[0] != trio_thread


async def test_a_read_error_reaches_the_caller():
    def read(owner: str, actor: str):
        raise CodecError(f"ledger row {owner}.{actor} is corrupt")

    with trio.fail_after(CEILING_S), pytest.raises(CodecError, match="u_x.cli is corrupt"):
        await read_in_threads(read, max_threads=1)("u_x", "cli")


async def test_a_stalled_call_is_abandoned_at_its_deadline_and_holds_only_its_slot():
    released = threading.Event()
    calls = BlockingCalls(max_threads=2)
    with trio.fail_after(CEILING_S):
        with trio.move_on_after(0.2) as stalled:
            await calls.run(released.wait, CEILING_S)
        assert stalled.cancelled_caught  # the wait ended at the deadline, the thread still blocked
        assert await calls.run(lambda: "answered") == "answered"  # the other slot is free
        with trio.move_on_after(0.2) as full:  # both slots held: the next call waits for one
            async with trio.open_nursery() as nursery:
                nursery.start_soon(calls.run, released.wait, CEILING_S)
                await trio.sleep(0.05)
                await calls.run(lambda: "never")
        assert full.cancelled_caught
        released.set()
        assert await calls.run(lambda: "after release") == "after release"


async def test_run_within_answers_the_stalled_sentence_at_its_bound_and_passes_errors_on():
    """The host doors' bounded wait (http/manager_doors.py, http/lifecycle_doors.py)."""
    released = threading.Event()
    calls = BlockingCalls(max_threads=1)
    try:
        with trio.fail_after(CEILING_S):
            with pytest.raises(Unavailable, match="^the ledger did not answer$"):
                await calls.run_within(0.2, "the ledger did not answer", released.wait, CEILING_S)
            assert not released.is_set()  # abandoned at the bound, the thread still blocked
            with pytest.raises(Unavailable, match="no slot"):  # the one slot is held: waiting for it is bounded too
                await calls.run_within(0.2, "no slot", lambda: "never")
            released.set()
            with pytest.raises(CodecError, match="corrupt"):
                await calls.run_within(CEILING_S, "-", _corrupt)
            assert await calls.run_within(CEILING_S, "-", lambda: "answered") == "answered"
    finally:
        released.set()


def _corrupt() -> None:
    raise CodecError("ledger row u_x.cli is corrupt")


async def test_through_threads_reads_in_a_worker_thread_even_when_the_stat_check_would_answer():
    """The lane's probe (lane/health.py) must contend for the port's slots: ``through_threads``
    never takes the inline ``unchanged`` answer; ``unchanged`` is the reader's, or None."""
    trio_thread = threading.get_ident()
    seen: list[int] = []

    class Reader:
        def __call__(self, owner: str, actor: str):
            seen.append(threading.get_ident())
            return None, None

        def unchanged(self, owner: str, actor: str):
            return None, None  # gone files: a plain call would answer inline

    port = read_in_threads(Reader(), max_threads=1)
    with trio.fail_after(CEILING_S):
        assert await port("u_x", "cli") == (None, None) and seen == []  # inline
        assert await port.through_threads("u_x", "cli") == (None, None)
    assert len(seen) == 1 and seen[0] != trio_thread
    assert port.unchanged("u_x", "cli") == (None, None)
    assert read_in_threads(lambda owner, actor: (None, None), max_threads=1).unchanged("u_x", "cli") is None
