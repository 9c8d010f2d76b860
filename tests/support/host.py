"""The host under test with fake lanes: its config, a manifest's bytes and the waits on what it serves."""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Callable
from pathlib import Path

import trio
import trio.lowlevel

from cotal_trio.core.errors import Unavailable
from cotal_trio.core.manifest import SpaceEntry
from cotal_trio.service.host import Host, HostConfig, run_host

NEVER_S = 600.0  # a backstop that never fires within a test


class FakeLanes:
    """A ``start_lane`` factory whose lanes record their starts and full stops.

    Attributes:
        events: ``(kind, space)`` in order; ``"stop"`` is recorded at the very end of a lane's
            cleanup, which first waits ``cleanup_s`` (shielded), as a real lane's would.
        fail_start: space -> the error a start raises (before ``started``).
    """

    def __init__(self, cleanup_s: float = 0.05) -> None:
        self.events: list[tuple[str, str]] = []
        self.fail_start: dict[str, Exception] = {}
        self.cleanup_s = cleanup_s
        self._crash: dict[str, trio.Event] = {}

    def __call__(self, entry: SpaceEntry) -> Callable[..., object]:
        return functools.partial(self._run, entry)

    def starts(self, space: str) -> int:
        return self.events.count(("start", space))

    def crash(self, space: str) -> None:
        """Make the running lane of ``space`` raise Unavailable."""
        self._crash[space].set()

    async def _run(self, entry: SpaceEntry, *, task_status: trio.TaskStatus[str]) -> None:
        space = entry.space
        self.events.append(("start", space))
        await trio.lowlevel.checkpoint()
        if space in self.fail_start:
            raise self.fail_start[space]
        self._crash[space] = crash = trio.Event()
        try:
            task_status.started(space)
            await crash.wait()
            raise Unavailable(f"space {space}: the broker closed the callout connection")
        finally:
            with trio.move_on_after(1, shield=True):
                await trio.sleep(self.cleanup_s)
            self.events.append(("stop", space))


def manifest_bytes(*spaces: str | dict) -> bytes:
    entries = [{"space": s} if isinstance(s, str) else s for s in spaces]
    return json.dumps({"version": 2, "spaces": entries}).encode()


def move_over(path: Path, data: bytes) -> None:
    temp = path.with_name(path.name + ".new")
    temp.write_bytes(data)
    os.replace(temp, path)


def applied_of(manifest: Path) -> Path:
    return manifest.with_name(manifest.name + ".applied")


def states(doc: dict) -> dict[str, str]:
    return {space: lane["state"] for space, lane in doc["spaces"].items()}


async def applied_when(host: Host, manifest: Path, predicate: Callable[[dict], bool]) -> dict:
    """The first ``.applied`` document (as written on disk) for which ``predicate`` holds."""
    while True:
        doc = json.loads(applied_of(manifest).read_bytes())
        if predicate(doc):
            return doc
        await host.wait_written()


def serving(*spaces: str) -> Callable[[dict], bool]:
    return lambda doc: states(doc) == {space: "serving" for space in spaces}


def config(manifest: Path, lanes: FakeLanes, **overrides) -> HostConfig:
    fields = {"settle_s": 0.05, "backstop_s": NEVER_S, "retry_s": 0.2, "clock": lambda: 1_800_000_000.0}
    return HostConfig(manifest=manifest, start_lane=lanes, **(fields | overrides))


async def start_host(nursery: trio.Nursery, cfg: HostConfig) -> Host:
    return await nursery.start(run_host, cfg)
