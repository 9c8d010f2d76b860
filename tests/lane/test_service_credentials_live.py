"""Issue 15 items 3 and 4 on a real nats-server: a replica refuses a drifted issued store, and the
service's own credentials hold only what they use.

* Spec credential-authority "Issued authority": a drifted ``KV_cotal_issued_<S>`` or
  ``KV_cotal_accepted_<S>`` "is refused by every service that binds them, with the remedy in the
  error" - a callout replica as the full lane, before it subscribes, so it issues nothing.
* Spec "Profiles" (issuer row) and "Callout replicas" ("it holds its own issuer session"): the
  issuance a callout makes rides an ``issuer`` session minted for five minutes and replaced before
  it expires; the store user holds no ``$JS.API.>``, so it cannot purge, delete or direct-read the
  stores it does not use (docs/wire-layout.md "The service's own users").

What a lane's connections hold is read from the broker itself: the system account's ``CONNZ``
(``auth: true``) reports each connection's user JWT. A twin user with exactly those permissions,
minted by the test, then tries what the lane's user must not do, and the broker's permission
violation is what the test reads.
"""

from __future__ import annotations

import base64
import dataclasses
import functools
import json
import logging
import os
import signal
import time
import typing
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import trio

from cotal_trio.broker import provision
from cotal_trio.broker.accounts import open_system_connection
from cotal_trio.broker.provision import mint_service_user
from cotal_trio.core.admission import CalloutLimits
from cotal_trio.core.errors import ConfigError, Unavailable
from cotal_trio.core.nkeys import KeyPair, Prefix
from cotal_trio.core.profiles import issuer_permissions
from cotal_trio.service.host import HostConfig, run_host
from cotal_trio.service.hosting import ReplicaLanes, ServiceConfig, lane_factory, run_service
from cotal_trio.stores.issued import IssuedStores, IssuedStoresMissing, issued_shapes, recreate_issued_stores
from cotal_trio.core.plane import Lease
from cotal_trio.stores.records import RecordsStore
from cotal_trio.lane.service_users import (
    STORE_LIFETIME_S, IssuerSession, RenewedUser, open_service_user, recreate_permissions, store_permissions,
)
from cotal_trio.lane.run import run_lane
from cotal_trio.lane.spec import FullLane, LaneCommon, ReplicaLane
from cotal_trio.natsio import Connection, open_connection, open_loop
from cotal_trio.state import atomic_write, load_space
from tests.support.service import AUTH_TIMEOUT_S, Mesh, start_mesh, until
from tests.support.issuance import _bearer

pytestmark = [pytest.mark.broker, pytest.mark.filterwarnings("error::ResourceWarning")]

SPACE = "a"
CEILING_S = 40
ISSUED, ACCEPTED = (shape.name for shape in issued_shapes(SPACE))
REMEDY = f"`cotal up --space {SPACE} --recreate-issued-stores <backup-dir>`"


def _lane(mesh: Mesh, *, callout_only: bool, lease: Lease | None = None, **common) -> functools.partial:
    """A full lane or (``callout_only``) a replica of SPACE; ``common``: more LaneCommon fields."""
    shared = LaneCommon(
        server_url=mesh.server_url, limits=CalloutLimits(auth_timeout_s=AUTH_TIMEOUT_S), reconnect=False, **common,
    )
    paths = mesh.paths.space(SPACE)
    if callout_only:
        return functools.partial(run_lane, ReplicaLane(space=SPACE, paths=paths, common=shared))
    full = {} if lease is None else {"lease": lease}
    return functools.partial(run_lane, FullLane(space=SPACE, paths=paths, common=shared, idp_keys=dict, http_port=0, **full))


@asynccontextmanager
async def _admin(mesh: Mesh) -> AsyncIterator[Connection]:
    """The test's own data-account user with the whole JetStream API (it stands for an operator)."""
    material = load_space(mesh.paths.space(SPACE).callout_json, SPACE)
    now = int(time.time())
    creds = mint_service_user(
        material, name="test:admin", permissions={"pub": {"allow": ["$JS.API.>", "$KV.>"]}, "sub": {"allow": ["_INBOX.>"]}},
        iat=now, exp=now + 120,
    )
    async with open_loop(), open_connection(mesh.server_url, creds=creds, name="test:admin", reconnect=False) as conn:
        yield conn


async def _api(conn: Connection, subject: str, body: dict | None = None) -> dict:
    return json.loads((await conn.request(subject, json.dumps(body or {}).encode())).data)


def _claims(jwt: str) -> dict:
    payload = jwt.split(".")[1]
    return json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))


async def _users(mesh: Mesh) -> list[dict]:
    """The claims of every user connected to the broker now (system ``CONNZ``, ``auth: true``)."""
    material = provision.ensure_root(mesh.paths, iat=int(time.time()))
    async with open_loop(), open_system_connection(mesh.server_url, material) as system:
        reply = await system.request("$SYS.REQ.SERVER.PING.CONNZ", json.dumps({"limit": 4096, "auth": True}).encode())
    connections = json.loads(reply.data)["data"]["connections"]
    return [_claims(c["jwt"]) for c in connections if c.get("jwt")]


async def _users_of_both_lanes(nursery: trio.Nursery, tmp_path: Path, nats_server_bin: str) -> list[dict]:
    """:func:`_users` while a full lane and a callout replica of SPACE serve on a fresh mesh (both
    stopped before it returns), under ``CEILING_S``."""
    mesh, _ = await start_mesh(nursery, tmp_path, nats_server_bin)
    with trio.fail_after(CEILING_S):
        async with trio.open_nursery() as lanes:
            await lanes.start(_lane(mesh, callout_only=False))
            await lanes.start(_lane(mesh, callout_only=True))
            users = await _users(mesh)
            lanes.cancel_scope.cancel()
    return users


def _named(users: list[dict], name: str) -> list[dict]:
    return [claims for claims in users if claims.get("name") == name]


@asynccontextmanager
async def _twin(mesh: Mesh, claims: dict) -> AsyncIterator[Connection]:
    """A user of the test's with exactly the permissions of ``claims``, on the inbox they allow."""
    permissions = {"pub": claims["nats"]["pub"], "sub": claims["nats"]["sub"]}
    inboxes = [s for s in permissions["sub"]["allow"] if s.startswith("_INBOX")]
    prefix = inboxes[0].removesuffix(".>") if inboxes else "_INBOX"
    material = load_space(mesh.paths.space(SPACE).callout_json, SPACE)
    now = int(time.time())
    creds = mint_service_user(material, name="test:twin", permissions=permissions, iat=now, exp=now + 120)
    async with open_loop(), open_connection(
        mesh.server_url, creds=creds, name="test:twin", inbox_prefix=prefix, reconnect=False
    ) as conn:
        yield conn


async def _refused(conn: Connection, subject: str) -> str:
    """Publish a request on ``subject``; the broker's error for it (it must refuse, within 5 s)."""
    errors = conn.error_count
    with trio.move_on_after(5):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(conn.request, subject, b"{}")
            error = await conn.wait_error(after=errors)
            nursery.cancel_scope.cancel()
        return error
    pytest.fail(f"the broker let {subject} through (no permission violation)")


def _leaves(error: BaseException) -> list[BaseException]:
    if isinstance(error, BaseExceptionGroup):
        return [leaf for inner in error.exceptions for leaf in _leaves(inner)]
    return [error]


# -- item 3: a replica refuses a drifted issued store -------------------------------------------

DRIFTS = {
    "issued max_age": (ISSUED, {"max_age": 3600 * 10**9}, "max_age is 3600000000000, not 0"),
    "issued discard": (ISSUED, {"discard": "old"}, 'discard is "old", not "new"'),
    "issued republish": (ISSUED, {"republish": {"src": ">", "dest": "leak.>"}}, "republish is set"),
    "accepted discard": (ACCEPTED, {"discard_new_per_subject": False}, "discard_new_per_subject is false, not true"),
}


CONNECTS = 3


async def _connects(mesh: Mesh, attempts: list[str]) -> None:
    """``CONNECTS`` user-mode connects of alice's, one after another: each ``admitted`` or
    ``refused`` (the broker's authorization violation once no callout answers)."""
    bearer = _bearer(mesh, SPACE, "alice")
    for _ in range(CONNECTS):
        try:
            await mesh.admitted(SPACE, bearer)
            attempts.append("admitted")
        except* Unavailable:
            attempts.append("refused")


@pytest.mark.parametrize("drift", DRIFTS.values(), ids=DRIFTS.keys())
async def test_a_replica_refuses_a_drifted_issued_store_with_the_remedy(
    nursery: trio.Nursery, tmp_path: Path, nats_server_bin: str, drift: tuple[str, dict, str]
) -> None:
    stream, change, difference = drift
    mesh, _ = await start_mesh(nursery, tmp_path, nats_server_bin)
    with trio.fail_after(CEILING_S):
        async with trio.open_nursery() as lanes:  # the full lane creates both stores in their shape
            await lanes.start(_lane(mesh, callout_only=False))
            lanes.cancel_scope.cancel()
        async with _admin(mesh) as admin:
            config = (await _api(admin, f"$JS.API.STREAM.INFO.{stream}"))["config"]
            updated = await _api(admin, f"$JS.API.STREAM.UPDATE.{stream}", {**config, **change})
            assert "error" not in updated, updated
            # connects come while the replica starts and after it refused: none is admitted
            attempts: list[str] = []
            async with trio.open_nursery() as clients:
                clients.start_soon(_connects, mesh, attempts)
                with pytest.RaisesGroup(pytest.RaisesExc(ConfigError), flatten_subgroups=True) as refused:
                    async with trio.open_nursery() as lanes:
                        await lanes.start(_lane(mesh, callout_only=True))
                        pytest.fail("a callout replica started on a drifted issued store")
            counts = [(await _api(admin, f"$JS.API.STREAM.INFO.{name}"))["state"]["messages"] for name in (ISSUED, ACCEPTED)]
            after = (await _api(admin, f"$JS.API.STREAM.INFO.{stream}"))["config"]
        users = await _users(mesh)
    (error,) = [e for e in _leaves(refused.value) if isinstance(e, ConfigError)]
    assert str(error) == (
        f"space {SPACE}'s store {stream} has another shape than issued authority needs ({difference}) and is"
        f" refused - stop the space's auth service, its callout replicas and managers, then run {REMEDY}"
    )
    assert attempts == ["refused"] * CONNECTS  # no connect admitted ...
    assert counts == [0, 0]  # ... and none issued a row
    assert {k: after.get(k, False) for k in change} == change  # the store is left as it is, never adopted
    assert not _named(users, f"cotal:auth-store:{SPACE}")  # the refused replica left nothing connected


# -- item 4: each connection holds only what it uses --------------------------------------------

FORBIDDEN = (
    *(f"$JS.API.STREAM.{verb}.{stream}" for stream in (ISSUED, ACCEPTED) for verb in ("PURGE", "DELETE")),
    f"$JS.API.STREAM.DELETE.KV_cotal_records_{SPACE}", f"$JS.API.STREAM.PURGE.KV_cotal_auth_{SPACE}",
    f"$JS.API.STREAM.DELETE.COTAL_DM_{SPACE}", f"$JS.API.STREAM.MSG.DELETE.KV_cotal_records_{SPACE}",
    f"$JS.API.DIRECT.GET.{ACCEPTED}", f"$JS.API.DIRECT.GET.{ISSUED}", f"$JS.API.DIRECT.GET.KV_cotal_presence_{SPACE}",
    f"$JS.API.DIRECT.GET.KV_cotal_admission_{SPACE}", f"$JS.API.STREAM.MSG.GET.COTAL_DM_{SPACE}",
    f"$KV.cotal_issued_{SPACE}.ep.v1.rewritten", f"$KV.cotal_accepted_{SPACE}.accepted.v1.rewritten",
    f"$JS.API.CONSUMER.CREATE.COTAL_DM_{SPACE}.spy.cotal.{SPACE}.dm.>", "$JS.API.ACCOUNT.PURGE",
)  # fmt: skip


@pytest.mark.parametrize("callout_only", [False, True], ids=["full lane", "replica"])
async def test_the_store_user_is_refused_what_it_must_not_touch(
    nursery: trio.Nursery, tmp_path: Path, nats_server_bin: str, callout_only: bool
) -> None:
    mesh, _ = await start_mesh(nursery, tmp_path, nats_server_bin)
    with trio.fail_after(CEILING_S):
        if callout_only:  # the full lane runs once, so the stores exist; then only the replica runs
            async with trio.open_nursery() as lanes:
                await lanes.start(_lane(mesh, callout_only=False))
                lanes.cancel_scope.cancel()
        async with trio.open_nursery() as lanes:
            await lanes.start(_lane(mesh, callout_only=callout_only))
            (store,) = _named(await _users(mesh), f"cotal:auth-store:{SPACE}")
            async with _twin(mesh, store) as twin:
                refusals = {subject: await _refused(twin, subject) for subject in FORBIDDEN}
                # the twin is a working user: what the lane does use is answered
                info = await _api(twin, f"$JS.API.STREAM.INFO.{ISSUED}") if not callout_only else None
            lanes.cancel_scope.cancel()
        async with _admin(mesh) as admin:
            left = [(await _api(admin, f"$JS.API.STREAM.INFO.{name}")).get("error") for name in (ISSUED, ACCEPTED)]
    allowed = store["nats"]["pub"]["allow"]
    assert not [s for s in allowed if s in ("$JS.>", "$JS.API.>") or s.startswith("$JS.API.STREAM.PURGE")]
    assert store["nats"]["sub"]["allow"] != ["_INBOX.>"]  # its own reply inbox, not every reply in the account
    for subject, error in refusals.items():
        # nats-py lowercases the broker's -ERR line
        assert error == f'nats: permissions violation for publish to "{subject.lower()}"', subject
    assert info is None or info["config"]["name"] == ISSUED
    assert left == [None, None]  # both stores are still there


RECREATE_FORBIDDEN = (
    f"$JS.API.STREAM.PURGE.{ISSUED}", f"$JS.API.STREAM.MSG.DELETE.{ISSUED}", f"$JS.API.DIRECT.GET.{ACCEPTED}",
    f"$KV.cotal_issued_{SPACE}.ep.v1.rewritten", f"$JS.API.STREAM.DELETE.KV_cotal_records_{SPACE}",
    f"$JS.API.STREAM.INFO.KV_cotal_auth_{SPACE}", f"$JS.API.STREAM.CREATE.COTAL_DM_{SPACE}", "$JS.API.INFO",
)  # fmt: skip


async def test_the_recreate_user_backs_up_deletes_and_creates_the_issued_stores_and_nothing_else(
    nursery: trio.Nursery, tmp_path: Path, nats_server_bin: str
) -> None:
    """``--recreate-issued-stores``' one-off user (``recreate_permissions``, which ``cotal up`` and
    ``cotal auth recreate-issued-stores`` mint) holds no ``$JS.API.>``: exactly the info, message
    reads, delete and create of the two issued stores, which is all the step needs."""
    mesh, _ = await start_mesh(nursery, tmp_path, nats_server_bin)
    material = load_space(mesh.paths.space(SPACE).callout_json, SPACE)
    backup = tmp_path / "backup"
    with trio.fail_after(CEILING_S):
        async with trio.open_nursery() as lanes:  # the full lane creates both stores
            await lanes.start(_lane(mesh, callout_only=False))
            lanes.cancel_scope.cancel()
        async with _admin(mesh) as admin:
            await admin.request(f"$KV.cotal_issued_{SPACE}.v1.before", b"row")
        now = int(time.time())
        async with open_loop(), open_service_user(
            material, mesh.server_url, name="test:recreate", permissions=functools.partial(recreate_permissions, SPACE),
            iat=now, exp=now + 120, reconnect=False,
        ) as conn:  # fmt: skip
            counts = await recreate_issued_stores(conn, SPACE, backup)
            refusals = {subject: await _refused(conn, subject) for subject in RECREATE_FORBIDDEN}
            await IssuedStores(conn, SPACE).check()  # both are there again, in their shape
    allowed = recreate_permissions(SPACE, "0" * 24)["pub"]["allow"]
    assert not [s for s in allowed if ">" in s or "*" in s]
    assert counts == {ISSUED: 1, ACCEPTED: 0}
    assert sorted(p.name for p in backup.iterdir()) == sorted(
        f"{name}.{ext}" for name in (ISSUED, ACCEPTED) for ext in ("config.json", "jsonl")
    )
    for subject, error in refusals.items():
        assert error == f'nats: permissions violation for publish to "{subject.lower()}"', subject


async def test_the_callout_issues_over_an_issuer_session_of_five_minutes(
    nursery: trio.Nursery, tmp_path: Path, nats_server_bin: str
) -> None:
    users = await _users_of_both_lanes(nursery, tmp_path, nats_server_bin)
    sessions = _named(users, f"cotal:issuer:{SPACE}")
    assert len(sessions) == 2  # the full lane's and the replica's own
    for claims in sessions:
        assert claims["exp"] - claims["iat"] == 300
        (nonce,) = [s.removeprefix("_INBOX_").removesuffix(".>") for s in claims["nats"]["sub"]["allow"]]
        want = issuer_permissions(space=SPACE, inbox_nonce=nonce).to_nats()
        assert sorted(claims["nats"]["pub"]["allow"]) == sorted(want["pub"]["allow"])
        assert claims["nats"]["sub"] == want["sub"]


# Long enough that a renewal (a third of it before expiry) has seconds of overlap on a loaded machine.
LIFETIME_S = 6
RENEW_LIFETIME_S = 6


async def test_the_issuer_session_is_renewed_across_its_expiry_while_connects_keep_minting(
    nursery: trio.Nursery, tmp_path: Path, nats_server_bin: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="cotal.lane")
    mesh, _ = await start_mesh(nursery, tmp_path, nats_server_bin)
    bearer = _bearer(mesh, SPACE, "alice")
    seen: set[str] = set()  # issuer users (nkeys) seen connected
    listed: list[bool] = []  # per connect: did it get its listing generation (an issuance)?
    with trio.fail_after(CEILING_S):
        async with trio.open_nursery() as lanes:
            await lanes.start(_lane(mesh, callout_only=False, issuer_lifetime_s=LIFETIME_S))
            end = trio.current_time() + 2 * LIFETIME_S + 1  # renewals every 2/3 of a lifetime
            while trio.current_time() < end:
                sessions = _named(await _users(mesh), f"cotal:issuer:{SPACE}")
                assert sessions, "no issuer session connected"
                assert all(c["exp"] - c["iat"] == LIFETIME_S for c in sessions)
                seen |= {c["sub"] for c in sessions}
                async with mesh.client(SPACE, bearer) as conn:
                    allowed = json.loads((await conn.request("$SYS.REQ.USER.INFO", b"")).data)
                listed.append(any(".ep.v1." in s for s in allowed["data"]["permissions"]["publish"]["allow"]))
                await trio.sleep(0.3)
            lanes.cancel_scope.cancel()
    assert len(seen) >= 3  # the first session and at least two replacements
    assert listed and all(listed), listed  # every connect was issued its generation, no gap
    renewed = [r for r in caplog.records if r.getMessage().startswith(f"space {SPACE}: issuer session renewed")]
    assert len(renewed) >= 2
    assert not [r for r in caplog.records if "User Authentication Expired" in r.getMessage()]


async def test_an_issuer_session_that_cannot_be_renewed_before_it_expires_ends_the_lane(
    nursery: trio.Nursery, tmp_path: Path, nats_server_bin: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The broker paused (SIGSTOP) keeps the socket open but answers nothing: each renewal's
    connect hangs, and once the session expires with no renewal in, the session's task raises
    ``Unavailable`` naming the fix (which ends the lane; its host restarts it)."""
    mesh, pid = await start_mesh(nursery, tmp_path, nats_server_bin)
    session = IssuerSession(
        load_space(mesh.paths.space(SPACE).callout_json, SPACE), mesh.server_url, lifetime_s=3, clock=time.time,
        reconnect=False,
    )
    with trio.fail_after(CEILING_S):
        async with open_loop():
            with pytest.RaisesGroup(pytest.RaisesExc(Unavailable), flatten_subgroups=True) as ended:
                async with trio.open_nursery() as inner:
                    stores = await inner.start(session.run)
                    with pytest.raises(IssuedStoresMissing):  # the first session answers
                        await stores.check()
                    os.kill(pid, signal.SIGSTOP)
                    try:
                        await trio.sleep_forever()
                    finally:
                        os.kill(pid, signal.SIGCONT)
    (error,) = [e for e in _leaves(ended.value) if isinstance(e, Unavailable)]
    assert str(error).startswith(f"space {SPACE}: the issuer session expired and no renewal was let in (")
    assert str(error).endswith(" - check that the broker runs and trusts the space's account")
    assert session.renewals == 0


async def test_the_store_user_expires_and_is_renewed_while_the_lane_keeps_using_it(
    nursery: trio.Nursery, tmp_path: Path, nats_server_bin: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 15 item 4: the store user is minted with an expiry (never without) and renewed
    before it, with no gap the lane notices: across two lifetimes the plane claim keeps being
    renewed (a short lease; a failed renewal would fence and end the lane), connects keep being
    admitted (each writes its issuance row over the store user), and records reads and writes
    over a store user renewed the same way keep answering."""
    caplog.set_level(logging.INFO, logger="cotal.lane")
    mesh, _ = await start_mesh(nursery, tmp_path, nats_server_bin)
    bearer = _bearer(mesh, SPACE, "alice")
    seen: dict[str, dict] = {}  # store users (nkeys) seen connected: their claims
    admitted = 0
    with trio.fail_after(CEILING_S):
        async with trio.open_nursery() as lanes:
            await lanes.start(_lane(
                mesh, callout_only=False, store_lifetime_s=RENEW_LIFETIME_S, lease=Lease(lease_s=3.0, margin_s=1.0),
            ))  # fmt: skip
            end = trio.current_time() + 2 * RENEW_LIFETIME_S + 1
            while trio.current_time() < end:
                seen |= {c["sub"]: c for c in _named(await _users(mesh), f"cotal:auth-store:{SPACE}")}
                await mesh.admitted(SPACE, bearer)
                admitted += 1
                await trio.sleep(0.3)
            lanes.cancel_scope.cancel()
        material = load_space(mesh.paths.space(SPACE).callout_json, SPACE)
        user = RenewedUser(
            material, mesh.server_url, what="store session", name="test:store",
            permissions=functools.partial(store_permissions, SPACE), lifetime_s=RENEW_LIFETIME_S, clock=time.time,
            reconnect=False,
        )  # fmt: skip
        records: list[bytes | None] = []
        async with open_loop(), trio.open_nursery() as inner:
            store = RecordsStore(typing.cast(Connection, await inner.start(user.run)), SPACE)
            end = trio.current_time() + 2 * RENEW_LIFETIME_S + 1
            while trio.current_time() < end:
                await store.put_record("probe", str(len(records)).encode())
                records.append(await store.get_record("probe"))
                await trio.sleep(0.2)
            inner.cancel_scope.cancel()
    assert len(seen) >= 3  # the first store user and at least two replacements
    assert {c["exp"] - c["iat"] for c in seen.values()} == {RENEW_LIFETIME_S}  # never without expiry
    assert admitted > 10
    renewed = [r for r in caplog.records if r.getMessage().startswith(f"space {SPACE}: store session renewed")]
    assert len(renewed) >= 4  # the lane's and the records user's
    assert records == [str(i).encode() for i in range(len(records))] and len(records) > 10
    assert user.renewals >= 2
    assert not [r for r in caplog.records if "User Authentication Expired" in r.getMessage()]


async def test_a_lanes_store_user_is_minted_for_a_day(
    nursery: trio.Nursery, tmp_path: Path, nats_server_bin: str
) -> None:
    users = await _users_of_both_lanes(nursery, tmp_path, nats_server_bin)
    stores = _named(users, f"cotal:auth-store:{SPACE}")
    assert [c.get("exp", 0) - c["iat"] for c in stores] == [STORE_LIFETIME_S] * 2 == [86400] * 2


async def test_an_issuer_session_the_broker_drops_is_renewed_at_once(
    nursery: trio.Nursery, tmp_path: Path, nats_server_bin: str
) -> None:
    """A session kicked by the broker (its credential still valid) is replaced at once, so the
    issued stores ride a live session again, not the dropped one until its expiry."""
    mesh, _ = await start_mesh(nursery, tmp_path, nats_server_bin)
    session = IssuerSession(
        load_space(mesh.paths.space(SPACE).callout_json, SPACE), mesh.server_url, lifetime_s=300, clock=time.time,
        reconnect=False,
    )
    root = provision.ensure_root(mesh.paths, iat=int(time.time()))
    with trio.fail_after(CEILING_S):
        async with open_loop(), trio.open_nursery() as inner:
            stores = await inner.start(session.run)
            async with open_system_connection(mesh.server_url, root) as system:
                connz = json.loads((await system.request("$SYS.REQ.SERVER.PING.CONNZ", b"{}")).data)
                [cid] = [c["cid"] for c in connz["data"]["connections"] if c.get("name") == f"cotal:issuer:{SPACE}"]
                await system.request(f"$SYS.REQ.SERVER.{connz['server']['id']}.KICK", json.dumps({"cid": cid}).encode())
            while session.renewals == 0:
                await trio.sleep(0.05)
            with pytest.raises(IssuedStoresMissing):  # the new session answers
                await stores.check()
            inner.cancel_scope.cancel()
    assert session.renewals == 1 and session.trouble is None


def _failing_renewals(material, fails: list[str]):
    """An opener that opens the first issuer session as the lane does and every later one as a
    user signed by a key the space's account does not trust: the real broker refuses each renewal."""
    calls = 0
    stranger = dataclasses.replace(material, data_service_signing=KeyPair.generate(Prefix.ACCOUNT))

    def opener(material, *args, **kwargs):
        nonlocal calls
        calls += 1
        if calls > 1:
            fails.append(kwargs["name"])
            material = stranger
        return open_service_user(material, *args, **kwargs)

    return opener


async def test_a_failed_renewal_keeps_the_old_session_until_its_expiry_then_ends_the_lane(
    nursery: trio.Nursery, tmp_path: Path, nats_server_bin: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Spec "Profiles", issuer row: while renewals fail the lane keeps issuing over the old session
    (never over a closed one), says so, and ends with ``Unavailable`` naming the cause once that
    session's credential expires without a replacement - not a lifetime later."""
    caplog.set_level(logging.INFO, logger="cotal.lane")
    mesh, _ = await start_mesh(nursery, tmp_path, nats_server_bin)
    material = load_space(mesh.paths.space(SPACE).callout_json, SPACE)
    fails: list[str] = []
    session = IssuerSession(
        material, mesh.server_url, lifetime_s=RENEW_LIFETIME_S, clock=time.time, reconnect=False,
        open_user=_failing_renewals(material, fails),
    )
    answers: list[str] = []  # per probe of the issued stores over the session: what it saw
    with trio.fail_after(CEILING_S):
        async with open_loop():
            with pytest.RaisesGroup(pytest.RaisesExc(Unavailable), flatten_subgroups=True) as ended:
                async with trio.open_nursery() as inner:
                    stores = await inner.start(session.run)
                    expires = trio.current_time() + RENEW_LIFETIME_S  # at the latest
                    while True:
                        try:
                            await stores.check()
                            answers.append("stores exist")
                        except IssuedStoresMissing:
                            answers.append("answered")  # the session is open and answers
                        except Exception as exc:  # noqa: BLE001 - what a closed session gives
                            answers.append(f"{type(exc).__name__}: {exc}")
                        await trio.sleep(0.2)
            ended_at = trio.current_time()
    (error,) = [e for e in _leaves(ended.value) if isinstance(e, Unavailable)]
    # never a closed session: only a check in flight as the credential expires may see the close
    assert len(answers) > 10 and set(answers[:-1]) == {"answered"}, sorted(set(answers))
    assert ended_at <= expires + 1.5  # the old session's expiry bounds it, not expiry + a lifetime
    assert str(error).startswith(f"space {SPACE}: the issuer session expired and no renewal was let in (")
    assert str(error).endswith(" - check that the broker runs and trusts the space's account")
    assert "Authorization Violation" in str(error)  # the cause: the broker refused the renewal
    assert session.renewals == 0 and len(fails) >= 2  # renewals were tried, and retried
    warned = [r for r in caplog.records if r.levelno == logging.WARNING
              and r.getMessage().startswith(f"space {SPACE}: issuer session not renewed")]  # fmt: skip
    assert warned
    assert session.trouble is not None and session.trouble.startswith("the issuer session is not renewed (")


async def test_a_callout_host_names_the_drifted_space_with_the_remedy_and_serves_the_others(
    nursery: trio.Nursery, tmp_path: Path, nats_server_bin: str
) -> None:
    mesh, _ = await start_mesh(nursery, tmp_path, nats_server_bin)
    manifest = tmp_path / "host" / "spaces.json"
    manifest.parent.mkdir()
    atomic_write(manifest, json.dumps({"version": 2, "spaces": [{"space": SPACE}, {"space": "b"}]}).encode())
    with trio.fail_after(CEILING_S):
        async with trio.open_nursery() as lanes:
            await lanes.start(_lane(mesh, callout_only=False))
            lanes.cancel_scope.cancel()
        async with _admin(mesh) as admin:
            config = (await _api(admin, f"$JS.API.STREAM.INFO.{ISSUED}"))["config"]
            assert "error" not in await _api(admin, f"$JS.API.STREAM.UPDATE.{ISSUED}", {**config, "max_age": 10**12})
        start_lane = lane_factory(
            root=mesh.paths, common=LaneCommon(server_url=mesh.server_url, limits=CalloutLimits(auth_timeout_s=AUTH_TIMEOUT_S)),
            lanes=ReplicaLanes(),
        )
        host = await nursery.start(run_host, HostConfig(
            manifest=manifest, start_lane=start_lane, callout_only=True, backstop_s=600,
        ))  # fmt: skip
        spaces = await until(host, manifest, lambda s: s.get(SPACE, {}).get("state") == "retrying"
                             and s.get("b", {}).get("state") == "serving")  # fmt: skip
        # A single-space replica (`cotal auth-service --callout-only --space a`) refuses to start.
        single = ServiceConfig(
            root=mesh.paths, server_url=mesh.server_url, space=SPACE, callout_only=True,
            limits=CalloutLimits(auth_timeout_s=AUTH_TIMEOUT_S),
        )  # fmt: skip
        with pytest.RaisesGroup(pytest.RaisesExc(ConfigError), flatten_subgroups=True) as refused:
            async with trio.open_nursery() as service:
                await service.start(run_service, single)
                pytest.fail("a single-space replica started on a drifted issued store")
    sentence = (
        f"space {SPACE}'s store {ISSUED} has another shape than issued authority needs (max_age is 1000000000000,"
        f" not 0) and is refused - stop the space's auth service, its callout replicas and managers, then run {REMEDY}"
    )
    assert spaces[SPACE]["reason"] == sentence, spaces
    assert [str(e) for e in _leaves(refused.value) if isinstance(e, ConfigError)] == [sentence]
