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
makes them later. Issue 19 item 4 for static credentials: the agent's mint also makes its two
watch readers, which it pulls and never creates or deletes; an observer's or admin's
``hist__<nonce>`` history readers are made by ``cotal auth provision UID`` (their mint is offline),
and the credential pulls them.
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
from cotal_trio.natsio import StreamNotFound, consumer_info, kv_keys, kv_put, open_connection, open_loop, pull_next
from cotal_trio.state import load_space
from cotal_trio.state.credentials import load_record
from cotal_trio.stores.issued import IssuedStores
from tests.support.cli_root import cotal
from tests.support.static_mint import STATIC, connect_receipt, static_space  # noqa: F401 - the fixture
from tests.support.profiles import refused

pytestmark = pytest.mark.broker

CEILING_S = 60
THIRTY_DAYS_S = 30 * 24 * 3600


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


async def test_a_static_agent_mint_is_an_issuance_its_agent_reads_and_uses_and_revoke_retires(static_space, capsys):
    url, paths = static_space
    with trio.fail_after(CEILING_S):
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
        async with harness(paths, url) as registry, open_loop(), connect_receipt(url, receipt) as agent:
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
            async with open_loop(), connect_receipt(url, receipt):
                pass

        # --identity: the same key and principal, a new lifecycle, a new generation, a new inbox.
        again = await mint(capsys, paths, url, "--label", "bot", "--replace", "--identity", receipt["path"],
                           "--allow-publish", "team.news", "--role", "ops")  # fmt: skip
        assert again["userKey"] == receipt["userKey"] and again["lifecycleUid"] != receipt["lifecycleUid"]
        assert again["generation"] != receipt["generation"] and again["acceptedToken"] != token
        assert again["horizon"] == again["issuedAt"] + THIRTY_DAYS_S
        async with open_loop(), connect_receipt(url, again) as agent:
            assert await consumer_info(agent, f"COTAL_DM_{STATIC}", dm_name(again, again["lifecycleUid"])) is not None
            old = wire.js_consumer_info(f"COTAL_DM_{STATIC}", dm_name(receipt, receipt["lifecycleUid"]))
            await agent.publish(old, b"")  # the old inbox is not its to bind
            assert old.lower() in await agent.wait_error(after=0)  # the broker lowercases the subject


async def test_renewal_keeps_the_generation_only_for_a_byte_identical_ceiling(static_space, capsys):
    url, paths = static_space
    with trio.fail_after(CEILING_S):
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
        async with open_loop(), connect_receipt(url, changed) as agent:
            await agent.publish(f"cotal.{STATIC}.ch.team.other", b"renewed grant")
            await agent.flush()
            assert agent.error_count == 0
        assert load_record(paths.space(STATIC), "rn").current.generation == changed["generation"]


async def test_no_provision_then_cotal_auth_provision_makes_the_durables_of_a_receipts_uid(static_space, capsys):
    url, paths = static_space
    with trio.fail_after(CEILING_S):
        later = await mint(capsys, paths, url, "--label", "later", "--role", "ops", "--no-provision")
        inbox = dm_name(later, later["lifecycleUid"])
        async with harness(paths, url) as eyes:
            assert not await durable_exists(eyes, f"COTAL_DM_{STATIC}", inbox)
        assert later["provision"] == f"cotal auth provision {later['lifecycleUid']} --space {STATIC}"
        watches = [wire.watch_durable(STATIC, kind, *later["principal"].split(".")) for kind in ("presence", "channels")]
        done = await run(capsys, paths, url, "provision", later["lifecycleUid"])
        assert done["durables"] == [{"stream": f"COTAL_DM_{STATIC}", "name": inbox},
                                    {"stream": f"COTAL_TASK_{STATIC}", "name": "task-ops"},
                                    *({"stream": w.stream, "name": w.name} for w in watches)]  # fmt: skip
        assert done["durables"] == later["durables"]  # what the receipt said the provision would make
        async with harness(paths, url) as eyes:
            info = await consumer_info(eyes, f"COTAL_DM_{STATIC}", inbox)
            assert info["config"]["filter_subject"] == f"cotal.{STATIC}.dm.{later['principal']}.>"
            assert await consumer_info(eyes, f"COTAL_TASK_{STATIC}", "task-ops") is not None
            for watch in watches:
                assert (await consumer_info(eyes, watch.stream, watch.name))["config"]["deliver_policy"] == "last_per_subject"
        code, _, err = await cotal(capsys, "auth", "provision", "0" * 26, "--space", STATIC, "--root", str(paths.root),
                                   "--server", url)  # fmt: skip
        assert code == 1 and f"space {STATIC} has no credential of lifecycle {'0' * 26}" in err
        # A renewal that provisions (a new --role) makes the watch readers too.
        bare = await mint(capsys, paths, url, "--label", "bare", "--no-provision")
        await run(capsys, paths, url, "renew", "bare", "--role", "r2")
        async with harness(paths, url) as eyes:
            for durable in bare["durables"]:
                assert await consumer_info(eyes, durable["stream"], durable["name"]) is not None
            assert await consumer_info(eyes, f"COTAL_TASK_{STATIC}", "task-r2") is not None


async def test_a_failure_between_the_evidence_and_the_file_hands_nothing_out(static_space, capsys, tmp_path):
    url, paths = static_space
    blocker = tmp_path / "blocker"
    blocker.write_text("a file, not a folder")
    with trio.fail_after(CEILING_S):
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


async def test_a_static_agent_pulls_its_two_watch_readers_and_creates_or_deletes_no_consumer(static_space, capsys):
    """Spec "Profiles" (the agent's presence and channel-registry watches): the mint made both
    readers pull-only (``WATCH_CONFIG``); the agent reads each key's last value, then a change,
    and every create form and a delete of its own watch are refused."""
    url, paths = static_space
    presence_bucket, channels_bucket = f"cotal_presence_{STATIC}", f"cotal_channels_{STATIC}"
    with trio.fail_after(CEILING_S):
        receipt = await mint(capsys, paths, url, "--label", "watcher")
        owner, actor = receipt["principal"].split(".")
        presence, registry = (wire.watch_durable(STATIC, kind, owner, actor) for kind in ("presence", "channels"))
        assert [d["name"] for d in receipt["durables"]][-2:] == [presence.name, registry.name]
        bob = wire.presence_key(owner, "bob")
        async with harness(paths, url) as eyes, open_loop(), connect_receipt(url, receipt) as agent:
            await kv_put(eyes, presence_bucket, bob, b"online")
            await kv_put(eyes, channels_bucket, "team.news", b'{"replay": true}')
            first = await pull_next(agent, presence.stream, presence.name, expires_s=2)
            listed = await pull_next(agent, registry.stream, registry.name, expires_s=2)
            await kv_put(eyes, presence_bucket, bob, b"away")
            await kv_put(eyes, channels_bucket, "team.ops", b'{"replay": false}')
            change = await pull_next(agent, presence.stream, presence.name, expires_s=2)
            added = await pull_next(agent, registry.stream, registry.name, expires_s=2)
            errors = agent.error_count
            for durable in (presence, registry):
                await refused(agent, wire.js_consumer_delete(durable.stream, durable.name))
                await refused(agent, wire.js_consumer_create(durable.stream, durable.name, durable.filter_subject))
                await refused(agent, wire.js_consumer_create(durable.stream, "w", durable.filter_subject))
                await refused(agent, f"$JS.API.CONSUMER.CREATE.{durable.stream}")
                await refused(agent, f"$JS.API.CONSUMER.DURABLE.CREATE.{durable.stream}.w")
            configs = [(await consumer_info(eyes, d.stream, d.name))["config"] for d in (presence, registry)]
    assert errors == 0, "the agent's pulls were refused"
    assert (first.subject, first.data) == (f"$KV.{presence_bucket}.{bob}", b"online")
    assert (listed.subject, listed.data) == (f"$KV.{channels_bucket}.team.news", b'{"replay": true}')
    assert (change.data, added.subject) == (b"away", f"$KV.{channels_bucket}.team.ops")
    for config in configs:
        assert "deliver_subject" not in config and (config["ack_policy"], config["deliver_policy"]) == ("none", "last_per_subject")


async def test_cotal_auth_provision_makes_an_observers_and_an_admins_history_readers_which_they_pull(static_space, capsys):
    """Spec "Profiles" (the observer's chat and the admin's chat and DM ``hist__`` readers): the
    mints are offline and create nothing; the ``cotal auth provision`` their receipts name makes
    the readers pull-only (``HISTORY_CONFIG``), and each credential pulls its own and creates none."""
    url, paths = static_space
    chat, dm = f"COTAL_CHAT_{STATIC}", f"COTAL_DM_{STATIC}"
    with trio.fail_after(CEILING_S):
        receipts = {}
        for profile in ("observer", "admin"):
            code, out, err = await cotal(capsys, "auth", "mint", "--space", STATIC, "--root", str(paths.root),
                                         "--profile", profile, "--label", profile, "--json")  # fmt: skip
            assert code == 0, err
            receipts[profile] = json.loads(out)
        nonces = {p: r["inboxPrefix"].removeprefix("_INBOX_") for p, r in receipts.items()}
        async with harness(paths, url) as eyes:
            assert not await durable_exists(eyes, chat, f"hist__{nonces['observer']}")  # the mint is offline
        for profile, receipt in receipts.items():
            assert receipt["provision"] == f"cotal auth provision {receipt['lifecycleUid']} --space {STATIC}"
            done = await run(capsys, paths, url, "provision", receipt["lifecycleUid"])
            assert done["durables"] == receipt["durables"]
        assert [d["stream"] for d in receipts["admin"]["durables"]] == [chat, dm]
        async with harness(paths, url) as eyes:
            owner = receipts["admin"]["principal"].split(".")[0]
            await eyes.request(f"cotal.{STATIC}.ch.team.news", b"earlier chat")
            await eyes.request(f"cotal.{STATIC}.dm.{owner}.a.{owner}.b", b"earlier dm")
            configs = [(await consumer_info(eyes, s, f"hist__{nonces[p]}"))["config"]
                       for p, s in (("observer", chat), ("admin", chat), ("admin", dm))]  # fmt: skip
        async with open_loop(), connect_receipt(url, receipts["observer"]) as observer, connect_receipt(url, receipts["admin"]) as admin:
            seen = await pull_next(observer, chat, f"hist__{nonces['observer']}", expires_s=2)
            godview = [await pull_next(admin, s, f"hist__{nonces['admin']}", expires_s=2) for s in (chat, dm)]
            errors = (observer.error_count, admin.error_count)
            reader = f"hist__{nonces['observer']}"
            await refused(observer, wire.js_consumer_create(chat, reader, f"cotal.{STATIC}.ch.>"))
            await refused(observer, wire.js_consumer_next(dm, reader))  # no DM history for an observer
            await refused(observer, wire.js_consumer_next(chat, f"hist__{nonces['admin']}"))  # nor another's reader
            await refused(admin, wire.js_consumer_create(dm, f"hist__{nonces['admin']}", f"cotal.{STATIC}.dm.*.*.>"))
    assert errors == (0, 0), "the readers' pulls were refused"
    assert (seen.subject, seen.data) == (f"cotal.{STATIC}.ch.team.news", b"earlier chat")
    assert [m.data for m in godview] == [b"earlier chat", b"earlier dm"]
    for config in configs:
        assert "deliver_subject" not in config and (config["ack_policy"], config["deliver_policy"]) == ("none", "all")
