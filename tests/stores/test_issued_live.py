"""The issued-authority stores (stores/issued.py) on a real nats-server: exact shapes, drift
refused with the remedy, issue/resolve, append-only evidence, the horizon (refused without a
store read, rows gone after their TTL), renew, retire, write-once accepted rows, recreate."""

from __future__ import annotations

import json
import math
import time
from collections.abc import AsyncIterator, Mapping

import pytest
import trio

from cotal_trio.core.errors import ConfigError, RefusalCode, Refused
from cotal_trio.core.issued import (
    Ceiling,
    Evidence,
    IssuedRef,
    Source,
    accepted_key,
    attempt_key,
    bysource_key,
    ceiling_from_native,
    evidence_key,
    parse_attempt,
    render_evidence,
)
from cotal_trio.stores.issued import (
    IssuedStores,
    IssuedStoresMissing,
    issued_shapes,
    recreate_issued_stores,
)
from cotal_trio.natsio import Connection, Message, first_message, last_message, open_connection, open_loop, stream_config

CEILING_S = 20
SPACE = "alpha"
OWNER = "u_" + "a" * 26
UID = "b" * 26
SOURCE = Source(space=SPACE, bucket="cotal_auth_alpha", key=f"cred.{OWNER}.cli")
NARROW = ceiling_from_native({"pub": {"allow": ["cotal.alpha.ch.team.>", "cotal.alpha.ep.v1.x"]}, "sub": {"allow": ["_INBOX_x.>"]}})
ISSUED, ACCEPTED = "KV_cotal_issued_alpha", "KV_cotal_accepted_alpha"
REMEDY = (
    "stop the space's auth service, its callout replicas and managers, then run"
    " `cotal up --space alpha --recreate-issued-stores <backup-dir>`"
)


class CountingConnection:
    """A real connection that counts the requests made through it (every store read is one)."""

    def __init__(self, conn: Connection) -> None:
        self._conn = conn
        self.requests: list[str] = []
        self.round_trips = 0  # a request_many batch is one

    async def request(self, subject: str, payload: bytes, headers: Mapping[str, str] | None = None) -> Message:
        return (await self.request_many(((subject, payload, headers),)))[0]  # type: ignore[return-value]

    async def request_many(self, requests):  # type: ignore[no-untyped-def]
        self.requests.extend(subject for subject, _, _ in requests)
        self.round_trips += 1
        answers = await self._conn.request_many(requests)
        if len(requests) == 1 and isinstance(answers[0], Exception):
            raise answers[0]
        return answers


class NoStore:
    """A store double that fails the test on any request."""

    async def request(self, subject: str, payload: bytes, headers: Mapping[str, str] | None = None) -> Message:
        raise AssertionError(f"the store was asked {subject}")

    async def request_many(self, requests):  # type: ignore[no-untyped-def]
        raise AssertionError(f"the store was asked {[subject for subject, _, _ in requests]}")


@pytest.fixture
async def conn(plain_broker: str) -> AsyncIterator[Connection]:
    async with open_loop(), open_connection(plain_broker, name="issued") as connection:
        yield connection


@pytest.fixture
async def stores(conn: Connection) -> IssuedStores:
    with trio.fail_after(CEILING_S):
        store = IssuedStores(conn, SPACE)
        await store.ensure()
    return store


def _evidence(stores: IssuedStores, *, horizon: int, ceiling: Ceiling = NARROW, sources=(SOURCE,)) -> Evidence:
    ref = stores.new_ref(owner=OWNER, actor="cli", uid=UID, horizon=horizon)
    return Evidence(ref=ref, sources=tuple(sources), permissions=ceiling)


def _subject(bucket: str, key: str) -> str:
    return f"$KV.{bucket}.{key}"


async def test_both_stores_are_created_with_exactly_the_flags(stores: IssuedStores, conn: Connection) -> None:
    with trio.fail_after(CEILING_S):
        await stores.ensure()  # idempotent
        await stores.check()
        issued, accepted = await stream_config(conn, ISSUED), await stream_config(conn, ACCEPTED)
    common = {
        "storage": "file", "retention": "limits", "discard": "new", "max_age": 0, "max_msgs": -1, "max_bytes": -1,
        "max_msg_size": -1, "allow_rollup_hdrs": False, "deny_delete": True, "deny_purge": True, "allow_msg_ttl": True,
        "num_replicas": 1, "sealed": False,
    }  # fmt: skip
    for config, extra in (
        (issued, {"subjects": ["$KV.cotal_issued_alpha.>"], "allow_direct": False, "max_msgs_per_subject": -1}),
        (accepted, {"subjects": ["$KV.cotal_accepted_alpha.>"], "allow_direct": True, "max_msgs_per_subject": 1,
                    "discard_new_per_subject": True}),
    ):  # fmt: skip
        want = {**common, **extra}
        assert {field: config.get(field) for field in want} == want
    assert issued.get("discard_new_per_subject", False) is False


async def test_a_drifted_store_is_refused_with_the_remedy(conn: Connection) -> None:
    issued_shape, _ = issued_shapes(SPACE)
    drifted = {**issued_shape.config(), "deny_delete": False}
    with trio.fail_after(CEILING_S):
        store = IssuedStores(conn, SPACE)
        with pytest.raises(IssuedStoresMissing, match="has no store KV_cotal_issued_alpha"):
            await store.check()
        evidence = _evidence(store, horizon=int(time.time()) + 60)
        with pytest.raises(IssuedStoresMissing, match="start the space's full auth service once"):
            await store.resolve(evidence.ref, now=time.time())
        with pytest.raises(IssuedStoresMissing):
            await store.issue(evidence, now=time.time())
        await conn.request(f"$JS.API.STREAM.CREATE.{ISSUED}", json.dumps(drifted).encode())
        with pytest.raises(ConfigError) as ensured:
            await store.ensure()
        with pytest.raises(ConfigError) as checked:
            await store.check()
        left = await stream_config(conn, ISSUED)
    sentence = (
        "space alpha's store KV_cotal_issued_alpha has another shape than issued authority needs"
        f" (deny_delete is false, not true) and is refused - {REMEDY}"
    )
    assert str(ensured.value) == str(checked.value) == sentence
    assert left["deny_delete"] is False  # never silently adopted or changed


async def test_issue_then_resolve_and_every_row_has_the_ttl(stores: IssuedStores, conn: Connection) -> None:
    now = time.time()
    horizon = int(now) + 3600
    evidence = _evidence(stores, horizon=horizon)
    with trio.fail_after(CEILING_S):
        ref = await stores.issue(evidence, now=now)
        resolved = await stores.resolve(ref, now=now)
        rows = [
            await first_message(conn, ISSUED, _subject("cotal_issued_alpha", key))
            for key in (evidence_key(ref), attempt_key(ref), bysource_key(SOURCE, ref))
        ]
        active = await last_message(conn, ISSUED, _subject("cotal_issued_alpha", attempt_key(ref)))
    assert ref == evidence.ref and ref.horizon == horizon
    assert resolved.evidence == evidence and resolved.attempt_revision == active.seq
    assert parse_attempt(rows[1].data).state == "prepared" and parse_attempt(active.data).state == "active"
    ttl = math.ceil(horizon + 60 - now)
    assert [int(row.headers["Nats-TTL"]) for row in (*rows, active)] == [ttl] * 4


async def test_evidence_is_append_only_and_read_as_the_first_message(stores: IssuedStores, conn: Connection) -> None:
    now = time.time()
    evidence = _evidence(stores, horizon=int(now) + 3600)
    subject = _subject("cotal_issued_alpha", evidence_key(evidence.ref))
    wide = Evidence(ref=evidence.ref, sources=(SOURCE,), permissions=ceiling_from_native({}))
    with trio.fail_after(CEILING_S):
        ref = await stores.issue(evidence, now=now)
        first = await first_message(conn, ISSUED, subject)
        deleted = await conn.request(f"$JS.API.STREAM.MSG.DELETE.{ISSUED}", json.dumps({"seq": first.seq}).encode())
        purged = await conn.request(f"$JS.API.STREAM.PURGE.{ISSUED}", json.dumps({"filter": subject}).encode())
        # A later write on the key (here: no expected-sequence header) lands, and changes nothing.
        later = json.loads((await conn.request(subject, render_evidence(wide))).data)
        resolved = await stores.resolve(ref, now=now)
        with pytest.raises(Refused) as again:
            await stores.stage(evidence, now=now)
    assert json.loads(deleted.data)["error"]["err_code"] == 10057
    assert json.loads(purged.data)["error"]["err_code"] == 10110
    assert later["seq"] > first.seq
    assert resolved.evidence == evidence and resolved.evidence.permissions == NARROW
    assert again.value.code is RefusalCode.CONFLICT


async def test_a_3_s_horizon(conn: Connection) -> None:
    """Refused without a store read at horizon + 1 s; rows gone after their TTL; a second
    create on a live key fails. The rows outlive the horizon by 1 s here (grace_s=1) instead of
    60, so the TTL ends within the test."""
    counting = CountingConnection(conn)
    stores = IssuedStores(counting, SPACE, grace_s=1)  # type: ignore[arg-type]
    with trio.fail_after(CEILING_S):
        await stores.ensure()
        now = time.time()
        horizon = math.ceil(now) + 3
        evidence = _evidence(stores, horizon=horizon)
        ref = await stores.issue(evidence, now=now)
        with pytest.raises(Refused) as second:
            await stores.stage(evidence, now=time.time())
        assert second.value.code is RefusalCode.CONFLICT
        await stores.accept("c" * 32, ref, now=time.time())
        assert (await stores.resolve(ref, now=time.time())).evidence == evidence
        await trio.sleep_until(trio.current_time() + (horizon + 1 - time.time()))
        made = len(counting.requests)
        for call in (
            stores.resolve(ref, now=time.time()),
            stores.retire(ref, now=time.time()),
            stores.renew(ref, NARROW, now=time.time()),
            stores.accept("d" * 32, ref, now=time.time()),
            stores.stage(evidence, now=time.time()),
            IssuedStores(NoStore(), SPACE).resolve(ref, now=time.time()),  # type: ignore[arg-type]
        ):
            with pytest.raises(Refused, match="reached its horizon") as refused:
                await call
            assert refused.value.code is RefusalCode.NOT_GRANTED
        assert counting.requests[made:] == []  # no store read, no write
        subjects = [
            (ISSUED, _subject("cotal_issued_alpha", evidence_key(ref))),
            (ISSUED, _subject("cotal_issued_alpha", attempt_key(ref))),
            (ISSUED, _subject("cotal_issued_alpha", bysource_key(SOURCE, ref))),
            (ACCEPTED, _subject("cotal_accepted_alpha", accepted_key("c" * 32))),
        ]
        for stream, subject in subjects:  # bounded by fail_after: TTL horizon + 1 - now, then the scan
            while await first_message(conn, stream, subject) is not None:
                await trio.sleep(0.25)
    assert time.time() >= horizon + 1


async def test_renew_keeps_the_generation_only_for_a_byte_identical_ceiling(stores: IssuedStores, conn: Connection) -> None:
    now = time.time()
    horizon = int(now) + 3600
    reordered = ceiling_from_native({"pub": {"allow": ["cotal.alpha.ep.v1.x", "cotal.alpha.ch.team.>", "cotal.alpha.ep.v1.x"]}, "sub": {"allow": ["_INBOX_x.>"]}})
    wider = ceiling_from_native({"pub": {"allow": ["cotal.alpha.ch.>"]}, "sub": {"allow": ["_INBOX_x.>"]}})
    with trio.fail_after(CEILING_S):
        ref = await stores.issue(_evidence(stores, horizon=horizon), now=now)
        before = await _messages(conn, ISSUED)
        same = await stores.renew(ref, reordered, now=now)
        after_same = await _messages(conn, ISSUED)
        fresh = await stores.renew(ref, wider, now=now)
        moved = await stores.renew(ref, NARROW, now=now, horizon=horizon - 60)
        with pytest.raises(Refused, match="renewals stop at the horizon"):  # spec: no rotation past it
            await stores.renew(ref, NARROW, now=now, horizon=horizon + 60)
        old, new = await stores.resolve(ref, now=now), await stores.resolve(fresh.ref, now=now)
    assert same.kept and same.ref == ref and after_same == before  # nothing written
    assert not fresh.kept and fresh.ref.generation != ref.generation and fresh.ref.horizon == horizon
    assert (fresh.ref.owner, fresh.ref.actor, fresh.ref.uid) == (ref.owner, ref.actor, ref.uid)
    assert new.evidence.permissions == wider and new.evidence.sources == (SOURCE,)
    assert old.evidence.permissions == NARROW  # the old generation stays until its horizon
    assert not moved.kept and moved.ref.horizon == horizon - 60  # an earlier horizon is a new generation


async def _messages(conn: Connection, stream: str) -> int:
    info = json.loads((await conn.request(f"$JS.API.STREAM.INFO.{stream}", b"")).data)
    return info["state"]["messages"]


async def test_accepted_rows_are_write_once(stores: IssuedStores, conn: Connection) -> None:
    now = time.time()
    with trio.fail_after(CEILING_S):
        ref = await stores.issue(_evidence(stores, horizon=int(now) + 3600), now=now)
        other = await stores.issue(_evidence(stores, horizon=int(now) + 3600), now=now)
        assert await stores.accepted_ref("e" * 32, now=now) is None
        await stores.accept("e" * 32, ref, now=now)
        with pytest.raises(Refused) as again:
            await stores.accept("e" * 32, other, now=now)
        raw = await conn.request(_subject("cotal_accepted_alpha", accepted_key("e" * 32)), b"{}")
        read = await stores.accepted_ref("e" * 32, now=now)
    assert again.value.code is RefusalCode.CONFLICT
    assert json.loads(raw.data)["error"]["err_code"] == 10077  # the broker itself refuses a second message
    assert read == ref


async def test_retire_and_retire_by_source(stores: IssuedStores) -> None:
    now = time.time()
    horizon = int(now) + 3600
    other_source = Source(space=SPACE, bucket="cotal_auth_alpha", key=f"cred.{OWNER}.bot")
    with trio.fail_after(CEILING_S):
        one = await stores.issue(_evidence(stores, horizon=horizon), now=now)
        two = await stores.issue(_evidence(stores, horizon=horizon), now=now)
        apart = await stores.issue(_evidence(stores, horizon=horizon, sources=(other_source,)), now=now)
        assert sorted(await stores.by_source(SOURCE, now=now), key=str) == sorted([one, two], key=str)
        assert await stores.by_source(SOURCE, now=horizon) == []  # past the horizon: not even listed
        assert await stores.retire(one, now=now) is True
        assert await stores.retire(one, now=now) is False
        assert await stores.retire_source(SOURCE, now=now) == 1  # two; one was retired already
        for ref in (one, two):
            with pytest.raises(Refused, match="is revoked, not active"):
                await stores.resolve(ref, now=now)
        assert (await stores.resolve(apart, now=now)).evidence.sources == (other_source,)


async def test_abort_a_failed_source_and_expiry(stores: IssuedStores) -> None:
    now = time.time()
    horizon = int(now) + 3600
    with trio.fail_after(CEILING_S):
        staged = await stores.stage(_evidence(stores, horizon=horizon), now=now)
        with pytest.raises(Refused, match="is prepared, not active"):
            await stores.resolve(staged.ref, now=now)
        await stores.abort(staged, now=now)
        with pytest.raises(Refused) as late:
            await stores.activate(staged, now=now)
        with pytest.raises(Refused, match="is aborted, not active"):
            await stores.resolve(staged.ref, now=now)
        live = await stores.issue(_evidence(stores, horizon=horizon), now=now)

        async def gone(source: Source) -> bool:
            return False

        with pytest.raises(Refused, match=f"depends on cotal_auth_alpha cred.{OWNER}.cli, which is no longer live"):
            await stores.resolve(live, now=now, source_live=gone)
        bare_ref = stores.new_ref(owner=OWNER, actor="cli", uid=UID, horizon=horizon)
        bare = Evidence(ref=bare_ref, sources=(), permissions=NARROW, expires_at=int(now) + 10)
        expiring = await stores.issue(bare, now=now)
        assert (await stores.resolve(expiring, now=now)).evidence.expires_at == int(now) + 10
        with pytest.raises(Refused, match="expired at unix"):
            await stores.resolve(expiring, now=now + 10)
        with pytest.raises(Refused, match="has no evidence"):
            await stores.resolve(stores.new_ref(owner=OWNER, actor="cli", uid=UID, horizon=horizon), now=now)
    assert late.value.code is RefusalCode.CONFLICT


async def test_a_reference_of_another_space_is_a_bug(stores: IssuedStores) -> None:
    ref = IssuedRef(space="beta", owner=OWNER, actor="cli", uid=UID, generation=stores.new_ref(owner=OWNER, actor="cli", uid=UID, horizon=2**31).generation)
    with pytest.raises(ValueError, match="space beta"):
        await stores.resolve(ref, now=time.time())


async def test_recreate_backs_up_deletes_and_creates_again(conn: Connection, tmp_path) -> None:
    issued_shape, _ = issued_shapes(SPACE)
    folder = tmp_path / "backup"
    with trio.fail_after(CEILING_S):
        await conn.request(f"$JS.API.STREAM.CREATE.{ISSUED}", json.dumps({**issued_shape.config(), "allow_msg_ttl": False}).encode())
        await conn.request("$KV.cotal_issued_alpha.v1.old", b"old row")
        with pytest.raises(ConfigError, match="allow_msg_ttl is false, not true"):
            await IssuedStores(conn, SPACE).ensure()
        (tmp_path / "full").mkdir()
        (tmp_path / "full" / "x").write_text("")
        with pytest.raises(ConfigError, match="is not an empty folder"):
            await recreate_issued_stores(conn, SPACE, tmp_path / "full")
        counts = await recreate_issued_stores(conn, SPACE, folder)
        await IssuedStores(conn, SPACE).check()
    assert counts == {ISSUED: 1}  # the accepted store did not exist
    assert sorted(p.name for p in folder.iterdir()) == [f"{ISSUED}.config.json", f"{ISSUED}.jsonl"]
    line = json.loads((folder / f"{ISSUED}.jsonl").read_text())
    assert (line["subject"], line["data"]) == ("$KV.cotal_issued_alpha.v1.old", "b2xkIHJvdw==")
