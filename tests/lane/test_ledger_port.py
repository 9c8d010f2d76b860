"""The callout's ledger port (lane/callout/responder.py ``read_in_threads``; issue 14 item 4): a principal
whose row files are unchanged since they were parsed is answered on the lane's thread (the
``stat`` check only), a row that must be read is read in a worker thread, and a FIFO standing in
for a hung disk still holds only its own request."""

from __future__ import annotations

import os
import threading

import pytest
import trio

from cotal_trio.core.ledger import LedgerKind
from cotal_trio.lane.callout.responder import read_in_threads
from cotal_trio.state import LedgerReader, RootPaths, remove_row, row_path, write_row
from tests.support.ledger_files import OWNER, row


@pytest.fixture
def space(tmp_path):
    return RootPaths(tmp_path).space("demo")


class Reader(LedgerReader):
    """The callout's reader, noting each full read (a call) and the thread it ran on."""

    def __init__(self, space) -> None:
        super().__init__(space)
        self.reads: list[int] = []

    def __call__(self, owner, actor):
        self.reads.append(threading.get_ident())
        return super().__call__(owner, actor)


async def test_an_unchanged_row_is_read_with_no_thread_hop(space):
    reader = Reader(space)
    read = read_in_threads(reader, max_threads=2)
    first = row(LedgerKind.INTERACTIVE)
    write_row(space, first)
    assert await read(OWNER, "cli") == (first, None) and len(reader.reads) == 1  # parsed, in a thread
    assert reader.reads[0] != threading.get_ident()
    assert await read(OWNER, "cli") == (first, None) and len(reader.reads) == 1  # unchanged: no read, no hop
    regrant = row(LedgerKind.INTERACTIVE, scope=("run",))
    write_row(space, regrant)
    assert await read(OWNER, "cli") == (regrant, None) and len(reader.reads) == 2  # changed: read again
    remove_row(space, OWNER, "cli")
    assert await read(OWNER, "cli") == (None, None) and len(reader.reads) == 2  # gone: nothing to read
    assert reader.unchanged(OWNER, "cli") == (None, None)


async def test_a_fifo_row_is_never_opened_on_the_lanes_thread(space):
    reader = Reader(space)
    read = read_in_threads(reader, max_threads=2)
    path = write_row(space, row(LedgerKind.INTERACTIVE))
    await read(OWNER, "cli")
    fifo = path.with_name(path.name + ".fifo")
    os.mkfifo(fifo, 0o600)
    os.replace(fifo, path)  # a hung disk: opening it blocks
    assert reader.unchanged(OWNER, "cli") is None  # a new file: must be read, so not here
    with trio.move_on_after(0.3) as waited:  # the read blocks in its thread; this task stops
        await read(OWNER, "cli")
    assert waited.cancelled_caught and len(reader.reads) == 2 and reader.reads[1] != threading.get_ident()
    fd = os.open(row_path(space, LedgerKind.INTERACTIVE, OWNER, "cli"), os.O_RDWR | os.O_NONBLOCK)
    os.close(fd)  # lets the abandoned read end (it sees an empty row file)
