"""Issue 15 item 11, "Status never claims what is not true", on a real nats-server.

A lane whose ledger stops answering (reads that hang, as on a stalled or full disk, or reads
that fail) cannot answer a connect: every one would time out or be denied at the ledger step.
Before the fix ``.applied`` kept saying ``serving`` until someone restarted the process. Now the
lane's self-probe (``lane/health.py``) ends the lane with the reason; the host shows it
``retrying`` with that reason in ``.applied`` and in the unit's STATUS text, retries it, and the
lane serves again by itself once the ledger answers. The fault is injected at the lane's ledger
port (``wrap_ledger``), never on the machine's disks.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest
import trio

from cotal_trio.core.admission import CalloutLimits
from cotal_trio.core.errors import CodecError
from cotal_trio.core.ledger import LedgerKind, LedgerRow, ReadRows
from cotal_trio.service.host import Host, HostConfig, run_host
from cotal_trio.lane.spec import LaneCommon
from cotal_trio.service.hosting import FullLanes, lane_factory
from cotal_trio.service.notify import status_text
from cotal_trio.state import LedgerReader, SpacePaths
from cotal_trio.state.ledger_files import kind_dir
from tests.support.service import AUTH_TIMEOUT_S, Mesh, refused, serving, start_mesh, until, write_manifest

pytestmark = [pytest.mark.broker, pytest.mark.filterwarnings("error::ResourceWarning")]

CEILING_S = 60
HANG_CAP_S = 30.0  # a hung read gives up after this (the test has failed by then)


class FaultyReader(LedgerReader):
    """The lane's LedgerReader with a switch on its reads: healthy, hanging or failing.

    A LedgerReader subclass, so the lane's port keeps its inline ``stat`` check (``unchanged``)
    exactly as in production: a principal no one holds is answered without a read, and a probe
    through that check would never see the hanging reads (issue 15 item 11 after issue 14 item 4).
    """

    def __init__(self, space_paths: SpacePaths, ledger: Ledger) -> None:
        super().__init__(space_paths)
        self._ledger = ledger

    def __call__(self, owner: str, actor: str) -> tuple[LedgerRow | None, LedgerRow | None]:
        if self._ledger.mode == "hang":
            self._ledger.mended.wait(HANG_CAP_S)
        elif self._ledger.mode == "fail":  # what the real reader raises for an EIO
            raise CodecError(f"ledger row {owner}.{actor} is unreadable (Input/output error)")
        return super().__call__(owner, actor)


class Ledger:
    """The switch of the lane's FaultyReader."""

    def __init__(self, space_paths: SpacePaths) -> None:
        self.space_paths = space_paths
        self.mode: str | None = None
        self.mended = threading.Event()

    def wrap(self, read: ReadRows) -> ReadRows:
        assert isinstance(read, LedgerReader)
        return FaultyReader(self.space_paths, self)

    def touch_rows(self) -> None:
        """Every row file changes its ``stat`` (ctime), so the next connect must read its row."""
        for path in kind_dir(self.space_paths, LedgerKind.INTERACTIVE).glob("*.json"):
            os.utime(path)

    def mend(self) -> None:
        self.mode = None
        self.mended.set()


@pytest.fixture
async def mesh(nursery: trio.Nursery, tmp_path: Path, nats_server_bin: str) -> Mesh:
    """As tests/support/service.py's ``mesh`` fixture (auth timeout 1 s)."""
    return (await start_mesh(nursery, tmp_path, nats_server_bin))[0]


def retrying_with(words: str):
    return lambda spaces: spaces.get("a", {}).get("state") == "retrying" and words in spaces["a"].get("reason", "")


@pytest.mark.parametrize(("mode", "words"), [
    ("hang", f"a ledger read did not answer within {AUTH_TIMEOUT_S - 0.25:g} s"),
    ("fail", "the ledger cannot be read (ledger row u_aaaaaaaaaaaaaaaaaaaaaaaaaa.cotal_probe is unreadable"),
])
async def test_a_lane_whose_ledger_does_not_answer_is_not_serving_and_comes_back(
    mode: str, words: str, mesh: Mesh, nursery: trio.Nursery, tmp_path: Path,
):
    ledger, manifest = Ledger(mesh.paths.space("a")), tmp_path / "spaces.json"
    write_manifest(manifest, "a")
    common = LaneCommon(
        server_url=mesh.server_url, limits=CalloutLimits(auth_timeout_s=AUTH_TIMEOUT_S),
        clock=time.time, wrap_ledger=ledger.wrap, probe_every_s=0.5,  # production: 5 s
    )
    start_lane = lane_factory(root=mesh.paths, common=common, lanes=FullLanes())
    config = HostConfig(manifest=manifest, start_lane=start_lane, backstop_s=600, retry_s=0.5)
    with trio.fail_after(CEILING_S):
        host: Host = await nursery.start(run_host, config)
        await until(host, manifest, serving("a"))
        mesh.grant("a", "alice", "cli")
        bearer = await mesh.bearer("a", "alice", "cli")
        await mesh.admitted("a", bearer)

        ledger.mode = mode
        ledger.touch_rows()  # alice's connect reads her row (the inline check cannot answer it)
        with refused():  # the connect times out, or is denied, at the ledger step
            await mesh.admitted("a", bearer)
        spaces = await until(host, manifest, retrying_with(words))
        assert spaces["a"]["reason"].startswith("space a: the lane cannot answer connects - "), spaces
        assert "retrying: a (space a: the lane cannot answer connects" in status_text(host.current_states())

        ledger.mend()  # the cause is gone: the lane serves again by itself
        await until(host, manifest, serving("a"))
        await mesh.admitted("a", bearer)
