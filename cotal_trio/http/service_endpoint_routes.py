"""The service-endpoint doors of the public face (spec "Listener policy"; docs/http-api.md
"Service endpoints"; the decisions are :mod:`cotal_trio.core.service_endpoints`).

Served only by a space whose full auth service runs with ``--service-endpoints`` (or whose
manifest entry sets ``serviceEndpoints``); otherwise both paths stay 404, as every path outside
the public face's closed table. Like ``/manager-service-authority`` and ``/manager-instances``
beside them, each takes the caller's credential in its JSON body (never the loopback
capability: on the public face the credential is the proof), answers ``Cache-Control:
no-store``, and counts every refusal against the face's refused-request budget, 429 once full:

=================================  ===========================================================
``POST /service-endpoint-authority``  ``{idpToken, request}`` (a person only, for one of their
                                   actors, interactive or managed): ``request`` is
                                   ``{kind: "register", actor, endpoint, label?}`` ->
                                   ``{endpoint, instanceId, owner, actor, serveEpoch,
                                   registeredAt, label}``, or ``{kind: "retire", actor,
                                   endpoint, instanceId}`` -> ``{retired: true, endpoint,
                                   instanceId}``
``POST /service-endpoint-host``    the credential (``{idpToken, actor}`` or ``{owner, actor,
                                   actorToken}``) ``+ endpoint, instanceId[, ttlSec]`` ->
                                   ``{token, owner, exp, endpoint, instanceId}``: a
                                   ``service-host`` bearer for that registration
=================================  ===========================================================

Both need scope ``service-endpoint`` on the host principal's ledger row (403 otherwise). The host
actor's row may be interactive (the person hosts with their IdP token) or managed (their agent
hosts with its actor token, renewing its bearer without a person).
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping

from cotal_trio.core.errors import CodecError, RefusalCode, Refused
from cotal_trio.core.ledger import LedgerRow
from cotal_trio.core.identity import LIFECYCLE_UID_RANDOM_BYTES, is_lifecycle_uid, mint_lifecycle_uid
from cotal_trio.core.service_endpoints import (
    SERVICE_ENDPOINT_SCOPE,
    AuthorityRequest,
    check_endpoint_name,
    decide_registration,
    decide_retirement,
    decide_service_host,
    parse_authority_body,
)
from cotal_trio.core.views import SERVICE_HOST, ServiceEndpointBinding
from cotal_trio.http.faces import ExchangeContext, ViewGrant, authenticate, mint_for
from cotal_trio.http.mesh_routes import Response, Route, _records, _split

__all__ = ["SERVICE_AUTHORITY_PATH", "SERVICE_ENDPOINT_PATHS", "SERVICE_HOST_PATH", "SERVICE_ENDPOINT_ROUTES"]

SERVICE_AUTHORITY_PATH = "/service-endpoint-authority"
SERVICE_HOST_PATH = "/service-endpoint-host"
SERVICE_ENDPOINT_PATHS = (SERVICE_AUTHORITY_PATH, SERVICE_HOST_PATH)
INSTANCE_RULE = "instanceId must be the id POST /service-endpoint-authority answered ([a-z0-9]{26,32})"
_NO_STORE = {"Cache-Control": "no-store"}


async def _host_row(ctx: ExchangeContext, request: AuthorityRequest, now: float) -> LedgerRow:
    """Trio: the person's fresh row of the host actor, interactive (a person hosts) or managed
    (their agent hosts): the IdP token first, before any ledger read, then the rows in a worker
    thread (:meth:`~cotal_trio.http.faces.ExchangeContext.blocking`).

    Raises:
        Refused: BAD_REQUEST for a bad actor; BAD_CREDENTIAL for the IdP token; NOT_GRANTED when
            the owner has no row of the actor (or a corrupt one, named).
        Unavailable: the ledger did not answer within ``faces.LEDGER_READ_S`` (503).
    """
    proven = ctx.bridge.verify(request.idp_token, request.actor, now=now)
    try:
        interactive, managed = await ctx.blocking(ctx.read_ledger, proven.owner, proven.actor)
    except CodecError as corrupt:
        raise Refused(RefusalCode.NOT_GRANTED, str(corrupt)) from None
    row = interactive if interactive is not None else managed
    if row is None:
        raise Refused(
            RefusalCode.NOT_GRANTED,
            f"actor {proven.actor} has no ledger row of owner {proven.owner} - the operator grants it with "
            f"`cotal actor grant {proven.actor} --owner {proven.owner} --scope {SERVICE_ENDPOINT_SCOPE}`",
        )
    return row


async def _authority(ctx: ExchangeContext, body: object, now: float) -> Response:
    """``POST /service-endpoint-authority``: register or retire one endpoint name (module docstring)."""
    request = parse_authority_body(body)
    row = await _host_row(ctx, request, now)
    records = _records(ctx)
    found = await records.get_service_endpoint(request.endpoint)
    existing, revision = found if found is not None else (None, None)
    owner, actor, scope = row.owner, row.actor, row.scope
    if request.kind == "register":
        uid = mint_lifecycle_uid(secrets.token_bytes(LIFECYCLE_UID_RANDOM_BYTES))
        record = decide_registration(owner, actor, scope, request, existing, instance_id=uid, now=int(now))
        await records.register_service_endpoint(record, last_revision=revision)
        return record.answer(), 200, dict(_NO_STORE)
    retired = decide_retirement(owner, actor, scope, request, existing)
    assert revision is not None  # decide_retirement refused a missing registration
    await records.retire_service_endpoint(retired.endpoint, last_revision=revision)
    return {"retired": True, "endpoint": retired.endpoint, "instanceId": retired.instance_id}, 200, dict(_NO_STORE)


async def _host(ctx: ExchangeContext, body: object, now: float) -> Response:
    """``POST /service-endpoint-host``: a ``service-host`` bearer for one live registration."""
    parsed, own = _split(body, SERVICE_HOST_PATH, {"endpoint": True, "instanceId": True}, ttl=True)
    endpoint = check_endpoint_name(own["endpoint"])
    if not is_lifecycle_uid(own["instanceId"]):
        raise Refused(RefusalCode.BAD_REQUEST, INSTANCE_RULE)
    binding = ServiceEndpointBinding(endpoint=endpoint, instance_id=own["instanceId"])
    caller = await authenticate(ctx, parsed, now=now)
    found = await _records(ctx).get_service_endpoint(endpoint)
    decide_service_host(caller.owner, caller.row.actor, caller.row.scope, binding, None if found is None else found[0])
    minted = mint_for(
        ctx, caller, ttl_s=parsed.ttl_s, view=ViewGrant(view=SERVICE_HOST, service_endpoint=binding),
        extra={"endpoint": endpoint, "instanceId": binding.instance_id},
    )  # fmt: skip
    return minted.body(), 200, dict(_NO_STORE)


SERVICE_ENDPOINT_ROUTES: Mapping[str, Route] = {SERVICE_AUTHORITY_PATH: _authority, SERVICE_HOST_PATH: _host}
"""The doors' answers by path, for :func:`~cotal_trio.http.mesh_routes.answer_mesh_route`'s ``routes``."""
