"""In-memory lifecycle rows and records for the lifecycle doors, and a log of what they were asked."""

from __future__ import annotations

from dataclasses import dataclass, field

import trio

from cotal_trio.core.identity import derive_owner
from cotal_trio.core.ledger import LedgerKind
from cotal_trio.natsio import KeyExists, KvEntry, WrongRevision
from cotal_trio.state import SpacePaths, row_path

OWNER = derive_owner(bytes(range(32)), "https://idp.example", "alice")


@dataclass
class Log:
    """Every store write, in order: ``(op, key, row file present?)``."""

    paths: SpacePaths
    kind: LedgerKind = LedgerKind.INTERACTIVE
    events: list[tuple[str, str, bool]] = field(default_factory=list)

    def note(self, op: str, key: str) -> None:
        self.events.append((op, key, row_path(self.paths, self.kind, OWNER, "cli").exists()))


@dataclass
class FakeRecords:
    """The records store's ``put_record``/``get_record`` (stores.records.RecordsStore), in memory."""

    log: Log
    values: dict[str, tuple[bytes, int | None]] = field(default_factory=dict)
    fail: Exception | None = None

    async def put_record(self, key: str, value: bytes, *, ttl_s: int | None) -> None:
        await trio.lowlevel.checkpoint()
        if self.fail is not None:
            raise self.fail
        self.log.note("put", key)
        self.values[key] = (value, ttl_s)

    async def get_record(self, key: str) -> bytes | None:
        await trio.lowlevel.checkpoint()
        found = self.values.get(key)
        return None if found is None else found[0]


def _matches(pattern: str, key: str) -> bool:
    """NATS subject matching of a KV key against a pattern (``*`` one token, ``>`` the rest)."""
    want, have = pattern.split("."), key.split(".")
    for i, token in enumerate(want):
        if token == ">":
            return len(have) > i
        if i >= len(have) or (token != "*" and token != have[i]):
            return False
    return len(have) == len(want)


@dataclass
class FakeRows:
    """The auth bucket's issuance port (stores.issuance.RowStore), in memory: live values only.
    ``read`` lists every key whose value was handed out, by ``get`` or ``entries``."""

    log: Log
    rows: dict[str, tuple[bytes, int]] = field(default_factory=dict)
    seq: int = 0
    fail: Exception | None = None
    marker_ttls: list[int] = field(default_factory=list)
    read: list[str] = field(default_factory=list)

    def put(self, key: str, value: bytes) -> None:
        self.seq += 1
        self.rows[key] = (value, self.seq)

    async def create(self, key: str, value: bytes, *, ttl_s: int) -> int:
        await trio.lowlevel.checkpoint()
        if key in self.rows:
            raise KeyExists(key)
        self.put(key, value)
        return self.seq

    async def get(self, key: str) -> KvEntry | None:
        await trio.lowlevel.checkpoint()
        self.read.append(key)
        found = self.rows.get(key)
        return None if found is None else KvEntry(key=key, value=found[0], revision=found[1])

    async def entries(self, pattern: str) -> list[KvEntry]:
        await trio.lowlevel.checkpoint()
        if self.fail is not None:
            raise self.fail
        keys = sorted(key for key in self.rows if _matches(pattern, key))
        self.read.extend(keys)
        return [KvEntry(key=key, value=self.rows[key][0], revision=self.rows[key][1]) for key in keys]

    async def delete(self, key: str, *, last_revision: int, ttl_s: int) -> int:
        await trio.lowlevel.checkpoint()
        if self.fail is not None:
            raise self.fail
        if key not in self.rows or self.rows[key][1] != last_revision:
            raise WrongRevision(key)
        self.log.note("delete", key)
        self.marker_ttls.append(ttl_s)
        del self.rows[key]
        self.seq += 1
        return self.seq

    async def keys(self, prefix: str) -> list[str]:
        await trio.lowlevel.checkpoint()
        return sorted(key for key in self.rows if key.startswith(prefix))
