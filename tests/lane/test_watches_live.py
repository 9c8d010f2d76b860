"""Issue 19 item 4 on a real nats-server: watches and history readers without the deliver-subject hole.

Spec credential-authority "Profiles": the agent's channel-registry and presence watches, the
observer's and the admin's ``hist__`` history readers. docs/wire-layout.md "Watches and history
readers" records what is measured here: a consumer-create grant cannot bound where a push
consumer delivers, so those readers are pull consumers the provisioner creates, and the profiles
read them (info, pull; the history readers also their own delete) and create no consumer in any
form. The ``stack`` fixture runs ``run_up`` for space ``alpha``: its lane creates the streams and
buckets, and its exchange provisions an agent's DM inbox and its two watch readers before the
agent's bearer.
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
import trio

from cotal_trio.broker.provision import mint_service_user
from cotal_trio.core import wire
from cotal_trio.core.profiles import Permissions
from cotal_trio.natsio import Connection, Message, consumer_info, consumer_names, kv_put, open_connection, open_loop, pull_next
from cotal_trio.state import load_space
from cotal_trio.stores.streams import ensure_history_readers
from tests.support.profiles import CEILING_S, DM, PRESENCE, minted, nonce_of, provision, refused
from tests.support.stack import SPACE, Stack, client

pytestmark = pytest.mark.broker

CHAT = f"COTAL_CHAT_{SPACE}"
CHANNELS = f"cotal_channels_{SPACE}"
# A subject a manager listens on: a literal subscription, so a push consumer aimed at it delivers.
ELSEWHERE = f"cotal.{SPACE}.ctl.spawn"


def push_create(stream: str, name: str, filter_subject: str, deliver: str, *, durable: bool = False) -> tuple[str, bytes]:
    """The pinned-filter create of a push consumer ``name`` delivering to ``deliver`` (with
    ``durable``, a durable one): (subject, body)."""
    config = {"name": name, "filter_subject": filter_subject, "ack_policy": "none", "deliver_subject": deliver}
    if durable:
        config["durable_name"] = name
    subject = f"$JS.API.CONSUMER.CREATE.{stream}.{name}.{filter_subject}"
    return subject, json.dumps({"stream_name": stream, "config": config}).encode()


@asynccontextmanager
async def granted(stack: Stack, pub: list[str]) -> AsyncIterator[Connection]:
    """A data-account user allowed to publish ``pub`` and ``$SYS.REQ.USER.INFO``, subscribe only
    its own inbox."""
    nonce = "grt" + secrets.token_hex(8)
    permissions = Permissions(pub_allow=(*pub, wire.USER_INFO_SUBJECT), sub_allow=(wire.inbox_subject(nonce),))
    material = load_space(stack.space_paths.callout_json, SPACE)
    now = int(time.time())
    creds = mint_service_user(material, name="test-granted", permissions=permissions.to_nats(), iat=now, exp=now + 300)
    async with open_loop(), open_connection(
        stack.info.server_url, creds=creds, name=nonce, inbox_prefix=f"_INBOX_{nonce}", reconnect=False
    ) as conn:
        yield conn


async def listening(root: Connection, subject: str) -> list[Message]:
    """Messages arriving on ``subject`` at the test's all-allowed user, which subscribes literally."""
    arrived: list[Message] = []
    await root.subscribe(subject, on_message=arrived.append)
    await root.flush()
    return arrived


async def test_a_pinned_filter_create_grant_does_not_bound_where_a_push_consumer_delivers(stack: Stack):
    """The measured reason no profile holds a consumer create (docs/wire-layout.md): a user whose
    only JetStream grant is ``CONSUMER.CREATE.<CHAT>.*.cotal.S.ch.>`` (the filter pinned in the
    subject) creates a push consumer whose deliver subject is one it may neither publish nor
    subscribe, and the broker delivers the stored chat there, and, the consumer being durable,
    what is posted after its creator has gone."""
    grant = f"$JS.API.CONSUMER.CREATE.{CHAT}.*.cotal.{SPACE}.ch.>"
    with trio.fail_after(CEILING_S):
        await provision(stack)
        async with minted(stack, None) as root:
            await root.request(f"cotal.{SPACE}.ch.team.news", b"stored chat")
            arrived = await listening(root, ELSEWHERE)
            async with granted(stack, [grant]) as limited:
                subject, body = push_create(CHAT, "hole", f"cotal.{SPACE}.ch.>", ELSEWHERE, durable=True)
                created = json.loads((await limited.request(subject, body)).data)
            await root.request(f"cotal.{SPACE}.ch.team.news", b"posted after")
            with trio.move_on_after(5):
                while len(arrived) < 2:
                    await trio.sleep(0.05)
            await root.request(f"$JS.API.CONSUMER.DELETE.{CHAT}.hole", b"")
    assert created["config"]["deliver_subject"] == ELSEWHERE, created
    assert [m.data for m in arrived] == [b"stored chat", b"posted after"]
    assert {m.subject for m in arrived} == {f"cotal.{SPACE}.ch.team.news"}


async def test_an_agent_reads_its_presence_and_registry_watches_and_creates_or_deletes_no_consumer(stack: Stack):
    alice = stack.grant("alice", "cli")
    bearer = await stack.bearer("alice", "cli")  # the exchange provisions its inbox and watches
    presence = wire.watch_durable(SPACE, "presence", alice.owner, "cli")
    registry = wire.watch_durable(SPACE, "channels", alice.owner, "cli")
    bob_key = wire.presence_key(stack.owner("bob"), "cli")
    with trio.fail_after(CEILING_S):
        async with minted(stack, None) as root, client(stack, bearer) as conn:
            await kv_put(root, PRESENCE, bob_key, b"online")
            await kv_put(root, CHANNELS, "team.news", b'{"replay": true}')
            arrived = await listening(root, ELSEWHERE)
            first = await pull_next(conn, presence.stream, presence.name, expires_s=2)
            listed = await pull_next(conn, registry.stream, registry.name, expires_s=2)
            await kv_put(root, PRESENCE, bob_key, b"away")
            change = await pull_next(conn, presence.stream, presence.name, expires_s=2)
            inspected = [await consumer_info(conn, d.stream, d.name) for d in (presence, registry)]
            errors = conn.error_count
            for durable in (presence, registry):
                await refused(conn, wire.js_consumer_delete(durable.stream, durable.name))
                await refused(conn, f"$JS.API.CONSUMER.CREATE.{durable.stream}")
                await refused(conn, f"$JS.API.CONSUMER.CREATE.{durable.stream}.w")
                await refused(conn, f"$JS.API.CONSUMER.DURABLE.CREATE.{durable.stream}.w")
                # a push consumer of its own watch's name and filter, delivering elsewhere
                await refused(conn, *push_create(durable.stream, durable.name, durable.filter_subject, ELSEWHERE))
                # or to another principal's inbox
                await refused(conn, *push_create(durable.stream, "w", durable.filter_subject, "_INBOX_bobsnonce1.w"))
            bobs = wire.watch_durable(SPACE, "presence", stack.owner("bob"), "cli")
            await refused(conn, wire.js_consumer_next(bobs.stream, bobs.name))
            await root.flush()
            names = {d.stream: await consumer_names(root, d.stream) for d in (presence, registry)}
            config = (await consumer_info(root, presence.stream, presence.name))["config"]
    assert errors == 0, "the reads and infos above were refused"
    assert (first.subject, first.data) == (wire.kv_subject(PRESENCE, bob_key), b"online")
    assert (listed.subject, listed.data) == (wire.kv_subject(CHANNELS, "team.news"), b'{"replay": true}')
    assert change.data == b"away"
    assert [info["name"] for info in inspected] == [presence.name, registry.name]
    assert names == {presence.stream: [presence.name], registry.stream: [registry.name]}
    assert "deliver_subject" not in config and config["ack_policy"] == "none"
    assert arrived == []


async def test_an_observer_and_an_admin_read_history_through_their_own_readers_only(stack: Stack):
    owner = stack.owner("alice")
    with trio.fail_after(CEILING_S):
        await provision(stack, [(owner, "cli")])
        async with minted(stack, None) as root, minted(stack, "observer") as observer, minted(stack, "admin") as admin:
            async with minted(stack, "provisioner") as provisioner:
                seen = await ensure_history_readers(provisioner, SPACE, nonce_of(observer), "observer")
                godview = await ensure_history_readers(provisioner, SPACE, nonce_of(admin), "admin")
            await root.request(f"cotal.{SPACE}.ch.team.news", b"earlier chat")
            await root.request(f"cotal.{SPACE}.dm.{owner}.cli.{owner}.cli", b"earlier dm")
            arrived = await listening(root, ELSEWHERE)
            chat = await pull_next(observer, seen[0].stream, seen[0].name, expires_s=2)
            admin_reads = [await pull_next(admin, d.stream, d.name, expires_s=2) for d in godview]
            errors = observer.error_count
            reader = seen[0]
            await refused(observer, *push_create(CHAT, reader.name, reader.filter_subject, ELSEWHERE))
            await refused(observer, f"$JS.API.CONSUMER.CREATE.{CHAT}")
            await refused(observer, f"$JS.API.CONSUMER.DURABLE.CREATE.{CHAT}.{reader.name}")
            await refused(observer, wire.js_consumer_next(DM, reader.name))  # no DM history
            await refused(observer, wire.js_consumer_delete(CHAT, godview[0].name))  # another's reader
            await refused(observer, wire.js_consumer_delete(CHAT, "delivery-chat"))
            await refused(admin, *push_create(DM, godview[1].name, godview[1].filter_subject, ELSEWHERE))
            deleted = [json.loads((await c.request(wire.js_consumer_delete(d.stream, d.name), b"")).data)
                       for c, d in ((observer, reader), (admin, godview[0]), (admin, godview[1]))]  # fmt: skip
            await root.flush()
            left = {stream: await consumer_names(root, stream) for stream in (CHAT, DM)}
    assert errors == 0, "the observer's reads were refused"
    assert (chat.subject, chat.data) == (f"cotal.{SPACE}.ch.team.news", b"earlier chat")
    assert [m.data for m in admin_reads] == [b"earlier chat", b"earlier dm"]
    assert [d.get("success") for d in deleted] == [True, True, True]
    assert left == {CHAT: [], DM: [wire.dm_durable(SPACE, owner, "cli").name]}
    assert arrived == []
