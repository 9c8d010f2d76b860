"""The service-endpoint doors of the public face (http/service_endpoint_routes.py; spec "Listener
policy"; docs/http-api.md "Service endpoints"): served only with ``service_endpoints``, both arms
at the host door, the bearer they mint, and their refusals in the face's peer bucket.

Driven through quart's test client with the real core objects of ``tests/support/loopback.py``
and an in-memory registration store with the semantics of ``stores.records.RecordsStore``.
"""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import trio

from cotal_trio.core.errors import RefusalCode, Refused
from cotal_trio.core.ledger import LedgerKind, hash_actor_token
from cotal_trio.core.service_endpoints import ServiceEndpointRecord
from cotal_trio.core.views import ServiceEndpointBinding
from tests.support.loopback import AGENT_SECRET, NOW, OWNER, _context, _row, ceiling
from tests.support.public_face import JSON_ONLY, _app
from tests.support.views_exchange import FakeRecords, decode, human

PEER = "198.51.100.20"
TOO_MANY = {"error": "too many refused exchanges - wait a minute and retry"}


class Registrations(FakeRecords):
    """FakeRecords plus ``svcep.<endpoint>`` rows, create-only or compare-and-set on a revision."""

    def __init__(self) -> None:
        super().__init__()
        self.endpoints: dict[str, tuple[ServiceEndpointRecord, int]] = {}

    async def get_service_endpoint(self, endpoint: str):
        await trio.lowlevel.checkpoint()
        return self.endpoints.get(endpoint)

    async def register_service_endpoint(self, record: ServiceEndpointRecord, *, last_revision: int | None) -> int:
        await trio.lowlevel.checkpoint()
        stored = self.endpoints.get(record.endpoint)
        if (None if stored is None else stored[1]) != last_revision:
            raise Refused(RefusalCode.CONFLICT, "changed meanwhile")
        self.endpoints[record.endpoint] = (record, revision := self._next())
        return revision

    async def retire_service_endpoint(self, endpoint: str, *, last_revision: int) -> None:
        await trio.lowlevel.checkpoint()
        stored = self.endpoints.get(endpoint)
        if stored is None or stored[1] != last_revision:
            raise Refused(RefusalCode.CONFLICT, "changed meanwhile")
        del self.endpoints[endpoint]


def _rows():
    rows = [
        _row(LedgerKind.INTERACTIVE, "svc", scope=("service-endpoint",), parent=None),
        _row(LedgerKind.INTERACTIVE, "plain", scope=("spawn",), parent=None),
        _row(LedgerKind.MANAGED, "svcagent", scope=("service-endpoint",), parent=f"{OWNER}.svc",
             token_hash=hash_actor_token(AGENT_SECRET)),
    ]  # fmt: skip
    return {(row.kind, row.owner, row.actor): row for row in rows}


def _client(records: Registrations, *, served: bool = True):
    ctx = replace(_context(_rows()), records=records)
    return _app(ctx, service_endpoints=served).test_client()


async def _post(client, path: str, body) -> tuple[int, dict]:
    response = await client.post(path, data=json.dumps(body).encode(), headers=JSON_ONLY, scope_base={"client": (PEER, 40000)})
    return response.status_code, await response.get_json()


def _register(actor: str = "svc", endpoint: str = "search") -> dict:
    return {"idpToken": human()["idpToken"], "request": {"kind": "register", "actor": actor, "endpoint": endpoint}}


@ceiling
@pytest.mark.parametrize("path", ["/service-endpoint-authority", "/service-endpoint-host"])
async def test_without_service_endpoints_the_doors_are_404(path):
    status, body = await _post(_client(Registrations(), served=False), path, _register())
    assert status == 404 and "/service-endpoint" not in body["error"]


@ceiling
@pytest.mark.parametrize("arm", ["human", "agent"])
async def test_a_registered_endpoint_gets_a_service_host_bearer_on_either_arm(arm):
    records = Registrations()
    client = _client(records)
    status, registration = await _post(client, "/service-endpoint-authority", _register("svc", "search"))
    assert status == 200 and registration["serveEpoch"] == 1 and registration["owner"] == OWNER
    instance = registration["instanceId"]
    assert records.endpoints["search"][0].answer() == registration
    endpoint, credential = "search", human("svc")
    if arm == "agent":  # a managed agent hosts a registration its person made for it
        status, registration = await _post(client, "/service-endpoint-authority", _register("svcagent", "agents"))
        assert status == 200 and registration["actor"] == "svcagent" and registration["serveEpoch"] == 1
        endpoint, instance = "agents", registration["instanceId"]
        credential = {"owner": OWNER, "actor": "svcagent", "actorToken": AGENT_SECRET}
    status, minted = await _post(client, "/service-endpoint-host", {**credential, "endpoint": endpoint, "instanceId": instance})
    assert status == 200, minted
    assert (minted["endpoint"], minted["instanceId"], minted["owner"]) == (endpoint, instance, OWNER)
    bearer, act = decode(minted["token"])
    assert bearer.view == "service-host"
    assert bearer.service_endpoint == ServiceEndpointBinding(endpoint=endpoint, instance_id=instance)
    assert act["serviceEndpoint"] == {"endpoint": endpoint, "instanceId": instance}
    assert minted["exp"] - NOW <= (900 if arm == "human" else 300)


@ceiling
async def test_a_host_bearer_for_someone_elses_registration_is_404_and_a_plain_actor_is_403():
    records = Registrations()
    client = _client(records)
    _status, registration = await _post(client, "/service-endpoint-authority", _register())
    body = {"endpoint": "search", "instanceId": registration["instanceId"]}
    status, answer = await _post(client, "/service-endpoint-host", {**human("plain"), **body})
    assert status == 403 and "lacks scope service-endpoint" in answer["error"]
    agent = {"owner": OWNER, "actor": "svcagent", "actorToken": AGENT_SECRET}
    status, answer = await _post(client, "/service-endpoint-host", {**agent, **body})
    assert status == 404 and "is not registered to svcagent" in answer["error"]
    status, answer = await _post(client, "/service-endpoint-host", {**human("svc"), **body, "view": "admin"})
    assert status == 400 and "takes no view" in answer["error"]


AUTHORITY_BODY = {"error": "service-endpoint authority needs { idpToken, request } and nothing else"}
AUTHORITY_REQUEST = {
    "error": 'request must be {"kind": "register", "actor": "<host actor>", "endpoint": "<name>", "label"?: "<text>"} '
    'or {"kind": "retire", "actor": "<host actor>", "endpoint": "<name>", "instanceId": "<id>"}'
}
ENDPOINT_RULE = {"error": "endpoint must be 1 to 64 characters of A-Z a-z 0-9 _ - and not v1 (the issued rail's name)"}
INSTANCE_RULE = {"error": "instanceId must be the id the registration answered ([a-z0-9]{26,32})"}
LABEL_RULE = {"error": "label must be printable text of at most 128 characters"}
ID = "1" * 26


@pytest.mark.parametrize(
    ("body", "answer"),
    [
        ([], AUTHORITY_BODY),
        ({"idpToken": "x"}, AUTHORITY_BODY),
        ({"idpToken": "x", "request": {}, "actor": "svc"}, AUTHORITY_BODY),
        ({"idpToken": 7, "request": {}}, AUTHORITY_BODY),
        ({"idpToken": "x", "request": []}, AUTHORITY_REQUEST),
        ({"idpToken": "x", "request": {"kind": "list", "actor": "svc", "endpoint": "e"}}, AUTHORITY_REQUEST),
        ({"idpToken": "x", "request": {"kind": ["register"], "actor": "svc", "endpoint": "e"}}, AUTHORITY_REQUEST),
        ({"idpToken": "x", "request": {"kind": "register", "endpoint": "e"}}, AUTHORITY_REQUEST),
        ({"idpToken": "x", "request": {"kind": "register", "actor": 7, "endpoint": "e"}}, AUTHORITY_REQUEST),
        ({"idpToken": "x", "request": {"kind": "register", "actor": "svc"}}, AUTHORITY_REQUEST),
        ({"idpToken": "x", "request": {"kind": "register", "actor": "svc", "endpoint": "e", "instanceId": ID}},
         AUTHORITY_REQUEST),
        # unlike the manager door's, a retire without its instanceId breaks the shape
        ({"idpToken": "x", "request": {"kind": "retire", "actor": "svc", "endpoint": "e"}}, AUTHORITY_REQUEST),
        ({"idpToken": "x", "request": {"kind": "retire", "actor": "svc", "instanceId": ID}}, AUTHORITY_REQUEST),
        ({"idpToken": "x", "request": {"kind": "retire", "actor": "svc", "endpoint": "e", "instanceId": ID,
                                       "label": "x"}}, AUTHORITY_REQUEST),
        ({"idpToken": "x", "request": {"kind": "register", "actor": "svc", "endpoint": "v1"}}, ENDPOINT_RULE),
        ({"idpToken": "x", "request": {"kind": "register", "actor": "svc", "endpoint": 7}}, ENDPOINT_RULE),
        # the endpoint is checked before the instanceId
        ({"idpToken": "x", "request": {"kind": "retire", "actor": "svc", "endpoint": "a.b", "instanceId": "NOPE"}},
         ENDPOINT_RULE),
        ({"idpToken": "x", "request": {"kind": "retire", "actor": "svc", "endpoint": "e", "instanceId": "NOPE"}},
         INSTANCE_RULE),
        ({"idpToken": "x", "request": {"kind": "retire", "actor": "svc", "endpoint": "e", "instanceId": 7}},
         INSTANCE_RULE),
        ({"idpToken": "x", "request": {"kind": "register", "actor": "svc", "endpoint": "e", "label": "a\nb"}},
         LABEL_RULE),
        ({"idpToken": "x", "request": {"kind": "register", "actor": "svc", "endpoint": "e", "label": "x" * 129}},
         LABEL_RULE),
        ({"idpToken": "x", "request": {"kind": "register", "actor": "svc", "endpoint": "e", "label": 7}}, LABEL_RULE),
    ],
)  # fmt: skip
@ceiling
async def test_bad_authority_bodies_are_400_with_the_first_rule_they_break(body, answer):
    records = Registrations()
    assert await _post(_client(records), "/service-endpoint-authority", body) == (400, answer)
    assert records.endpoints == {}


@ceiling
async def test_door_refusals_spend_the_peer_bucket_shared_with_exchange():
    client = _client(Registrations())
    for _ in range(30):
        status, _body = await _post(client, "/service-endpoint-authority", [])
        assert status == 400
    assert await _post(client, "/service-endpoint-host", {}) == (429, TOO_MANY)
    assert await _post(client, "/exchange", {"idpToken": "x", "actor": "svc"}) == (429, TOO_MANY)
    status, _body = await _post(client, "/service-endpoint-authority", _register())  # a valid credential still answers
    assert status == 200
