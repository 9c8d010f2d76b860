"""The manager doors over real HTTP with the real RecordsStore on a real nats-server.

verify-enrollment reads a manager instance that ``RecordsStore.register_manager`` wrote (200),
and answers 412 for one never registered and for one retired; the consent door records
``consent.<jti>`` create-only in ``cotal_records_<space>`` with a 360 s per-message TTL, and a
replayed id is not recorded again. The ledger is an in-memory dict (the ledger files are tested
elsewhere); the doors' app is served by hypercorn on 127.0.0.1 (``serve_app``).
"""

from __future__ import annotations

import functools
import json
import os
import time
from collections.abc import AsyncIterator

import pytest
import trio
from quart import request
from quart_trio import QuartTrio

from cotal_trio.core.identity import mint_lifecycle_uid
from cotal_trio.core.idp import parse_jwks
from cotal_trio.core.jose import BearerKeySet, JwsWording, verify_ed25519_jws
from cotal_trio.core.ledger import LedgerKind
from cotal_trio.core.managers import ManagerInstance
from cotal_trio.devidp import jwks, mint_dev_token
from cotal_trio.http.errors import install_edge
from cotal_trio.http.transport import check_transport, read_json_body
from cotal_trio.http.manager_doors import CONSENT_PATH, VERIFY_ENROLLMENT_PATH, ManagerDoors, routes
from cotal_trio.http.serve import serve_app
from cotal_trio.stores.records import RecordsStore, ensure_records_stores, records_bucket
from cotal_trio.natsio import open_connection, open_loop
from tests.support.loopback import DEV_IDP, ISSUER_KEY, OWNER, OWNER_SECRET, SPACE, SUB, _row
from tests.support.stack import post_answer
from tests.support.records import ttl_header

pytestmark = [pytest.mark.broker, pytest.mark.filterwarnings("error::ResourceWarning")]

CEILING_S = 30
SHA = "cd" * 32
RANDOM = bytes(range(200, 216))


def _read_ledger(owner: str, actor: str):
    rows = {
        "mgr": _row(LedgerKind.INTERACTIVE, "mgr", scope=("supervise",)),
        "cli": _row(LedgerKind.INTERACTIVE, "cli"),
    }
    row = rows.get(actor) if owner == OWNER else None
    return row, None


def _app(ctx: ManagerDoors) -> QuartTrio:
    async def guard() -> object:
        check_transport(request.headers)
        return await read_json_body()

    app = QuartTrio("tests.manager_doors_live")
    install_edge(app, routes=routes(ctx, guard=guard), unknown_path="unknown path")
    return app


class Doors:
    def __init__(self, url: str, store: RecordsStore, conn) -> None:
        self.url, self.store, self.conn = url, store, conn

    async def post(self, path: str, body: dict) -> tuple[int, dict]:
        status, answer, _ = await trio.to_thread.run_sync(post_answer, self.url + path, "unused", body)
        return status, answer


@pytest.fixture
async def doors(nursery: trio.Nursery, plain_broker: str) -> AsyncIterator[Doors]:
    async with open_loop(), open_connection(plain_broker, name="manager-doors") as conn:
        with trio.fail_after(CEILING_S):
            await ensure_records_stores(conn, SPACE)
        store = RecordsStore(conn, SPACE)
        ctx = ManagerDoors(
            space=SPACE, read_ledger=_read_ledger, records=store, issuer_key=ISSUER_KEY, idp_pin=DEV_IDP.pin(),
            idp_keys=lambda: parse_jwks(jwks(DEV_IDP)), owner_secret=OWNER_SECRET, clock=time.time,
            tool_result_consent=True, random_bytes=lambda n: RANDOM[:n],
        )  # fmt: skip
        with trio.fail_after(CEILING_S):
            port = await nursery.start(functools.partial(serve_app, _app(ctx)))
        yield Doors(f"http://127.0.0.1:{port}", store, conn)


def _enroll(instance_id: str, serve_epoch: int = 1) -> dict:
    request = {"kind": "enroll", "actor": "mgr", "instanceId": instance_id, "serveEpoch": serve_epoch, "agent": "worker"}
    return {"owner": OWNER, "request": request}


async def test_verify_enrollment_reads_the_registered_instance(doors: Doors):
    with trio.fail_after(CEILING_S):
        registered = ManagerInstance(
            instance_id=mint_lifecycle_uid(os.urandom(20)), owner=OWNER, actor="mgr", serve_epoch=1,
            registered_at=int(time.time()),
        )  # fmt: skip
        await doors.store.register_manager(registered)
        status, body = await doors.post(VERIFY_ENROLLMENT_PATH, _enroll(registered.instance_id))
        assert (status, body) == (200, {"authorized": True, "owner": OWNER, "actor": "mgr",
                                        "instanceId": registered.instance_id, "serveEpoch": 1})  # fmt: skip

        never = mint_lifecycle_uid(os.urandom(20))
        status, body = await doors.post(VERIFY_ENROLLMENT_PATH, _enroll(never))
        assert (status, body) == (412, {"error": f"manager instance {never} is not registered for owner {OWNER} - "
                                                 "register it first: cotal manager register"})  # fmt: skip

        assert await doors.store.retire_manager(OWNER, registered.instance_id) is True
        status, body = await doors.post(VERIFY_ENROLLMENT_PATH, _enroll(registered.instance_id))
        assert status == 412 and body["error"].endswith("register it first: cotal manager register")


async def test_a_consent_is_recorded_once_with_its_ttl(doors: Doors):
    with trio.fail_after(CEILING_S):
        token = mint_dev_token(DEV_IDP, sub=SUB, now=int(time.time()), ttl_s=600)
        consent = {"idpToken": token, "subject": SUB, "actor": "cli", "toolCallId": "call_7", "resultSha256": SHA}
        status, body = await doors.post(CONSENT_PATH, consent)
        assert status == 200, body
        consent_id = body["consentId"]
        assert consent_id == "yMnKy8zNzs_Q0dLT1NXW1w" and len(consent_id) == 22
        claims = verify_ed25519_jws(body["consent"], BearerKeySet.from_keys([ISSUER_KEY]),
                                    wording=JwsWording(what="consent", fix="-", unknown_key="{kid}"))  # fmt: skip
        assert (claims["jti"], claims["sub"], claims["exp"] - claims["iat"]) == (consent_id, OWNER, 300)

        stored = json.loads(await doors.store.get_record(f"consent.{consent_id}"))
        assert stored == {"ver": 1, "consentId": consent_id, "owner": OWNER, "actor": "cli", "toolCallId": "call_7",
                          "resultSha256": SHA, "iat": claims["iat"], "exp": claims["exp"]}  # fmt: skip
        assert await ttl_header(doors.conn, records_bucket(SPACE), f"consent.{consent_id}") == 360

        status, body = await doors.post(CONSENT_PATH, consent)  # the same id drawn again
        assert (status, body) == (409, {"error": "this consent id is already recorded, so it is not issued twice - "
                                                 "request a fresh consent"})  # fmt: skip
        assert json.loads(await doors.store.get_record(f"consent.{consent_id}")) == stored
