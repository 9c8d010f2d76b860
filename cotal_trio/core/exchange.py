"""The token exchange: request bodies, bearer lifetimes and grants (DESIGN 7; upstream-notes 3.5).

``POST /exchange`` takes one of two bodies:

* human arm: ``{"idpToken": "<EdDSA IdP JWT>", "actor": "cli", "ttlSec"?: 600}``;
* agent arm: ``{"owner": "u_…", "actor": "alpha", "actorToken": "<secret>", "ttlSec"?: 300}``.

``view`` is part of both shapes, but this auth service offers no view yet, so any view is
refused with a sentence. Bearer lifetimes: a human bearer lives ``min(ttlSec or 900, 900,
idp_exp - now)`` (spec "Bridge contract" step 1: it never outlives its proof); an agent bearer
``min(ttlSec or 300, 300)``.

Pure and synchronous: the HTTP layer parses JSON and passes the object in; time comes in as
``now`` (unix seconds).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from cotal_trio.core.bearer import MAX_TOKEN_TTL_S, BearerGrant
from cotal_trio.core.errors import RefusalCode, Refused
from cotal_trio.core.identity import check_actor, check_owner
from cotal_trio.core.ledger import LedgerRow

__all__ = [
    "AGENT_BEARER_TTL_S",
    "HUMAN_TTL_DEFAULT_S",
    "AgentExchange",
    "HumanExchange",
    "agent_bearer_ttl",
    "grant_from_row",
    "human_bearer_ttl",
    "parse_exchange_body",
]

# Lifetime of a human bearer when the body names none (upstream MAX_TOKEN_TTL_SEC).
HUMAN_TTL_DEFAULT_S = 900
# Default and cap of an agent bearer (upstream AGENT_BEARER_TTL_SEC).
AGENT_BEARER_TTL_S = 300

_HUMAN_KEYS = frozenset({"idpToken", "actor", "ttlSec", "view"})
_AGENT_KEYS = frozenset({"owner", "actor", "actorToken", "ttlSec", "view"})
_BOTH_ARMS = "exchange takes idpToken (human) OR owner+actorToken (agent), never both"
_HUMAN_SHAPE = "human exchange needs { idpToken: string, actor: string, ttlSec?: number }"
_TTL_SENTENCE = "ttlSec must be a positive whole number of seconds - omit it for the default"
_AGENT_SHAPE = "agent exchange needs { owner: string, actor: string, actorToken: string, ttlSec?: number }"


def _bad_request(sentence: str) -> Refused:
    return Refused(RefusalCode.BAD_REQUEST, sentence)


def _check_ttl(ttl_s: object) -> None:
    if ttl_s is not None and (type(ttl_s) is not int or ttl_s <= 0):
        raise _bad_request(_TTL_SENTENCE)


def _check_view(view: object) -> None:
    if view is not None:
        shown = json.dumps(view[:64] if isinstance(view, str) else repr(view))
        raise _bad_request(f"view {shown} is not offered by this auth service - exchange without a view")


def _check_secret(value: object, sentence: str) -> None:
    if not isinstance(value, str) or not value:
        raise _bad_request(sentence)


@dataclass(frozen=True, slots=True, kw_only=True)
class HumanExchange:
    """A human-arm exchange request.

    Attributes:
        id_token: the IdP JWT (not verified yet; hidden from ``repr``).
        actor: the requested actor.
        ttl_s: requested lifetime in seconds, or ``None`` for the default.
        view: always ``None`` for now.

    Raises:
        Refused: BAD_REQUEST for an empty token, a bad actor, a non-positive ``ttl_s`` or any view.
    """

    id_token: str = field(repr=False)
    actor: str
    ttl_s: int | None = None
    view: str | None = None

    def __post_init__(self) -> None:
        _check_secret(self.id_token, _HUMAN_SHAPE)
        check_actor(self.actor)
        _check_ttl(self.ttl_s)
        _check_view(self.view)


@dataclass(frozen=True, slots=True, kw_only=True)
class AgentExchange:
    """An agent-arm (actor-token) exchange request.

    Attributes:
        owner: the agent's derived owner.
        actor: the agent's actor.
        actor_token: the agent's secret (hidden from ``repr``).
        ttl_s: requested lifetime in seconds, or ``None`` for the default.
        view: always ``None`` for now.

    Raises:
        Refused: BAD_REQUEST for an empty token, a bad owner or actor, a non-positive ``ttl_s``
            or any view.
    """

    owner: str
    actor: str
    actor_token: str = field(repr=False)
    ttl_s: int | None = None
    view: str | None = None

    def __post_init__(self) -> None:
        _check_secret(self.actor_token, _AGENT_SHAPE)
        check_owner(self.owner)
        check_actor(self.actor)
        _check_ttl(self.ttl_s)
        _check_view(self.view)


def _check_common(obj: dict[str, Any], allowed: frozenset[str], arm: str) -> None:
    unknown = sorted(str(key) for key in obj if key not in allowed)
    if unknown:
        raise _bad_request(
            f"{arm} exchange does not take {', '.join(unknown)[:200]} - allowed keys: {', '.join(sorted(allowed))}"
        )
    if "ttlSec" in obj and obj["ttlSec"] is None:
        raise _bad_request(_TTL_SENTENCE)
    _check_ttl(obj.get("ttlSec"))
    if "view" in obj and not isinstance(obj["view"], str):
        raise _bad_request("view must be a string")


def _parse_human(obj: dict[str, Any]) -> HumanExchange:
    _check_common(obj, _HUMAN_KEYS, "a human")
    if not isinstance(obj.get("actor"), str):
        raise _bad_request(_HUMAN_SHAPE)
    return HumanExchange(id_token=obj["idpToken"], actor=obj["actor"], ttl_s=obj.get("ttlSec"), view=obj.get("view"))


def _parse_agent(obj: dict[str, Any]) -> AgentExchange:
    _check_common(obj, _AGENT_KEYS, "an agent")
    if not all(isinstance(obj.get(key), str) for key in ("owner", "actor", "actorToken")):
        raise _bad_request(_AGENT_SHAPE)
    return AgentExchange(
        owner=obj["owner"], actor=obj["actor"], actor_token=obj["actorToken"],
        ttl_s=obj.get("ttlSec"), view=obj.get("view"),
    )  # fmt: skip


def parse_exchange_body(obj: object) -> HumanExchange | AgentExchange:
    """Parse the JSON body of ``POST /exchange`` (upstream-notes 3.5).

    A body with ``idpToken`` is the human arm; one with ``actorToken`` or ``owner`` is the
    agent arm.

    Args:
        obj: the decoded JSON value.

    Returns:
        A :class:`HumanExchange` or an :class:`AgentExchange`.

    Raises:
        Refused: BAD_REQUEST when ``obj`` is not an object; when it has both ``idpToken`` and
            ``actorToken``; neither arm; an arm's required fields missing or not strings (the
            upstream shape sentences); unknown keys (the sentence lists the allowed ones);
            ``ttlSec`` not a positive integer; ``view`` not a string, or any view at all.
    """
    if not isinstance(obj, dict):
        raise _bad_request(
            'the exchange body must be a JSON object: {"idpToken", "actor"} for a human or '
            '{"owner", "actor", "actorToken"} for an agent'
        )
    if "idpToken" in obj and "actorToken" in obj:
        raise _bad_request(_BOTH_ARMS)
    if "idpToken" in obj:
        return _parse_human(obj)
    if "actorToken" in obj or "owner" in obj:
        return _parse_agent(obj)
    raise _bad_request(f"{_BOTH_ARMS} - the body has neither")


def human_bearer_ttl(requested: int | None, idp_exp: int, now: int) -> int:
    """Lifetime of a human bearer: ``min(requested or 900, 900, idp_exp - now)`` seconds.

    The bearer never outlives the IdP proof (spec "Bridge contract" step 1): ``now`` is read
    when the bearer is signed, so time spent before signing shortens the bearer.

    Raises:
        Refused: BAD_CREDENTIAL when the proof has expired (``idp_exp - now <= 0``).
    """
    remaining = idp_exp - now
    if remaining <= 0:
        raise Refused(RefusalCode.BAD_CREDENTIAL, "IdP token expired - sign in to the IdP again for a fresh token and retry")
    return min(requested or HUMAN_TTL_DEFAULT_S, MAX_TOKEN_TTL_S, remaining)


def agent_bearer_ttl(requested: int | None) -> int:
    """Lifetime of an agent bearer: ``min(requested or 300, 300)`` seconds."""
    return min(requested or AGENT_BEARER_TTL_S, AGENT_BEARER_TTL_S)


def grant_from_row(row: LedgerRow, *, credential_id: str | None = None) -> BearerGrant:
    """The bearer grant of an authorized ledger row: its owner, actor, scope, lifecycle UID and
    parent (spec "Bridge contract" step 3: the ledger is the only source of scope and parent).

    Args:
        row: the row returned by an ``authorize_*_exchange`` decision.
        credential_id: the root credential id to bind, when the credential ledger is in use.
    """
    return BearerGrant(
        owner=row.owner, actor=row.actor, scope=row.scope, lifecycle_uid=row.lifecycle_uid,
        parent=row.parent, credential_id=credential_id,
    )  # fmt: skip
