"""A static agent credential is an issuance, and its bind-only durables are keyed by its lifecycle
UID (issue 19 items 2 and 3; spec credential-authority "Issued authority", "Provisioning", "DM
confidentiality"; docs/static-credentials.md, docs/issued-authority.md "Static agents").

On a real operator-mode nats-server: ``cotal auth mint --profile agent`` records the evidence of the
credential's final ceiling under a fresh generation (horizon: 30 days after the mint; source: the
credential's ledger family) and the accepted row under the token its receipt prints, before the
file exists; the agent connects, learns its generation from that row and uses its ``ep.v1`` row;
``cotal auth revoke-credential`` retires the issuance; ``cotal auth renew`` keeps the generation
only for a byte-identical ceiling; the DM inbox ``dm-<o>-<a>-<uid>`` and the role's task queue exist
after the mint, ``--identity`` gets a new inbox (never the old one), and ``cotal auth provision UID``
makes them later.
"""

from __future__ import annotations

import json
import time
from contextlib import asynccontextmanager

import pytest
import trio

from cotal_trio.broker.provision import mint_service_user
from cotal_trio.broker.spaces import add_space
from cotal_trio.core import natsjwt, wire
from cotal_trio.core.creds import parse_creds
from cotal_trio.core.errors import Refused, Unavailable
from cotal_trio.core.issued import IssuedRef, Source, ceiling_from_native, parse_accepted
from cotal_trio.natsio import StreamNotFound, consumer_info, kv_keys, open_connection, open_loop
from cotal_trio.state import load_space
from cotal_trio.state.credentials import load_record
from cotal_trio.stores.issued import IssuedStores
from tests.support.cli_root import cotal

pytestmark = pytest.mark.broker

STATIC = "st"
CEILING_S = 60
THIRTY_DAYS_S = 30 * 24 * 3600


def connect(url: str, receipt: dict):
    nonce = receipt["inboxPrefix"].removeprefix("_INBOX_")
    with open(receipt["path"]) as handle:
        creds = handle.read()
    return open_connection(url, creds=creds, name=nonce, inbox_prefix=receipt["inboxPrefix"], reconnect=False)


@asynccontextmanager
async def harness(paths, url: str):
    """A data-account user with no restriction (the test's own eyes on the stores and durables)."""
    material = load_space(paths.space(STATIC).callout_json, STATIC)
    now = int(time.time())
    creds = mint_service_user(material, name="test-harness", permissions={}, iat=now, exp=now + 300)
    async with open_loop(), open_connection(url, creds=creds, name="harness0000", reconnect=False) as conn:
        yield conn


def claims_of(receipt: dict) -> dict:
    with open(receipt["path"]) as handle:
        return natsjwt.verify(parse_creds(handle.read())[0])


def ref_of(receipt: dict) -> IssuedRef:
    owner, actor = receipt["principal"].split(".")
    return IssuedRef(space=STATIC, owner=owner, actor=actor, uid=receipt["lifecycleUid"], generation=receipt["generation"])


async def mint(capsys, paths, url: str, *argv: str) -> dict:
    code, out, err = await cotal(capsys, "auth", "mint", "--space", STATIC, "--root", str(paths.root), "--server", url,
                                 *argv, "--json")  # fmt: skip
    assert code == 0, err
    return json.loads(out)


async def run(capsys, paths, url: str, *argv: str) -> dict:
    code, out, err = await cotal(capsys, "auth", *argv, "--space", STATIC, "--root", str(paths.root), "--server", url, "--json")
    assert code == 0, err
    return json.loads(out)


async def durable_exists(conn, stream: str, name: str) -> bool:
    try:
        return await consumer_info(conn, stream, name) is not None
    except StreamNotFound:  # not even the space's streams yet
        return False


def dm_name(receipt: dict, uid: str | None = None) -> str:
    owner, actor = receipt["principal"].split(".")
    return wire.dm_durable(STATIC, owner, actor, uid).name


async def test_a_static_agent_mint_is_an_issuance_its_agent_reads_and_uses_and_revoke_retires(
    operator_broker, provisioned, capsys, tmp_path, monkeypatch  # noqa: F811
):
    url, paths = operator_broker, provisioned.paths
    monkeypatch.chdir(tmp_path)
    with trio.fail_after(CEILING_S):
        await add_space(paths, STATIC, static=True, server_url=url, now=time.time())
        receipt = await mint(capsys, paths, url, "--label", "bot", "--allow-publish", "team.news", "--role", "ops")
        ref, token = ref_of(receipt), receipt["acceptedToken"]
        assert receipt["horizon"] == receipt["issuedAt"] + THIRTY_DAYS_S == ref.horizon
        source = Source(space=STATIC, bucket=f"cotal_auth_{STATIC}", key=f"cred.{receipt['lifecycleUid']}")
        claims = claims_of(receipt)
        async with harness(paths, url) as eyes:
            stores = IssuedStores(eyes, STATIC)
            evidence = (await stores.resolve(ref, now=time.time())).evidence
            # The evidence holds exactly the ceiling the file carries, ep.v1 rows included.
            assert evidence.permissions == ceiling_from_native({"pub": claims["nats"]["pub"], "sub": claims["nats"]["sub"]})
            assert (evidence.sources, evidence.expires_at) == ((source,), None)
            assert await stores.accepted_ref(token, now=time.time()) == ref
            assert await stores.by_source(source, now=time.time()) == [ref]
            # The bind-only durables exist, the inbox keyed by the lifecycle UID; no principal-keyed one.
            assert await consumer_info(eyes, f"COTAL_DM_{STATIC}", dm_name(receipt, receipt["lifecycleUid"])) is not None
            assert await consumer_info(eyes, f"COTAL_DM_{STATIC}", dm_name(receipt)) is None
            assert await consumer_info(eyes, f"COTAL_TASK_{STATIC}", "task-ops") is not None

        owner, actor = receipt["principal"].split(".")
        listing = wire.ep_v1_subject(STATIC, ref.generation, owner, actor, "registry", "endpoints")
        answered, answers = trio.open_memory_channel(4)
        async with harness(paths, url) as registry, open_loop(), connect(url, receipt) as agent:
            await registry.subscribe(f"cotal.{STATIC}.ep.v1.>", on_message=answered.send_nowait)
            await registry.flush()
            # The agent learns its generation from its accepted row, under the token its receipt printed.
            row = await agent.request(wire.js_direct_get(f"KV_cotal_accepted_{STATIC}", f"$KV.cotal_accepted_{STATIC}.accepted.v1.{token}"), b"")
            assert parse_accepted(row.data).ref == ref
            # Its ep.v1 row, the generation pinned beside the caller triple, reaches the registry.
            await agent.publish(listing, b"endpoints?")
            await agent.flush()
            assert (await answers.receive()).subject == listing
            assert agent.error_count == 0
            # It binds its own inbox durable and no other generation's row.
            assert await consumer_info(agent, f"COTAL_DM_{STATIC}", dm_name(receipt, receipt["lifecycleUid"])) is not None
            other = wire.ep_v1_subject(STATIC, "0" * 32, owner, actor, "registry", "endpoints")
            await agent.publish(other, b"")
            assert other in await agent.wait_error(after=0)

        revoked = await run(capsys, paths, url, "revoke-credential", "bot")
        assert (revoked["pushedTo"], revoked["retiredIssuances"]) == (url, 1)
        async with harness(paths, url) as eyes:
            with pytest.raises(Refused, match="is revoked, not active"):
                await IssuedStores(eyes, STATIC).resolve(ref, now=time.time())
        with pytest.RaisesGroup(pytest.RaisesExc(Unavailable, match="Authorization Violation"), flatten_subgroups=True):
            async with open_loop(), connect(url, receipt):
                pass

        # --identity: the same key and principal, a new lifecycle, a new generation, a new inbox.
        again = await mint(capsys, paths, url, "--label", "bot", "--replace", "--identity", receipt["path"],
                           "--allow-publish", "team.news", "--role", "ops")  # fmt: skip
        assert again["userKey"] == receipt["userKey"] and again["lifecycleUid"] != receipt["lifecycleUid"]
        assert again["generation"] != receipt["generation"] and again["acceptedToken"] != token
        assert again["horizon"] == again["issuedAt"] + THIRTY_DAYS_S
        async with open_loop(), connect(url, again) as agent:
            assert await consumer_info(agent, f"COTAL_DM_{STATIC}", dm_name(again, again["lifecycleUid"])) is not None
            old = wire.js_consumer_info(f"COTAL_DM_{STATIC}", dm_name(receipt, receipt["lifecycleUid"]))
            await agent.publish(old, b"")  # the old inbox is not its to bind
            assert old.lower() in await agent.wait_error(after=0)  # the broker lowercases the subject


async def test_renewal_keeps_the_generation_only_for_a_byte_identical_ceiling(
    operator_broker, provisioned, capsys, tmp_path, monkeypatch  # noqa: F811
):
    url, paths = operator_broker, provisioned.paths
    monkeypatch.chdir(tmp_path)
    with trio.fail_after(CEILING_S):
        await add_space(paths, STATIC, static=True, server_url=url, now=time.time())
        first = await mint(capsys, paths, url, "--label", "rn", "--allow-publish", "team.news", "--expires-in", "600")
        await trio.sleep(1.1)  # a later iat for the renewed JWT
        same = await run(capsys, paths, url, "renew", "rn", "--expires-in", "7200")
        assert same["keptGeneration"] is True
        assert (same["generation"], same["acceptedToken"], same["lifecycleUid"], same["userKey"]) == (
            first["generation"], first["acceptedToken"], first["lifecycleUid"], first["userKey"])
        assert same["expiresAt"] == same["issuedAt"] + 7200 and claims_of(same)["exp"] == same["expiresAt"]
        async with harness(paths, url) as eyes:
            kept = (await IssuedStores(eyes, STATIC).resolve(ref_of(same), now=time.time())).evidence
            claims = claims_of(same)
            assert kept.permissions == ceiling_from_native({"pub": claims["nats"]["pub"], "sub": claims["nats"]["sub"]})

        changed = await run(capsys, paths, url, "renew", "rn", "--allow-publish", "team.other")
        assert changed["keptGeneration"] is False
        assert changed["generation"] != first["generation"] and changed["acceptedToken"] != first["acceptedToken"]
        assert changed["horizon"] == first["horizon"]  # renewals never move the horizon
        assert changed["lifecycleUid"] == first["lifecycleUid"]
        claims = claims_of(changed)
        async with harness(paths, url) as eyes:
            stores = IssuedStores(eyes, STATIC)
            fresh = (await stores.resolve(ref_of(changed), now=time.time())).evidence
            assert fresh.permissions == ceiling_from_native({"pub": claims["nats"]["pub"], "sub": claims["nats"]["sub"]})
            assert fresh.permissions != kept.permissions
            assert await stores.accepted_ref(changed["acceptedToken"], now=time.time()) == ref_of(changed)
        async with open_loop(), connect(url, changed) as agent:
            await agent.publish(f"cotal.{STATIC}.ch.team.other", b"renewed grant")
            await agent.flush()
            assert agent.error_count == 0
        assert load_record(paths.space(STATIC), "rn").current.generation == changed["generation"]


async def test_no_provision_then_cotal_auth_provision_makes_the_durables_of_a_receipts_uid(
    operator_broker, provisioned, capsys, tmp_path, monkeypatch  # noqa: F811
):
    url, paths = operator_broker, provisioned.paths
    monkeypatch.chdir(tmp_path)
    with trio.fail_after(CEILING_S):
        await add_space(paths, STATIC, static=True, server_url=url, now=time.time())
        later = await mint(capsys, paths, url, "--label", "later", "--role", "ops", "--no-provision")
        inbox = dm_name(later, later["lifecycleUid"])
        async with harness(paths, url) as eyes:
            assert not await durable_exists(eyes, f"COTAL_DM_{STATIC}", inbox)
        done = await run(capsys, paths, url, "provision", later["lifecycleUid"])
        assert done["durables"] == [inbox, "task-ops"]
        async with harness(paths, url) as eyes:
            info = await consumer_info(eyes, f"COTAL_DM_{STATIC}", inbox)
            assert info["config"]["filter_subject"] == f"cotal.{STATIC}.dm.{later['principal']}.>"
            assert await consumer_info(eyes, f"COTAL_TASK_{STATIC}", "task-ops") is not None
        code, _, err = await cotal(capsys, "auth", "provision", "0" * 26, "--space", STATIC, "--root", str(paths.root),
                                   "--server", url)  # fmt: skip
        assert code == 1 and f"space {STATIC} has no credential of lifecycle {'0' * 26}" in err


async def test_a_failure_between_the_evidence_and_the_file_hands_nothing_out(
    operator_broker, provisioned, capsys, tmp_path, monkeypatch  # noqa: F811
):
    url, paths = operator_broker, provisioned.paths
    monkeypatch.chdir(tmp_path)
    blocker = tmp_path / "blocker"
    blocker.write_text("a file, not a folder")
    with trio.fail_after(CEILING_S):
        await add_space(paths, STATIC, static=True, server_url=url, now=time.time())
        code, _, err = await cotal(capsys, "auth", "mint", "--space", STATIC, "--root", str(paths.root), "--server", url,
                                   "--label", "lost", "--out", str(blocker / "lost.creds"))  # fmt: skip
        assert code == 1 and "nothing was handed out (no file, no record; generation " in err, err
        assert "run the same `cotal auth mint` again" in err
        assert load_record(paths.space(STATIC), "lost") is None
        async with harness(paths, url) as eyes:
            keys = await kv_keys(eyes, f"cotal_issued_{STATIC}", prefix="v1.")
            assert len(keys) == 1  # its evidence was written before the file was tried ...
            ref = IssuedRef(space=STATIC, owner=keys[0].split(".")[1], actor="lost", uid=keys[0].split(".")[3],
                            generation=keys[0].split(".")[4])  # fmt: skip
            with pytest.raises(Refused, match="is revoked, not active"):  # ... and is retired: it authorizes nothing
                await IssuedStores(eyes, STATIC).resolve(ref, now=time.time())
        assert (await cotal(capsys, "auth", "mint", "--space", STATIC, "--root", str(paths.root), "--server", url,
                            "--label", "lost"))[0] == 0  # the rerun the sentence names  # fmt: skip


async def test_an_agent_mint_with_no_broker_writes_nothing(provisioned, capsys, tmp_path, monkeypatch):  # noqa: F811
    paths = provisioned.paths
    monkeypatch.chdir(tmp_path)
    with trio.fail_after(CEILING_S):
        await add_space(paths, STATIC, static=True, server_url=None, now=time.time())
        code, _, err = await cotal(capsys, "auth", "mint", "--space", STATIC, "--root", str(paths.root), "--label", "bot")
    assert code == 1 and "a static agent credential is an issuance" in err and "nothing was written" in err, err
    assert load_record(paths.space(STATIC), "bot") is None
