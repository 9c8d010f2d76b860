"""The trio-native NATS connection (natsio/_native.py, issue 14) against real nats-servers on 127.0.0.1.

What the callout lane relies on: a user-JWT connect (the nonce signed with the creds' seed) and a
named refusal; subscribe with a queue group, publish, request/reply over one wildcard inbox, the
broker's 503 as NoResponders; HMSG headers both ways; writes queued in one scheduler pass leaving
in one send (counted by a wrapper around ``trio.SocketStream.send_all``, not timed); a lost
socket reconnected with the subscription re-sent, or, without ``reconnect``, the connection
closed for good; on a cluster, the connection moving to another node when its node goes; a
paused broker noticed by the keepalive. Every broker is the test's own, stopped by pid or scope.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
import trio

from cotal_trio.broker import provision
from cotal_trio.broker.accounts import open_system_connection, push_accounts
from cotal_trio.broker.process import find_nats_server, free_port, nats_server_version
from cotal_trio.core.creds import format_creds, parse_creds
from cotal_trio.core.errors import Unavailable
from cotal_trio.natsio import Message, NativeConnection, NoResponders, open_loop, open_native_connection
from cotal_trio.natsio._native import MAX_PENDING_BYTES
from cotal_trio.natsio._conn import MAX_OUTAGE_S, PONG_TIMEOUT_S
from tests.support.cluster import start_cluster
from tests.support.plain_brokers import silent_listener, start_stoppable

pytestmark = pytest.mark.broker

CEILING_S = 30.0  # loop bounds only; nothing here asserts a time
SPACE = "demo"  # the space tests/support/brokers.py provisions
APP = {"pub": {"allow": ["app.>", "_INBOX.>"]}, "sub": {"allow": ["app.>", "_INBOX.>"]}}


async def _push(url: str, provisioned) -> None:
    record = provision.load_space_accounts(provisioned.paths, provisioned.broker, SPACE)
    async with open_loop(), open_system_connection(url, provisioned.broker) as sys_conn:
        await push_accounts(sys_conn, [record.data_jwt, record.auth_jwt])


def _app_creds(provisioned) -> str:
    now = int(time.time())
    return provision.mint_service_user(provisioned.space, name="svc", permissions=APP, iat=now, exp=now + 300)


@asynccontextmanager
async def _native_on_stoppable(nursery, tmp_path, *, reconnect: bool) -> AsyncIterator[tuple[NativeConnection, trio.CancelScope, int]]:
    """A native connection to a broker of the test's own; yields (conn, the broker's scope, its pid)."""
    port, scope = free_port(), trio.CancelScope()
    pid = await start_stoppable(nursery, tmp_path, port, scope)
    with trio.fail_after(CEILING_S):
        async with open_native_connection(f"nats://127.0.0.1:{port}", reconnect=reconnect) as conn:
            await conn.flush()
            yield conn, scope, pid
    scope.cancel()


async def test_a_user_jwt_connect_subscribes_publishes_and_requests(operator_broker, provisioned):
    """Creds of a data-account user: CONNECT with the JWT and the signed nonce is admitted; a
    queue subscription gets a publish; a request to it gets its reply over the inbox."""
    await _push(operator_broker, provisioned)
    got = []
    with trio.fail_after(CEILING_S):
        async with open_native_connection(operator_broker, creds=_app_creds(provisioned), reconnect=False) as conn:

            def serve(msg: Message) -> None:
                got.append(msg)
                if msg.reply:
                    conn.publish_nowait(msg.reply, b"answer:" + msg.data)

            await conn.subscribe("app.svc", queue="workers", on_message=serve)
            await conn.flush()
            conn.publish_nowait("app.svc", b"plain")
            replies = await conn.request_many([("app.svc", b"one", None), ("app.svc", b"two", None)])
            assert [r.data for r in replies if isinstance(r, Message)] == [b"answer:one", b"answer:two"]
            assert [m.data for m in got] == [b"plain", b"one", b"two"]
            assert got[0].reply is None and got[1].reply is not None
            assert conn.last_error is None
            assert conn.client_id is not None
            # the version INFO announced, as nats-py's connection reports it (the lane's board
            # shows it: lane/run.py)
            version = nats_server_version(find_nats_server() or "nats-server")
            assert conn.connected_server_version == version.removeprefix("v")


async def test_a_forged_signature_is_refused_by_name(operator_broker, provisioned):
    """The creds' JWT with another seed: the broker's -ERR text is the Unavailable's, nothing stays open."""
    await _push(operator_broker, provisioned)
    jwt, _ = parse_creds(_app_creds(provisioned))
    forged = format_creds(jwt, parse_creds(provisioned.space.callout_creds)[1])
    with trio.fail_after(CEILING_S), pytest.raises(Unavailable) as refused:
        async with open_native_connection(operator_broker, creds=forged, reconnect=False):
            pass
    assert "Authorization Violation" in str(refused.value)


async def test_a_permission_violation_is_reported_not_fatal(operator_broker, provisioned):
    await _push(operator_broker, provisioned)
    with trio.fail_after(CEILING_S):
        async with open_native_connection(operator_broker, creds=_app_creds(provisioned), reconnect=False) as conn:
            before = conn.error_count
            conn.publish_nowait("forbidden.subject", b"x")
            text = await conn.wait_error(after=before)
            assert "permissions violation" in text.lower()
            await conn.flush()  # still connected
            assert not conn.closed.is_set()


async def test_headers_go_out_and_come_back_and_503_is_no_responders(plain_broker):
    got: list[Message] = []
    with trio.fail_after(CEILING_S):
        async with open_native_connection(plain_broker, reconnect=False) as conn:
            await conn.subscribe("h.x", on_message=got.append)
            await conn.flush()
            conn.publish_nowait("h.x", b"body", {"Nats-Expected-Last-Subject-Sequence": "0", "X-Two": "a b"})
            conn.publish_nowait("h.x", b"")  # an empty payload without headers
            await conn.flush()
            assert got[0].headers == {"Nats-Expected-Last-Subject-Sequence": "0", "X-Two": "a b"}
            assert got[0].data == b"body"
            assert got[1].headers is None and got[1].data == b""
            [answer] = await conn.request_many([("nobody.listens", b"?", None)])
            assert isinstance(answer, NoResponders)


async def test_a_jetstream_create_ack_and_wrong_last_sequence(plain_broker):
    """A KV create (publish with Nats-Expected-Last-Subject-Sequence: 0) over request_many: the
    first gets a PubAck, the second the JetStream error 10071 (the shape the issuance writes use)."""
    with trio.fail_after(CEILING_S):
        async with open_native_connection(plain_broker, reconnect=False) as conn:
            config = b'{"name":"KV_t","subjects":["$KV.t.>"],"max_msgs_per_subject":1,"storage":"memory"}'
            [created] = await conn.request_many([("$JS.API.STREAM.CREATE.KV_t", config, None)])
            assert isinstance(created, Message) and b'"error"' not in created.data
            header = {"Nats-Expected-Last-Subject-Sequence": "0"}
            first, second = await conn.request_many([("$KV.t.k", b"1", header), ("$KV.t.k", b"2", header)])
            assert isinstance(first, Message) and b'"seq":1' in first.data
            assert isinstance(second, Message) and b"10071" in second.data


async def test_publishes_queued_in_one_pass_leave_in_one_send(plain_broker, monkeypatch):
    """100 publishes with no checkpoint between them: the writer sends them with one send_all."""
    sends: list[int] = []
    original = trio.SocketStream.send_all

    async def counting(self, data):
        sends.append(len(data))
        await original(self, data)

    got: list[Message] = []
    with trio.fail_after(CEILING_S):
        async with open_native_connection(plain_broker, reconnect=False) as conn:
            await conn.subscribe("c.x", on_message=got.append)
            await conn.flush()
            monkeypatch.setattr(trio.SocketStream, "send_all", counting)
            before = conn.statistics().sends
            for i in range(100):
                conn.publish_nowait("c.x", b"%d" % i)
            await conn.flush()  # its PING is queued after them
            monkeypatch.setattr(trio.SocketStream, "send_all", original)
            assert len(sends) == 1, sends
            assert conn.statistics().sends - before == 1
            assert [m.data for m in got] == [b"%d" % i for i in range(100)]


async def test_a_restarted_broker_is_reconnected_and_the_subscription_resent(nursery, tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="cotal.natsio")
    port = free_port()
    url = f"nats://127.0.0.1:{port}"
    first = trio.CancelScope()
    await start_stoppable(nursery, tmp_path, port, first, "a")
    got: list[Message] = []
    with trio.fail_after(CEILING_S):
        async with open_native_connection(url, reconnect=True) as conn:
            await conn.subscribe("r.x", queue="q", on_message=got.append)
            await conn.flush()
            first.cancel()  # SIGTERM: the broker closes the socket
            while not any(r.getMessage() == f"nats {url}: disconnected" for r in caplog.records):
                await trio.sleep(0.05)
            await start_stoppable(nursery, tmp_path, port, trio.CancelScope(), "b")
            while conn.statistics().reconnects < 1:
                await trio.sleep(0.05)
            conn.publish_nowait("r.x", b"after")
            await conn.flush()
            assert [m.data for m in got] == [b"after"]
            assert not conn.closed.is_set()
            assert any(r.getMessage() == f"nats {url}: reconnected" for r in caplog.records)


async def test_without_reconnect_a_lost_socket_closes_for_good(nursery, tmp_path):
    async with _native_on_stoppable(nursery, tmp_path, reconnect=False) as (conn, scope, _):
        scope.cancel()
        await conn.closed.wait()
        assert conn.last_error
        with pytest.raises(Unavailable):
            await conn.flush()
        conn.publish_nowait("x", b"dropped")  # never raises on a closed connection


async def test_a_broker_gone_for_good_closes_after_the_attempts(nursery, tmp_path):
    async with _native_on_stoppable(nursery, tmp_path, reconnect=True) as (conn, scope, _):
        scope.cancel()
        await conn.closed.wait()
        assert conn.last_error and conn.last_error.startswith("no broker")


async def test_a_paused_broker_is_noticed_by_the_keepalive(nursery, tmp_path):
    async with _native_on_stoppable(nursery, tmp_path, reconnect=True) as (conn, _, pid):
        os.kill(pid, signal.SIGSTOP)
        try:
            await conn.closed.wait()
        finally:
            os.kill(pid, signal.SIGCONT)
        assert conn.last_error == f"no PING answered within {PONG_TIMEOUT_S:g} s - the broker is hung or unreachable"


async def test_on_a_cluster_the_connection_moves_to_another_node(nursery, tmp_path, caplog):
    """Seeded with n1 only: the cluster's INFO names n2 and n3; n1 SIGTERMed, the connection
    reconnects to one of them (the reconnect line names it) and its subscription works there."""
    caplog.set_level(logging.INFO, logger="cotal.natsio")
    urls, pids = await start_cluster(nursery, tmp_path, 3)
    got: list[Message] = []
    with trio.fail_after(CEILING_S):
        async with open_native_connection(urls[0], reconnect=True) as conn:
            await conn.subscribe("m.x", on_message=got.append)
            while len(conn._pool) < 3:  # the cluster's INFO names the other nodes (bounded)
                await trio.sleep(0.1)
                await conn.flush()
            assert conn.connected_url == urls[0]
            os.kill(pids[0], signal.SIGTERM)
            while conn.statistics().reconnects < 1:
                await trio.sleep(0.05)
            assert conn.connected_url in urls[1:]
            conn.publish_nowait("m.x", b"moved")
            await conn.flush()
            assert [m.data for m in got] == [b"moved"]
            assert any(r.getMessage() == f"nats {conn.connected_url}: reconnected" for r in caplog.records)


async def test_drain_delivers_what_arrived_before_the_unsub(plain_broker):
    got: list[Message] = []
    with trio.fail_after(CEILING_S):
        async with open_native_connection(plain_broker, reconnect=False) as conn:
            sub = await conn.subscribe("d.x", on_message=got.append)
            await conn.flush()
            for i in range(50):
                conn.publish_nowait("d.x", b"%d" % i)
            await sub.drain()
            assert len(got) == 50
            conn.publish_nowait("d.x", b"late")
            await conn.flush()
            assert len(got) == 50


async def test_a_reconnect_to_a_listener_that_never_speaks_ends_after_the_outage_bound(nursery, tmp_path):
    """The broker goes; something accepts on its port and sends no INFO: each reconnect's
    handshake hangs until its bound, and the connection is closed once it has had no broker for
    MAX_OUTAGE_S (as natsio's nats-py connection does: test_keepalive_live.py)."""
    async with _native_on_stoppable(nursery, tmp_path, reconnect=True) as (conn, scope, _):
        scope.cancel()
        async with silent_listener(int(conn.servers[0].rsplit(":", 1)[1])):
            await conn.closed.wait()
        assert conn.last_error == f"no broker for {MAX_OUTAGE_S:g} s (reconnecting)"


@pytest.mark.parametrize("subject, headers", [
    ("has space", None), ("", None), ("ok", {"Bad\r\nName": "v"}), ("ok", {"Name": "line\r\nbreak"}),
])  # fmt: skip
async def test_a_malformed_publish_is_a_value_error_and_sends_nothing(plain_broker, subject, headers):
    got: list[Message] = []
    with trio.fail_after(CEILING_S):
        async with open_native_connection(plain_broker, reconnect=False) as conn:
            await conn.subscribe(">", on_message=got.append)
            await conn.flush()
            with pytest.raises(ValueError):
                conn.publish_nowait(subject, b"x", headers)
            await conn.flush()
            assert got == [] and conn.last_error is None


async def test_a_flush_behind_a_full_output_bound_still_gets_its_pong(plain_broker):
    """Publishes filling the output bound to 3 bytes short, in one scheduler pass: the flush's
    PING still goes out (it is not a publish), so that flush and the next return once the broker
    has everything; a further publish is the one dropped. A dropped PING would leave its waiter
    in the PONG queue, and every later flush would take the PONG of the one before it."""
    with trio.fail_after(CEILING_S):
        async with open_native_connection(plain_broker, reconnect=False) as conn:
            await conn.flush()
            size = 1_000_000
            op_bytes = len(b"PUB f.x %d\r\n" % size) + size + 2
            count, room = divmod(MAX_PENDING_BYTES - 3, op_bytes)
            for _ in range(count):
                conn.publish_nowait("f.x", bytes(size))
            pad = next(n for n in range(room) if len(b"PUB f.x %d\r\n" % n) + n + 2 == room)
            conn.publish_nowait("f.x", bytes(pad))  # queued: MAX_PENDING_BYTES - 3 bytes
            await conn.flush()
            await conn.flush()
            assert conn.statistics().dropped == 0
            for _ in range(count + 1):
                conn.publish_nowait("f.x", bytes(size))
            await conn.flush()
            assert conn.statistics().dropped == 1
            assert not conn.closed.is_set()


async def test_a_fatal_err_names_why_the_connection_closed(operator_broker, provisioned):
    """A user JWT that expires while connected: the broker sends ``-ERR 'User Authentication
    Expired'`` and closes the socket. Without ``reconnect`` the connection is closed for good,
    and ``last_error`` names the broker's reason, not only that the socket went."""
    await _push(operator_broker, provisioned)
    now = int(time.time())
    creds = provision.mint_service_user(provisioned.space, name="svc", permissions=APP, iat=now, exp=now + 2)
    with trio.fail_after(CEILING_S):
        async with open_native_connection(operator_broker, creds=creds, reconnect=False) as conn:
            await conn.closed.wait()
            assert conn.last_error is not None and "User Authentication Expired" in conn.last_error, conn.last_error


async def test_a_request_waiting_when_the_connection_closes_gets_unavailable(nursery, tmp_path):
    """A request whose responder never answers, the broker gone meanwhile, no ``reconnect``: the
    waiting request ends with Unavailable naming the close (not a wait for the 10 s cap)."""
    async with _native_on_stoppable(nursery, tmp_path, reconnect=False) as (conn, scope, _):
        await conn.subscribe("silent.x", on_message=lambda msg: None)
        await conn.flush()
        async with conn.requests_sent([("silent.x", b"?", None)]) as replies:
            await conn.flush()  # the request is on the broker
            scope.cancel()
            [answer] = await replies()
        assert isinstance(answer, Unavailable)
        assert str(answer) == "request silent.x: the connection closed"
        assert conn.closed.is_set()
