"""Issued authority at connect: what the auth callout adds to a connect on the ``ep.v1`` rail
(issue 6 item 6; spec credential-authority "User-auth manager callers"; upstream-notes 2.4
step 8 and 9; docs/issued-authority.md "Issued authority at connect").

After the ledger re-check, the callout asks :func:`plan_connect_authority` what the connect is
owed:

* an **issued** ``manager-caller`` view (an interactive row, or an eligible managed seat,
  :func:`run_seat_eligible`): a generation whose rows reach the registry's ``endpoints``
  and, with ``run`` signed, the manager commands that need the binding (:data:`BOUND_VERBS`);
* a **listing** generation for an ``agent`` connection (no view) and an unissued
  ``manager-caller`` view: one request row reaching only ``registry`` ``endpoints``;
* nothing, for every other view.

Either way the horizon is the bearer's expiry, each request row comes with its reply row
(:func:`ep_v1_reply_subject`), the credential can read its own accepted row
``accepted.v1.<token>`` (:func:`accepted_token`, derived from the inbox nonce and that expiry),
and the evidence records the credential's complete ceiling (its permissions with these rows).

Reuse (:func:`reusable`, before the evidence is read; then :func:`same_ceiling`): a row already
under the token gives its generation again only for the same caller triple, a live generation
on this horizon and a byte-identical ceiling; otherwise the connect gets no rows (there is never
a second generation under one token).

A managed seat is eligible only when its own row and its bearer both hold ``run`` and its
direct spawner's fresh same-owner row holds ``run`` too (spec: "whose direct parent's fresh
same-owner grant also contains ``run``. An admin parent's containment bypass does not count"):
:func:`spawner_to_read` names the row the shell reads fresh for that, and only for such a seat.

Pure and synchronous.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Literal

from . import wire
from .bearer import ValidatedBearer
from .identity import split_principal
from .issued import Ceiling, Evidence, IssuedRef, accepted_key, ceiling_from_native, horizon_of, manager_caller_horizon
from .ledger import LedgerKind, LedgerRow
from .profiles import Permissions

__all__ = [
    "BOUND_VERBS",
    "LISTING_REQUEST",
    "AuthorityPlan",
    "accepted_read_subject",
    "accepted_token",
    "authority_rows",
    "ceiling_of",
    "ep_v1_reply_subject",
    "plan_connect_authority",
    "reusable",
    "run_seat_eligible",
    "same_ceiling",
    "spawner_to_read",
    "widen",
]

# The registry's listing question (spec "User-auth manager callers"): endpoint, verb.
LISTING_REQUEST = ("registry", "endpoints")
# The manager commands that refuse the legacy rail (spec "Workflow admission"); an issued
# manager-caller view with `run` signed gets their ep.v1 rows.
BOUND_VERBS = ("run-start", "run-start-keyed", "run-submission-status")
_TOKEN_DOMAIN = b"cotal.accepted.v1\0"
# The reply row's marker token: a request subject has exactly two tokens after the actor
# (endpoint, verb), so `<request>.reply.>` can never be a request subject.
_REPLY = "reply"

Kind = Literal["manager-caller", "listing"]


@dataclass(frozen=True, slots=True, kw_only=True)
class AuthorityPlan:
    """What one connect is owed on the ``ep.v1`` rail (:func:`plan_connect_authority`).

    Attributes:
        kind: ``manager-caller`` (issued view) or ``listing``.
        space, owner, actor, uid: the issuance's reference triple (``uid``: the bearer's
            lifecycle UID).
        horizon: the bearer's expiry, unix seconds.
        token: the accepted row's token (:func:`accepted_token`).
        requests: ``(endpoint, verb)`` pairs the generation's request rows reach.
    """

    kind: Kind
    space: str
    owner: str
    actor: str
    uid: str
    horizon: int
    token: str
    requests: tuple[tuple[str, str], ...]


def accepted_token(inbox_nonce: str, exp: int) -> str:
    """The accepted row's token of a connect: the first 32 hex of
    ``sha256("cotal.accepted.v1\\0" + nonce + "\\0" + str(exp))`` (ours: upstream does not publish
    its formula). The client computes it from its connection name and its bearer's ``exp``."""
    return hashlib.sha256(_TOKEN_DOMAIN + f"{inbox_nonce}\0{exp}".encode()).hexdigest()[:32]


def ep_v1_reply_subject(space: str, generation: str, owner: str, actor: str, endpoint: str, verb: str) -> str:
    """``<ep.v1 request subject>.reply.>``: where the caller takes that request's replies (ours).

    The caller names ``<request>.reply.<id>`` as the reply subject; the rail pins the generation
    and caller triple there too, and the extra tokens keep it apart from every request subject.
    """
    return f"{wire.ep_v1_subject(space, generation, owner, actor, endpoint, verb)}.{_REPLY}.>"


def accepted_read_subject(space: str, token: str) -> str:
    """``$JS.API.DIRECT.GET.KV_cotal_accepted_<S>.$KV.cotal_accepted_<S>.accepted.v1.<token>``:
    the per-key read of one accepted row."""
    bucket = wire.accepted_bucket(space)
    return wire.js_direct_get(wire.kv_stream(bucket), wire.kv_subject(bucket, accepted_key(token)))


def _run_seat(bearer: ValidatedBearer, row: LedgerRow) -> bool:
    """A managed seat asking as a ``manager-caller`` with ``run`` in its row and signed."""
    return (
        bearer.view == "manager-caller" and row.kind is LedgerKind.MANAGED and "run" in row.scope and "run" in bearer.scope
    )


def spawner_to_read(bearer: ValidatedBearer, row: LedgerRow) -> tuple[str, str] | None:
    """``(owner, actor)`` of the spawner whose fresh row decides a managed ``run`` seat, or None.

    Only a ``manager-caller`` bearer on a managed row holding ``run`` (in the row and signed)
    whose ``parent`` is of the same owner needs it; every other connect is decided without it
    (a seat with no parent, or a parent of another owner, is not eligible).
    """
    if not _run_seat(bearer, row) or row.parent is None:
        return None
    owner, actor = split_principal(row.parent)
    return (owner, actor) if owner == row.owner else None


def run_seat_eligible(bearer: ValidatedBearer, row: LedgerRow, spawner: LedgerRow | None) -> bool:
    """Whether a managed seat's ``manager-caller`` view is issued (spec "User-auth manager callers").

    True when ``row`` (managed) and ``bearer`` both hold ``run``, and ``spawner`` is the fresh
    row of ``row.parent`` (same owner, same principal) whose own scope holds ``run``. A spawner
    holding ``admin`` but not ``run`` does not count: its containment bypass lets it delegate,
    not issue.

    Args:
        bearer: the validated bearer.
        row: the seat's fresh row.
        spawner: the fresh row read for :func:`spawner_to_read` (``None``: absent or not read).
    """
    if spawner_to_read(bearer, row) is None or spawner is None:
        return False
    return spawner.principal == row.parent and spawner.owner == row.owner and "run" in spawner.scope


def plan_connect_authority(
    *, space: str, bearer: ValidatedBearer, row: LedgerRow, inbox_nonce: str, spawner: LedgerRow | None = None
) -> AuthorityPlan | None:
    """What a connect authorized by ``row`` is owed on the ``ep.v1`` rail, or None.

    An ``agent`` bearer (no view) gets a listing generation. A ``manager-caller`` bearer gets an
    issued view when ``row`` is interactive, or a managed seat :func:`run_seat_eligible` with
    ``spawner``; a listing generation otherwise. Other views get nothing. An issued view with
    ``run`` signed also reaches :data:`BOUND_VERBS` on ``manager``.

    Args:
        space: the space.
        bearer: the validated bearer.
        row: the fresh row that granted the connect.
        inbox_nonce: the connection's inbox nonce (its connect name).
        spawner: the fresh row of :func:`spawner_to_read`, when that named one.
    """
    if bearer.view not in (None, "manager-caller"):
        return None
    issued = bearer.view == "manager-caller" and (
        row.kind is LedgerKind.INTERACTIVE or run_seat_eligible(bearer, row, spawner)
    )
    requests: tuple[tuple[str, str], ...] = (LISTING_REQUEST,)
    if issued and "run" in bearer.scope:
        requests += tuple(("manager", verb) for verb in BOUND_VERBS)
    horizon = manager_caller_horizon(bearer.exp)
    return AuthorityPlan(
        kind="manager-caller" if issued else "listing", space=space, owner=bearer.owner, actor=bearer.actor,
        uid=bearer.lifecycle_uid, horizon=horizon, token=accepted_token(inbox_nonce, horizon), requests=requests,
    )  # fmt: skip


def authority_rows(plan: AuthorityPlan, generation: str) -> Permissions:
    """The rows ``plan`` adds for ``generation``: each request subject and the accepted row's
    read (publish), each reply subject (subscribe)."""
    args = (plan.space, generation, plan.owner, plan.actor)
    return Permissions(
        pub_allow=(*(wire.ep_v1_subject(*args, e, v) for e, v in plan.requests), accepted_read_subject(plan.space, plan.token)),
        sub_allow=tuple(ep_v1_reply_subject(*args, e, v) for e, v in plan.requests),
    )


def widen(permissions: Permissions, extra: Permissions) -> Permissions:
    """``permissions`` with ``extra``'s allow rows appended (duplicates dropped, order kept)."""
    return Permissions(
        pub_allow=tuple(dict.fromkeys((*permissions.pub_allow, *extra.pub_allow))),
        pub_deny=permissions.pub_deny,
        sub_allow=tuple(dict.fromkeys((*permissions.sub_allow, *extra.sub_allow))),
        sub_deny=permissions.sub_deny,
    )


def ceiling_of(permissions: Permissions) -> Ceiling:
    """The ceiling the evidence records for a credential minted with ``permissions``."""
    return ceiling_from_native(permissions.to_nats())


def reusable(plan: AuthorityPlan, ref: IssuedRef, *, now: float) -> bool:
    """Whether the generation an accepted row names may be reused, decided before its evidence
    is read: the same space and caller triple, the plan's horizon, and still live at ``now``."""
    same = (ref.space, ref.owner, ref.actor, ref.uid) == (plan.space, plan.owner, plan.actor, plan.uid)
    return same and horizon_of(ref.generation) == plan.horizon and now < plan.horizon


def same_ceiling(evidence: Evidence, permissions: Permissions) -> bool:
    """Whether ``evidence`` recorded exactly the ceiling of ``permissions`` (canonical bytes)."""
    return evidence.permissions.canonical() == ceiling_of(permissions).canonical()
