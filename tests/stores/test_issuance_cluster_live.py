"""An issuance row written while its stream has no leader, on a real 3-node cluster (issue 17).

The failed connects of a SIGKILLed node are the auth bucket's Raft election: a create sent while
``KV_cotal_auth_<space>`` has no leader is answered "no responders" (natsio's
``StoreUnreachable``), and the callout used to deny at once. :meth:`Issuance.write` now sends it
again until ``retry_until``, so a connect that arrives late in an election is minted once the new
leader answers.

The stretch without a leader is made deterministic, not timed: the bucket (R3) is led by n1, and
n1 and n2 are SIGKILLed, so n3 alone cannot elect (no quorum) for as long as the test wants. The
write starts through n3, is refused at least once (seen through a recording :class:`RowStore`),
then n1 and n2 are restarted; the write returns, and the row is in the bucket with our bytes.
A write with no ``retry_until`` fails at the first refusal, as before. Only the nats-servers the
test starts are stopped, by pid.
"""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass, field

import pytest
import trio

from cotal_trio.core.errors import Unavailable
from cotal_trio.core.issuance import IssuanceRow, issuance_key, render_row, write_failed_reason
from cotal_trio.core.plane import plane_bucket
from cotal_trio.core.nkeys import Prefix
from cotal_trio.natsio import JetStreamError, KvEntry, StoreUnreachable, ensure_bucket, js_api, kv_get, open_loop
from cotal_trio.stores.issuance import Issuance, IssuanceFailed, KvRowStore
from cotal_trio.stores.replicas import read_store_replicas
from tests.support.callout_requests import NOW, OWNER, UID, _key
from tests.support.cli_root import cotal
from tests.support.cluster import js_admin, start_root_cluster

pytestmark = pytest.mark.broker

SPACE = "alpha"
CEILING_S = 180  # the whole test, on a loaded 2-core machine
USER = _key(Prefix.USER, 61).public_key
BUCKET = plane_bucket(SPACE)
STREAM = f"KV_{BUCKET}"


@dataclass
class Recording:
    """A :class:`RowStore` over the live bucket that records each create's outcome (the test's
    window into the retries; every call goes to the real store)."""

    store: KvRowStore
    creates: list[str] = field(default_factory=list)

    async def create(self, key: str, value: bytes, *, ttl_s: int) -> int:
        try:
            revision = await self.store.create(key, value, ttl_s=ttl_s)
        except StoreUnreachable:
            self.creates.append("unreachable")
            raise
        self.creates.append("stored")
        return revision

    async def get(self, key: str) -> KvEntry | None:
        return await self.store.get(key)

    async def delete(self, key: str, *, last_revision: int, ttl_s: int) -> int:
        return await self.store.delete(key, last_revision=last_revision, ttl_s=ttl_s)

    async def keys(self, prefix: str) -> list[str]:
        return await self.store.keys(prefix)

    async def entries(self, pattern: str) -> list[KvEntry]:
        return await self.store.entries(pattern)


def _row(actor: str) -> IssuanceRow:
    return IssuanceRow(
        space=SPACE, owner=OWNER, actor=actor, lifecycle_uid=UID, credential_id=None, view=None,
        iat=NOW, exp=NOW + 10**8,
    )  # fmt: skip


async def leader_seen(conn) -> bool:
    """Whether the node ``conn`` is on names a leader for the bucket's stream (no answer: none)."""
    with trio.move_on_after(1):
        try:
            info = await js_api(conn, f"$JS.API.STREAM.INFO.{STREAM}")
        except (JetStreamError, Unavailable):
            return False
        return bool((info.get("cluster") or {}).get("leader"))
    return False


async def until_logged(log, text: str, after: int = 0) -> None:
    while text not in log.read_text()[after:]:
        await trio.sleep(0.2)  # bounded by the caller's CEILING_S


async def test_a_row_refused_for_want_of_a_leader_is_written_once_a_leader_is_elected(nursery, tmp_path, capsys):
    with trio.fail_after(CEILING_S):
        cluster = await start_root_cluster(nursery, tmp_path, capsys, SPACE)
        for log in cluster.logs.values():
            await until_logged(log, "metadata leader")
        code, out, err = await cotal(
            capsys, "space", "add", SPACE, "--root", str(cluster.paths.root), "--server", cluster.urls["n1"], "--replicas", "3"
        )
        assert code == 0 and "accounts pushed" in out, err
        async with open_loop(), js_admin(cluster.paths, SPACE, cluster.urls["n3"]) as conn:
            while True:  # JetStream answers once the nodes have met
                try:
                    await ensure_bucket(conn, BUCKET, replicas=3)
                    break
                except (JetStreamError, Unavailable):
                    await trio.sleep(0.5)
            while (leaders := {s.stream: s.leader for s in await read_store_replicas(conn, SPACE)}).get(STREAM) != "n1":
                try:
                    await js_api(conn, f"$JS.API.STREAM.LEADER.STEPDOWN.{STREAM}", {"placement": {"preferred": "n1"}})
                except (JetStreamError, Unavailable):
                    pass  # mid-election: ask again
                await trio.sleep(0.5)
            assert leaders[STREAM] == "n1"
            sizes = {name: cluster.logs[name].stat().st_size for name in ("n1", "n2")}
            for name in ("n1", "n2"):  # n3 alone has no quorum: no leader until they return
                os.kill(cluster.pids[name], signal.SIGKILL)
            while await leader_seen(conn):  # until n3 has seen the routes go
                await trio.sleep(0.1)

            # Without retry_until: the first refusal is the answer, as before.
            once = Recording(KvRowStore(conn, BUCKET))
            with pytest.raises(IssuanceFailed) as failed:
                await Issuance(once, SPACE).write(USER, _row("once"), now=NOW)
            assert once.creates == ["unreachable"]
            assert str(failed.value).startswith(write_failed_reason(SPACE, "")[:40])

            store = Recording(KvRowStore(conn, BUCKET))
            issuance = Issuance(store, SPACE)
            written = trio.Event()

            async def write() -> None:
                await issuance.write(USER, _row("cli"), now=NOW, retry_until=trio.current_time() + CEILING_S)
                written.set()

            nursery.start_soon(write)
            while store.creates.count("unreachable") < 2:  # refused, and sent again
                await trio.sleep(0.1)
            assert not written.is_set()
            for name in ("n1", "n2"):
                await cluster.start(nursery, name)
            for name in ("n1", "n2"):
                await until_logged(cluster.logs[name], "metadata leader", after=sizes[name])
            await written.wait()
            issuance.keep()
            assert store.creates[-1] == "stored" and set(store.creates[:-1]) == {"unreachable"}
            entry = await kv_get(conn, BUCKET, issuance_key(OWNER, "cli", USER))
            assert entry is not None and entry.value == render_row(_row("cli"))
