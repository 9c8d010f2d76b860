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

The callout builds a generation's rows and the credential's ceiling on every connect; an
:class:`AuthorityMemo` builds each once per principal and grant and reuses it while they are
unchanged (issue 14 item 4), giving exactly what :func:`authority_rows` and :func:`ceiling_of`
give.

Pure and synchronous.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any, Literal

from . import wire
from .bearer import ValidatedBearer
from .errors import CodecError
from .identity import split_principal
from .issued import (
    Ceiling,
    Evidence,
    IssuedRef,
    Rule,
    accepted_key,
    ceiling_from_native,
    horizon_of,
    manager_caller_horizon,
)
from .ledger import LedgerKind, LedgerRow
from .profiles import Permissions

__all__ = [
    "BOUND_VERBS",
    "LISTING_REQUEST",
    "AuthorityMemo",
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

Kind = Literal["manager-caller", "listing", "static-agent"]


@dataclass(frozen=True, slots=True, kw_only=True)
class AuthorityPlan:
    """What one connect is owed on the ``ep.v1`` rail (:func:`plan_connect_authority`).

    Attributes:
        kind: ``manager-caller`` (issued view), ``listing``, or ``static-agent`` (a static mint:
            :mod:`cotal_trio.core.static_issuance`).
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
    """``permissions`` with ``extra``'s allow rows appended (duplicates dropped, order kept).

    Both were checked when they were made, so the union is not checked again (the callout
    widens every agent connect: issue 14 item 4).
    """
    widened = object.__new__(Permissions)
    for name, value in (
        ("pub_allow", tuple(dict.fromkeys((*permissions.pub_allow, *extra.pub_allow)))),
        ("pub_deny", permissions.pub_deny),
        ("sub_allow", tuple(dict.fromkeys((*permissions.sub_allow, *extra.sub_allow)))),
        ("sub_deny", permissions.sub_deny),
        ("resp_max", permissions.resp_max),
    ):
        object.__setattr__(widened, name, value)
    return widened


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


# Stands for the varying part of a memoized subject; it cannot be in a subject the memo keeps
# (checked), so putting the real value back gives exactly the subject it stood for.
_MARK = "\x00\x01"
# The generation and token an AuthorityMemo builds its row templates with (valid, replaced).
_GEN0, _TOKEN0 = "0" * 32, "f" * 32


@dataclass(frozen=True, slots=True)
class _Direction:
    fixed: frozenset[str]  # checked subjects without the nonce
    marked: tuple[str, ...]  # subjects holding the nonce, as _MARK


@dataclass(frozen=True, slots=True)
class _GrantCeiling:
    pub: _Direction
    pub_deny: _Direction
    sub: _Direction
    sub_deny: _Direction


class AuthorityMemo:
    """Rows and ceilings of connect authority, built once per principal and grant (issue 14
    item 4) and reused while they are unchanged; at most ``capacity`` of each kept (the oldest
    made is dropped first). Pure; not thread-safe (one per callout lane, trio's thread).

    * :meth:`rows` is :func:`authority_rows`: the subjects are made once per caller triple and
      requests, with a stand-in generation and token replaced per connect.
    * :meth:`ceiling` is ``ceiling_of(widen(permissions, extra))``: a grant's subjects are
      checked and kept once per grant (its permissions with the connection's inbox nonce
      stood in for, so the grants of one principal's connections share one entry), and only
      the nonce's subjects and ``extra`` are checked per connect.

    Raises (both): CodecError, as the functions they stand for.
    """

    def __init__(self, capacity: int = 4096) -> None:
        self._capacity = capacity
        self._rows: dict[tuple[Any, ...], tuple[tuple[str, ...], str, tuple[str, ...]] | None] = {}
        self._ceilings: dict[tuple[tuple[str, ...], ...], _GrantCeiling | None] = {}

    def rows(self, plan: AuthorityPlan, generation: str) -> Permissions:
        """``authority_rows(plan, generation)``."""
        key = (plan.space, plan.owner, plan.actor, plan.requests)
        template = self._rows.get(key)
        if key not in self._rows:
            template = _row_template(plan)
            _remember(self._rows, key, template, self._capacity)
        if template is None:  # a stand-in that could not be told apart: build them as is
            return authority_rows(plan, generation)
        wire.check_generation(generation)
        accepted_key(plan.token)  # checks the token
        requests, token_read, replies = template
        pub_allow = (*(s.replace(_GEN0, generation) for s in requests), token_read.replace(_TOKEN0, plan.token))
        return Permissions.of_checked(pub_allow=pub_allow, sub_allow=tuple(s.replace(_GEN0, generation) for s in replies))

    def ceiling(self, permissions: Permissions, extra: Permissions, *, nonce: str) -> Ceiling:
        """``ceiling_of(widen(permissions, extra))``, where ``nonce`` is the connection's inbox
        nonce (the part of ``permissions`` that differs between one grant's connections)."""
        lists = (permissions.pub_allow, permissions.pub_deny, permissions.sub_allow, permissions.sub_deny)
        key = tuple(tuple(s.replace(nonce, _MARK) for s in subjects) for subjects in lists) if nonce else ()
        grant = self._ceilings.get(key) if key else None
        if key and key not in self._ceilings:
            grant = _grant_ceiling(lists, key)
            _remember(self._ceilings, key, grant, self._capacity)
        if grant is None:
            return ceiling_of(widen(permissions, extra))
        return Ceiling(
            publish=Rule.of_valid(_patterns(grant.pub, nonce, extra.pub_allow), _patterns(grant.pub_deny, nonce, ())),
            subscribe=Rule.of_valid(_patterns(grant.sub, nonce, extra.sub_allow), _patterns(grant.sub_deny, nonce, ())),
        )


def _remember(memo: dict[Any, Any], key: Any, value: Any, capacity: int) -> None:
    if len(memo) >= capacity:
        del memo[next(iter(memo))]
    memo[key] = value


def _row_template(plan: AuthorityPlan) -> tuple[tuple[str, ...], str, tuple[str, ...]] | None:
    """The rows of ``plan`` for the stand-in generation and token, or None when a stand-in
    would also match elsewhere in a subject (then replacing it would not be exact)."""
    stand_in = AuthorityPlan(
        kind=plan.kind, space=plan.space, owner=plan.owner, actor=plan.actor, uid=plan.uid, horizon=plan.horizon,
        token=_TOKEN0, requests=plan.requests,
    )  # fmt: skip
    rows = authority_rows(stand_in, _GEN0)
    requests, token_read = rows.pub_allow[:-1], rows.pub_allow[-1]
    if not all(s.count(_GEN0) == 1 for s in (*requests, *rows.sub_allow)) or token_read.count(_TOKEN0) != 1:
        return None
    return requests, token_read, rows.sub_allow


def _grant_ceiling(lists: tuple[tuple[str, ...], ...], key: tuple[tuple[str, ...], ...]) -> _GrantCeiling | None:
    """The checked, nonce-free part of a grant's subjects, or None when the stand-in was there
    already (not exact: build without the memo)."""
    if any(_MARK in s for subjects in lists for s in subjects):
        return None
    directions = []
    for original, marked in zip(lists, key, strict=True):
        _check_all(original)
        directions.append(_Direction(
            fixed=frozenset(s for s, m in zip(original, marked, strict=True) if _MARK not in m),
            marked=tuple(m for m in marked if _MARK in m),
        ))  # fmt: skip
    return _GrantCeiling(*directions)


def _check_all(subjects: tuple[str, ...] | list[str]) -> None:
    """Refuse a malformed subject as :func:`ceiling_of` does (CodecError)."""
    if not all(wire.is_subject(s) for s in subjects):
        raise CodecError("permission ceiling: subjects must be NATS subjects (no empty tokens, > only last)")


def _patterns(direction: _Direction, nonce: str, extra: tuple[str, ...]) -> tuple[str, ...]:
    """The direction's sorted subjects for this connection: its fixed ones, its nonce subjects
    with the nonce put back, and ``extra``; those last two checked here."""
    varying = [m.replace(_MARK, nonce) for m in direction.marked]
    varying.extend(extra)
    _check_all(tuple(varying))
    return tuple(sorted(direction.fixed.union(varying)))
