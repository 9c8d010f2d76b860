"""The token exchange: request bodies, bearer lifetimes and grants (DESIGN 7; upstream-notes 3.5).

``POST /exchange`` takes one of two bodies:

* human arm: ``{"idpToken": "<EdDSA IdP JWT>", "actor": "cli", "ttlSec"?: 600, "view"?: "<view>",
  "managerInstanceId"?: "<instance id>", "transferWriter"?: {"instanceId", "hex"}}``;
* agent arm: ``{"owner": "u_…", "actor": "alpha", "actorToken": "<secret>", "ttlSec"?: 300,
  "view"?: "manager-caller", "managerInstanceId"?: "<instance id>"}``.

``managerInstanceId`` (optional, pins the manager instance) goes only with view
``manager-caller``; ``transferWriter`` goes only with view ``transfer-writer``, which needs it
(upstream-notes 3.2, 3.5). Parsing checks the shape only: whether this face and arm may mint the
view is :func:`cotal_trio.core.views.check_exchange_view`, before any ledger read, and whether the
ledger row grants it is :func:`cotal_trio.core.views.check_view_scope` (:func:`grant_from_row`
runs it). Bearer lifetimes: a human bearer lives ``min(ttlSec or 900, cap, idp_exp - now)`` (spec
"Bridge contract" step 1: it never outlives its proof); an agent bearer ``min(ttlSec or 300,
300, cap)``, where ``cap`` is :func:`cotal_trio.core.views.view_ttl_cap` of the view (300 s for
``transfer-writer``, else 900 s).

The decision order of one exchange (upstream-notes 3.5, 3.4) is :func:`decide_exchange`: given
what the face has learned so far (:class:`ExchangeFacts`), it refuses, or names the next
:class:`ExchangeStep` the face performs (the ledger, the records store, the provisioner, the
signer are I/O and stay in the face); the face records the outcome and asks again, until
:attr:`ExchangeStep.MINT`.

Pure and synchronous: the HTTP layer parses JSON and passes the object in; time comes in as
``now`` (unix seconds). The decision order reads no time: each refusal that depends on time (an
IdP token's ``exp``, a window, a bucket) is made by the step that reads it.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

from cotal_trio.core.bearer import BearerGrant
from cotal_trio.core.errors import RefusalCode, Refused
from cotal_trio.core.identity import check_actor, check_owner, is_lifecycle_uid
from cotal_trio.core.ledger import LedgerRow
from cotal_trio.core.views import (
    SessionBinding,
    ServiceEndpointBinding,
    TransferTarget,
    check_exchange_view,
    check_view,
    check_view_scope,
    view_ttl_cap,
)

__all__ = [
    "AGENT_BEARER_TTL_S",
    "HUMAN_TTL_DEFAULT_S",
    "MANAGER_CALLER",
    "AgentExchange",
    "ExchangeFacts",
    "ExchangeStep",
    "HumanExchange",
    "agent_bearer_ttl",
    "decide_exchange",
    "exchange_arm",
    "grant_from_row",
    "human_bearer_ttl",
    "parse_exchange_body",
]

# Lifetime of a human bearer when the body names none (upstream MAX_TOKEN_TTL_SEC).
HUMAN_TTL_DEFAULT_S = 900
# Default and cap of an agent bearer (upstream AGENT_BEARER_TTL_SEC).
AGENT_BEARER_TTL_S = 300
# The view bound to a selected live manager instance (spec "Proxy attribution").
MANAGER_CALLER = "manager-caller"

_HUMAN_KEYS = frozenset({"idpToken", "actor", "ttlSec", "view", "managerInstanceId", "transferWriter"})
_AGENT_KEYS = frozenset({"owner", "actor", "actorToken", "ttlSec", "view", "managerInstanceId"})
_BOTH_ARMS = "exchange takes idpToken (human) OR owner+actorToken (agent), never both"
_HUMAN_SHAPE = "human exchange needs { idpToken: string, actor: string, ttlSec?: number }"
_TTL_SENTENCE = "ttlSec must be a positive whole number of seconds - omit it for the default"
_AGENT_SHAPE = "agent exchange needs { owner: string, actor: string, actorToken: string, ttlSec?: number }"
_INSTANCE_SENTENCE = (
    "managerInstanceId must be a manager instance id (26 to 32 characters of a-z and 0-9) - "
    "copy it from `cotal manager list`"
)


def _bad_request(sentence: str) -> Refused:
    return Refused(RefusalCode.BAD_REQUEST, sentence)


def _check_ttl(ttl_s: object) -> None:
    if ttl_s is not None and (type(ttl_s) is not int or ttl_s <= 0):
        raise _bad_request(_TTL_SENTENCE)


def _check_view_fields(
    view: object, manager_instance_id: object, transfer_writer: object = None, *, human: bool = True
) -> None:
    """The view's body fields pair up (400 otherwise). The agent arm takes no ``transferWriter``
    and is refused every view but manager-caller by ``check_exchange_view`` with its own sentence,
    so a transfer-writer view's missing target is named on the human arm only."""
    if view is not None:
        check_view(view)
    if manager_instance_id is not None and view != "manager-caller":
        raise _bad_request(
            'managerInstanceId goes only with view manager-caller - add "view": "manager-caller" or drop managerInstanceId'
        )
    if manager_instance_id is not None and not is_lifecycle_uid(manager_instance_id):
        raise _bad_request(_INSTANCE_SENTENCE)
    if transfer_writer is not None and view != "transfer-writer":
        raise _bad_request(
            'transferWriter goes only with view transfer-writer - add "view": "transfer-writer" or drop transferWriter'
        )
    if human and view == "transfer-writer" and not isinstance(transfer_writer, TransferTarget):
        raise _bad_request(
            'view transfer-writer needs transferWriter {"instanceId", "hex"} - name the one transcript object to write'
        )


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
        view: the requested view (one of ``core.views.VIEWS``), or ``None``.
        manager_instance_id: the pinned manager instance (lifecycle token); only with view
            ``manager-caller``, where ``None`` means "select the caller's one live instance".
        transfer_writer: the transcript object; present iff view is ``transfer-writer``.

    Raises:
        Refused: BAD_REQUEST for an empty token, a bad actor, a non-positive ``ttl_s``, an
            unknown view, or a binding without its view (or ``transfer-writer`` without its).
    """

    id_token: str = field(repr=False)
    actor: str
    ttl_s: int | None = None
    view: str | None = None
    manager_instance_id: str | None = None
    transfer_writer: TransferTarget | None = None

    def __post_init__(self) -> None:
        _check_secret(self.id_token, _HUMAN_SHAPE)
        check_actor(self.actor)
        _check_ttl(self.ttl_s)
        _check_view_fields(self.view, self.manager_instance_id, self.transfer_writer)


@dataclass(frozen=True, slots=True, kw_only=True)
class AgentExchange:
    """An agent-arm (actor-token) exchange request.

    Attributes:
        owner: the agent's derived owner.
        actor: the agent's actor.
        actor_token: the agent's secret (hidden from ``repr``).
        ttl_s: requested lifetime in seconds, or ``None`` for the default.
        view: the requested view, or ``None`` (the agent arm mints ``manager-caller`` only:
            ``core.views.check_exchange_view`` refuses the rest).
        manager_instance_id: the pinned manager instance; only with view ``manager-caller``.

    Raises:
        Refused: BAD_REQUEST for an empty token, a bad owner or actor, a non-positive ``ttl_s``,
            an unknown view, or ``manager_instance_id`` without view ``manager-caller``.
    """

    owner: str
    actor: str
    actor_token: str = field(repr=False)
    ttl_s: int | None = None
    view: str | None = None
    manager_instance_id: str | None = None

    def __post_init__(self) -> None:
        _check_secret(self.actor_token, _AGENT_SHAPE)
        check_owner(self.owner)
        check_actor(self.actor)
        _check_ttl(self.ttl_s)
        _check_view_fields(self.view, self.manager_instance_id, human=False)


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
    if "managerInstanceId" in obj and not isinstance(obj["managerInstanceId"], str):
        raise _bad_request(_INSTANCE_SENTENCE)


def _parse_human(obj: dict[str, Any]) -> HumanExchange:
    _check_common(obj, _HUMAN_KEYS, "a human")
    if not isinstance(obj.get("actor"), str):
        raise _bad_request(_HUMAN_SHAPE)
    target = TransferTarget.from_claim(obj["transferWriter"]) if "transferWriter" in obj else None
    return HumanExchange(
        id_token=obj["idpToken"], actor=obj["actor"], ttl_s=obj.get("ttlSec"), view=obj.get("view"),
        manager_instance_id=obj.get("managerInstanceId"), transfer_writer=target,
    )  # fmt: skip


def _parse_agent(obj: dict[str, Any]) -> AgentExchange:
    _check_common(obj, _AGENT_KEYS, "an agent")
    if not all(isinstance(obj.get(key), str) for key in ("owner", "actor", "actorToken")):
        raise _bad_request(_AGENT_SHAPE)
    return AgentExchange(
        owner=obj["owner"], actor=obj["actor"], actor_token=obj["actorToken"],
        ttl_s=obj.get("ttlSec"), view=obj.get("view"), manager_instance_id=obj.get("managerInstanceId"),
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
            ``ttlSec`` not a positive integer; ``view`` not a string or not a known view;
            ``managerInstanceId`` not an instance id or without view ``manager-caller``;
            ``transferWriter`` not ``{instanceId, hex}``, without view ``transfer-writer``, or
            missing with it. Whether the face and arm may mint the view is decided afterwards
            by :func:`cotal_trio.core.views.check_exchange_view`.
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


def human_bearer_ttl(requested: int | None, idp_exp: int, now: int, *, view: str | None = None) -> int:
    """Lifetime of a human bearer: ``min(requested or 900, cap, idp_exp - now)`` seconds, where
    ``cap`` is :func:`~cotal_trio.core.views.view_ttl_cap` of ``view`` (300 for
    ``transfer-writer``, else 900).

    The bearer never outlives the IdP proof (spec "Bridge contract" step 1): ``now`` is read
    when the bearer is signed, so time spent before signing shortens the bearer.

    Raises:
        Refused: BAD_CREDENTIAL when the proof has expired (``idp_exp - now <= 0``).
        ConfigError: ``view`` is not a known view (parse the body first).
    """
    remaining = idp_exp - now
    if remaining <= 0:
        raise Refused(RefusalCode.BAD_CREDENTIAL, "IdP token expired - sign in to the IdP again for a fresh token and retry")
    return min(requested or HUMAN_TTL_DEFAULT_S, view_ttl_cap(view), remaining)


def agent_bearer_ttl(requested: int | None, *, view: str | None = None) -> int:
    """Lifetime of an agent bearer: ``min(requested or 300, 300, view_ttl_cap(view))`` seconds.

    Raises:
        ConfigError: ``view`` is not a known view (parse the body first).
    """
    return min(requested or AGENT_BEARER_TTL_S, AGENT_BEARER_TTL_S, view_ttl_cap(view))


def grant_from_row(
    row: LedgerRow,
    *,
    credential_id: str | None = None,
    view: str | None = None,
    manager_instance_id: str | None = None,
    session: SessionBinding | None = None,
    transfer_writer: TransferTarget | None = None,
    service_endpoint: ServiceEndpointBinding | None = None,
) -> BearerGrant:
    """The bearer grant of an authorized ledger row: its owner, actor, scope, lifecycle UID and
    parent (spec "Bridge contract" step 3: the ledger is the only source of scope and parent),
    plus the view and its binding when one is minted.

    Args:
        row: the row returned by an ``authorize_*_exchange`` decision (fresh: the view's scope
            is checked against it).
        credential_id: the root credential id to bind, when the credential ledger is in use.
        view: the view to mint, or ``None`` (then every binding must be ``None`` too).
        manager_instance_id: the selected live manager instance; required iff view is
            ``manager-caller``.
        session: the chat session; required iff view is ``session-caller``.
        transfer_writer: the transcript object; required iff view is ``transfer-writer``.
        service_endpoint: the registered service endpoint; required iff view is ``service-host``.

    Raises:
        Refused: NOT_GRANTED when the row lacks the view's required scope
            (:func:`~cotal_trio.core.views.check_view_scope`, naming ``cotal actor grant``);
            BAD_REQUEST for an unknown view or a binding that does not pair with it.
    """
    if view is not None:
        check_view_scope(view, row_scope=row.scope, bearer_scope=row.scope, owner=row.owner, actor=row.actor)
    return BearerGrant(
        owner=row.owner, actor=row.actor, scope=row.scope, lifecycle_uid=row.lifecycle_uid,
        parent=row.parent, credential_id=credential_id, view=view, manager_instance_id=manager_instance_id,
        session=session, transfer_writer=transfer_writer, service_endpoint=service_endpoint,
    )  # fmt: skip


def exchange_arm(request: HumanExchange | AgentExchange) -> str:
    """``"agent"`` or ``"human"``: which arm a parsed request takes."""
    return "agent" if isinstance(request, AgentExchange) else "human"


class ExchangeStep(enum.Enum):
    """The next thing a face does for an exchange, as :func:`decide_exchange` names it.

    * ``AUTHENTICATE``: verify the credential and its ledger grant (the human arm's IdP token
      against the pinned keys, then the interactive row; the agent arm's managed row, secret and
      spawner envelope; spec "Bridge contract" steps 1-3), then record the authorized row;
    * ``SELECT_MANAGER``: select the live manager instance a ``manager-caller`` bearer binds
      (spec "Proxy attribution": the principal's selection window first on the public face),
      then record its id;
    * ``PROVISION``: check the caller's connect limits (a limited caller provisions nothing:
      spec "Connect limits"), pre-create its DM inbox, watch readers and task queue (credential-authority
      "Provisioning"), then record that;
    * ``MINT``: check the connect limits and sign (the face's ``mint_for``).
    """

    AUTHENTICATE = "authenticate"
    SELECT_MANAGER = "select-manager"
    PROVISION = "provision"
    MINT = "mint"


@dataclass(frozen=True, slots=True, kw_only=True)
class ExchangeFacts:
    """What a face knows about one exchange so far; each step's outcome is one field.

    Attributes:
        face: ``"public"`` or ``"loopback"`` (which views it mints).
        provisioning: the face provisions an agent-profile bearer's subjects before minting it.
        row: the authorized ledger row, once ``AUTHENTICATE`` succeeded; None before.
        manager_instance_id: the selected manager instance, once ``SELECT_MANAGER`` succeeded.
        provisioned: ``PROVISION`` succeeded.
    """

    face: str
    provisioning: bool = False
    row: LedgerRow | None = None
    manager_instance_id: str | None = None
    provisioned: bool = False


def decide_exchange(request: HumanExchange | AgentExchange, facts: ExchangeFacts) -> ExchangeStep:
    """The exchange's decision order (upstream-notes 3.5, 3.4; spec "Listener policy"): refuse
    now, or the next :class:`ExchangeStep` for the face to perform.

    The order, after :func:`parse_exchange_body` (400 for a bad body, before anything else):

    1. the view against the face and arm (:func:`~cotal_trio.core.views.check_exchange_view`:
       400 before any ledger read);
    2. ``AUTHENTICATE`` until the row is known (its refusals are the step's: 401);
    3. the view's required ledger scope (:func:`~cotal_trio.core.views.check_view_scope`: 401
       NOT_GRANTED naming ``cotal actor grant``);
    4. ``SELECT_MANAGER`` for a ``manager-caller`` view until an instance is selected;
    5. ``PROVISION`` for a bearer with no view (the agent profile) when the face provisions;
    6. ``MINT``.

    Pure and idempotent: asked again with the same facts it answers the same, and a check
    passed once passes again, so the face just asks after each step.

    Raises:
        Refused: BAD_REQUEST for a view this face or arm does not mint; NOT_GRANTED for a row
            without the view's scope.
        ConfigError: ``facts.face`` is not a face (a bug in the caller).
    """
    check_exchange_view(request.view, face=facts.face, arm=exchange_arm(request))
    row = facts.row
    if row is None:
        return ExchangeStep.AUTHENTICATE
    if request.view is not None:
        check_view_scope(request.view, row_scope=row.scope, bearer_scope=row.scope, owner=row.owner, actor=row.actor)
    if request.view == MANAGER_CALLER and facts.manager_instance_id is None:
        return ExchangeStep.SELECT_MANAGER
    if request.view is None and facts.provisioning and not facts.provisioned:
        return ExchangeStep.PROVISION
    return ExchangeStep.MINT
