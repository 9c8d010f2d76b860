"""The credential routes beside ``POST /exchange`` (spec "Listener policy"; upstream-notes 3.6, 4.2).

Every route here takes the caller's credential in its JSON body, exactly as ``/exchange`` does
(human ``{idpToken, actor}``, agent ``{owner, actor, actorToken}``; :func:`faces.authenticate`),
plus its own fields, and answers JSON:

=================================  ===========================================================
``POST /manager-instances``        ``{owner, instances: [{instanceId, actor, serveEpoch,
                                   registeredAt, label}]}``: the caller's owner's live managers
``POST /chat-session/open``        ``+ endpoint`` -> ``{sessionId, endpoint, epoch, exp}``: a
                                   session row in ``cotal_sessions_<space>``, 1 hour
``POST /chat-session/bearer``      ``+ sessionId[, ttlSec]`` -> ``{token, owner, exp, sessionId}``:
                                   a ``session-caller`` bearer bound to that one session, ending
                                   by the session's ``exp``
``POST /chat-session/retire``      ``+ sessionId`` -> ``{retired: true, sessionId}``
``POST /manager-service-authority``  ``{idpToken, request}`` (human only): ``request`` is
                                   ``{kind: "register", actor, label?}`` -> ``{instanceId, owner,
                                   actor, serveEpoch, registeredAt}`` or ``{kind: "retire", actor,
                                   instanceId}`` -> ``{retired: true, instanceId}``; the actor's
                                   ledger row must carry scope ``supervise`` (403 otherwise)
=================================  ===========================================================

A session belongs to the person (human credential) that opened it: only that principal takes the
session's bearer or retires it; a managed agent's credential is refused on the three session
routes (400), since its secret mints no view but ``manager-caller``. Every refusal counts against the face's refused-request budget, the one
``/exchange`` spends (spec "Proxy attribution": a refusal at ``/manager-service-authority``
counts against the same budget), and becomes 429 once it is full; a valid credential still
gets its answer.
"""

from __future__ import annotations

import secrets
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from cotal_trio.core.errors import CodecError, RateLimited, RefusalCode, Refused
from cotal_trio.core.exchange import AgentExchange, HumanExchange, parse_exchange_body
from cotal_trio.core.identity import LIFECYCLE_UID_RANDOM_BYTES, mint_lifecycle_uid
from cotal_trio.core.managers import ManagerInstance, parse_manager_authority_body
from cotal_trio.core.sessions import (
    SESSION_ID_RANDOM_BYTES,
    check_session_for,
    is_endpoint,
    is_session_id,
    new_chat_session,
    new_session_id,
)
from cotal_trio.core.views import SessionBinding
from cotal_trio.http.errors import LOGGER
from cotal_trio.http.faces import (
    NO_MANAGER_REGISTRY,
    SESSION_CALLER,
    TOO_MANY_REFUSALS,
    Caller,
    ExchangeContext,
    RecordsPort,
    ViewGrant,
    authenticate,
    mint_for,
)

__all__ = [
    "CHAT_SESSION_BEARER_PATH",
    "CHAT_SESSION_OPEN_PATH",
    "CHAT_SESSION_RETIRE_PATH",
    "MANAGER_AUTHORITY_PATH",
    "MANAGER_INSTANCES_PATH",
    "MESH_PATHS",
    "answer_mesh_route",
]

MANAGER_INSTANCES_PATH = "/manager-instances"
CHAT_SESSION_OPEN_PATH = "/chat-session/open"
CHAT_SESSION_BEARER_PATH = "/chat-session/bearer"
CHAT_SESSION_RETIRE_PATH = "/chat-session/retire"
MANAGER_AUTHORITY_PATH = "/manager-service-authority"
MESH_PATHS = (
    MANAGER_INSTANCES_PATH, CHAT_SESSION_OPEN_PATH, CHAT_SESSION_BEARER_PATH, CHAT_SESSION_RETIRE_PATH,
    MANAGER_AUTHORITY_PATH,
)  # fmt: skip
SUPERVISE = "supervise"
AGENT_NO_SESSION = (
    "chat sessions are opened with a person's IdP sign-in (idpToken and actor) - a managed agent's "
    "actor token mints only the manager-caller view"
)
SESSION_NOT_YOURS = "no open chat session {id} of yours - open one with POST /chat-session/open"

Response = tuple[dict[str, Any], int, dict[str, str]]
# The credential members of either arm (the exchange parser then decides which arm).
_CREDENTIAL_KEYS = frozenset({"idpToken", "actor", "owner", "actorToken"})
_NO_STORE = {"Cache-Control": "no-store"}


def _bad(sentence: str) -> Refused:
    return Refused(RefusalCode.BAD_REQUEST, sentence)


def _split(
    body: object, path: str, fields: Mapping[str, bool], *, ttl: bool = False, human_only: bool = False
) -> tuple[HumanExchange | AgentExchange, dict[str, Any]]:
    """The credential part of ``body`` (parsed as an exchange body) and the route's own fields.

    Args:
        fields: ``{name: required}`` of the route's own members.
        ttl: whether the route takes ``ttlSec`` (only the bearer route does).
        human_only: refuse the agent arm (the chat-session routes: spec "Listener policy", a
            managed agent's secret mints no view but ``manager-caller``).

    Raises:
        Refused: BAD_REQUEST for a body that is not an object, a missing field, a credential the
            exchange parser refuses, a ``view``, a ``ttlSec`` where none is taken, or an agent
            credential on a ``human_only`` route.
    """
    if not isinstance(body, dict):
        own_fields = f" and {', '.join(fields)}" if fields else ""
        raise _bad(f"{path} takes a JSON object: the credential (idpToken and actor, or owner, actor and actorToken){own_fields}")
    own = {name: body[name] for name in fields if name in body}
    missing = [name for name, required in fields.items() if required and name not in own]
    if missing:
        raise _bad(f"{path} needs {', '.join(missing)} beside the credential")
    credential = {key: value for key, value in body.items() if key not in fields}
    viewish = sorted(key for key in ("view", "managerInstanceId", "transferWriter") if key in credential)
    if viewish:
        raise _bad(f"{path} takes no {', '.join(viewish)} - the route decides what it answers; drop them")
    own_names = [*fields, *(["ttlSec"] if ttl else [])]
    unknown = sorted(str(key) for key in credential if key not in _CREDENTIAL_KEYS | {"ttlSec"})
    if unknown:
        takes = ", ".join(["the credential", *own_names]) if own_names else "the credential"
        takes = takes.replace("the credential, ", "the credential and ", 1)
        raise _bad(f"{path} takes {takes}, not {', '.join(unknown)[:200]}")
    parsed = parse_exchange_body(credential)
    if parsed.ttl_s is not None and not ttl:
        raise _bad(f"{path} takes no ttlSec")
    if human_only and isinstance(parsed, AgentExchange):
        raise _bad(AGENT_NO_SESSION)
    return parsed, own


def _records(ctx: ExchangeContext) -> RecordsPort:
    if ctx.records is None:
        raise Refused(RefusalCode.NOT_GRANTED, NO_MANAGER_REGISTRY)
    return ctx.records


async def _manager_instances(ctx: ExchangeContext, body: object, now: float) -> Response:
    parsed, _own = _split(body, MANAGER_INSTANCES_PATH, {})
    caller = await authenticate(ctx, parsed, now=now)
    instances = await _records(ctx).list_managers(caller.owner)
    listed = [
        {"instanceId": i.instance_id, "actor": i.actor, "serveEpoch": i.serve_epoch, "registeredAt": i.registered_at, "label": i.label}
        for i in sorted(instances, key=lambda i: (i.registered_at, i.instance_id))
        if i.owner == caller.owner
    ]
    return {"owner": caller.owner, "instances": listed}, 200, _NO_STORE


def _endpoint(value: object) -> str:
    if not is_endpoint(value):
        raise _bad("endpoint must be 1 to 64 characters of A-Z a-z 0-9 _ -")
    return value  # type: ignore[return-value]


def _session_id(value: object) -> str:
    if not is_session_id(value):
        raise _bad("sessionId must be the id /chat-session/open answered (22 to 128 characters of A-Z a-z 0-9 _ -)")
    return value  # type: ignore[return-value]


async def _open_session(ctx: ExchangeContext, body: object, now: float) -> Response:
    parsed, own = _split(body, CHAT_SESSION_OPEN_PATH, {"endpoint": True}, human_only=True)
    endpoint = _endpoint(own["endpoint"])
    caller = await authenticate(ctx, parsed, now=now)
    row = new_chat_session(
        session_id=new_session_id(secrets.token_bytes(SESSION_ID_RANDOM_BYTES)), endpoint=endpoint,
        owner=caller.owner, actor=caller.row.actor, epoch=1, now=int(now),
    )  # fmt: skip
    await _records(ctx).open_session(row, now=now)
    return {"sessionId": row.session_id, "endpoint": row.endpoint, "epoch": row.epoch, "exp": row.exp}, 200, _NO_STORE


async def _callers_session(ctx: ExchangeContext, caller: Caller, session_id: str, now: float, *, live: bool):
    row = await _records(ctx).get_session(session_id)
    if row is None or (row.owner, row.actor) != (caller.owner, caller.row.actor):
        raise Refused(RefusalCode.NOT_GRANTED, SESSION_NOT_YOURS.format(id=session_id))
    return check_session_for(row, owner=caller.owner, actor=caller.row.actor, now=now) if live else row


async def _session_bearer(ctx: ExchangeContext, body: object, now: float) -> Response:
    parsed, own = _split(body, CHAT_SESSION_BEARER_PATH, {"sessionId": True}, ttl=True, human_only=True)
    session_id = _session_id(own["sessionId"])
    caller = await authenticate(ctx, parsed, now=now)
    row = await _callers_session(ctx, caller, session_id, now, live=True)
    binding = SessionBinding(endpoint=row.endpoint, session_id=row.session_id, epoch=row.epoch, exp=row.exp)
    minted = mint_for(
        ctx, caller, ttl_s=parsed.ttl_s, view=ViewGrant(view=SESSION_CALLER, session=binding),
        extra={"sessionId": row.session_id},
    )  # fmt: skip
    return minted.body(), 200, _NO_STORE


async def _retire_session(ctx: ExchangeContext, body: object, now: float) -> Response:
    parsed, own = _split(body, CHAT_SESSION_RETIRE_PATH, {"sessionId": True}, human_only=True)
    session_id = _session_id(own["sessionId"])
    caller = await authenticate(ctx, parsed, now=now)
    await _callers_session(ctx, caller, session_id, now, live=False)
    await _records(ctx).retire_session(session_id)
    return {"retired": True, "sessionId": session_id}, 200, _NO_STORE


async def _manager_authority(ctx: ExchangeContext, body: object, now: float) -> Response:
    request = parse_manager_authority_body(body)
    caller = await authenticate(ctx, HumanExchange(id_token=request.idp_token, actor=request.actor), now=now)
    actor = caller.row.actor
    if SUPERVISE not in caller.row.scope:
        raise Refused(
            RefusalCode.FORBIDDEN,
            f"actor {actor} may not serve as a manager: its ledger row lacks scope supervise - the operator "
            f"grants it with `cotal actor grant {actor} --owner {caller.owner} --scope supervise`",
        )
    records = _records(ctx)
    if request.kind == "register":
        instance = ManagerInstance(
            instance_id=mint_lifecycle_uid(secrets.token_bytes(LIFECYCLE_UID_RANDOM_BYTES)), owner=caller.owner,
            actor=actor, serve_epoch=1, registered_at=int(now), label=request.label,
        )  # fmt: skip
        await records.register_manager(instance)
        answer = {
            "instanceId": instance.instance_id, "owner": instance.owner, "actor": actor,
            "serveEpoch": instance.serve_epoch, "registeredAt": instance.registered_at,
        }  # fmt: skip
        return answer, 200, _NO_STORE
    instance_id = request.instance_id
    assert instance_id is not None  # parse_manager_authority_body checked it for retire
    found = await records.get_manager(caller.owner, instance_id)
    if found is None or found.actor != actor:
        raise Refused(
            RefusalCode.NOT_FOUND,
            f"manager instance {instance_id} is not registered to {actor} of owner {caller.owner} - see `cotal manager list`",
        )
    await records.retire_manager(caller.owner, instance_id)
    return {"retired": True, "instanceId": instance_id}, 200, _NO_STORE


_ROUTES = {
    MANAGER_INSTANCES_PATH: _manager_instances,
    CHAT_SESSION_OPEN_PATH: _open_session,
    CHAT_SESSION_BEARER_PATH: _session_bearer,
    CHAT_SESSION_RETIRE_PATH: _retire_session,
    MANAGER_AUTHORITY_PATH: _manager_authority,
}


Route = Callable[[ExchangeContext, object, float], Awaitable[Response]]


async def answer_mesh_route(
    ctx: ExchangeContext, path: str, body: object, *, admit_refusal: Callable[[float], bool], peer: str | None = None,
    routes: Mapping[str, Route] | None = None,
) -> Response:
    """Trio: answer one credential route of :data:`MESH_PATHS` (module docstring for each).

    Reads ``ctx.clock()`` once for the decision (the bearer route reads it again at signing).

    Args:
        ctx: the face's ports; ``ctx.records`` holds the stores.
        path: one of :data:`MESH_PATHS`.
        body: the decoded JSON body.
        admit_refusal: the face's refused-request budget, as :func:`face_routes.answer_exchange`.
        peer: the public face's source, named in the log line.
        routes: ``{path: await route(ctx, body, now)}`` to answer ``path`` from instead of this
            module's table (the service-endpoint doors, ``http/service_endpoint_routes.py``).

    Raises:
        Refused: 400/401/403/404 with the route's sentence while the budget admits it, then
            RATE_LIMITED 429 :data:`~cotal_trio.http.faces.TOO_MANY_REFUSALS`.
        RateLimited: the typed 429 from connect limits (bearer route; not counted).
        Unavailable: a store did not answer (503).
    """
    now = ctx.clock()
    try:
        return await (_ROUTES if routes is None else routes)[path](ctx, body, now)
    except RateLimited:
        raise
    except CodecError as bad:  # a grammar the core refused (a label, an endpoint): the caller's fault
        refusal = _bad(str(bad))
    except Refused as refused:
        refusal = refused
    source = "" if peer is None else f" from {peer}"
    LOGGER.warning("auth-service: refused %s%s: %s", path, source, refusal.detail)
    if admit_refusal(now):
        raise refusal
    raise Refused(RefusalCode.RATE_LIMITED, TOO_MANY_REFUSALS)
