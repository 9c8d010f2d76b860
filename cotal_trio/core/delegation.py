"""The delegation envelope: a managed row holds nothing its spawner does not (upstream-notes 1.3).

A managed row may name its spawner in ``parent``. :func:`check_within_spawner_grant` walks that
chain to its authority root, checking each hop's scope, role and channel patterns
(:func:`pattern_contains`). The CLI's managed grant and every agent exchange
(:func:`cotal_trio.core.ledger.authorize_agent_exchange`) run it; the rows come from a
:data:`~cotal_trio.core.ledger.RowLookup` port the shell reads fresh.

The walk reads a row through :class:`Grant`, the fields it needs, so this module imports nothing
of ``ledger.py`` and ``ledger.py`` imports it one way (issue 16: no circles).

Pure and synchronous.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, TypeVar

from cotal_trio.core.errors import RefusalCode, Refused
from cotal_trio.core.identity import split_principal

__all__ = ["ADMIN_SCOPE", "Grant", "check_within_spawner_grant", "pattern_contains"]

# A spawner holding this scope is an authority root: the envelope walk stops there.
ADMIN_SCOPE = "admin"


class Grant(Protocol):
    """What the envelope walk reads of a ledger row (a :class:`~cotal_trio.core.ledger.LedgerRow` is one).

    Attributes:
        principal: ``<owner>.<actor>``.
        owner: derived owner ``u_…``.
        parent: ``<owner>.<actor>`` of the spawner, or ``None``.
        scope: scope tokens (``admin``, ``spawn``, ``role:<r>`` …).
        allow_subscribe, allow_publish: channel patterns.
        role: role name or ``None``.
    """

    @property
    def principal(self) -> str: ...
    @property
    def owner(self) -> str: ...
    @property
    def parent(self) -> str | None: ...
    @property
    def scope(self) -> tuple[str, ...]: ...
    @property
    def allow_subscribe(self) -> tuple[str, ...]: ...
    @property
    def allow_publish(self) -> tuple[str, ...]: ...
    @property
    def role(self) -> str | None: ...


# The row type the caller passes in comes back out (the root is one of its rows).
RowT = TypeVar("RowT", bound=Grant)


def _not_granted(sentence: str) -> Refused:
    return Refused(RefusalCode.NOT_GRANTED, sentence)


def pattern_contains(outer: str, inner: str) -> bool:
    """True when every subject matched by NATS pattern ``inner`` is matched by ``outer``.

    Tokens are dot-separated; ``*`` matches one token, a final ``>`` one or more. A literal in
    ``outer`` contains only the same literal; ``*`` contains any single token pattern; ``>``
    contains any non-empty rest. ``inner``'s ``>`` is contained only by ``outer``'s ``>``.
    """
    outer_tokens, inner_tokens = outer.split("."), inner.split(".")
    for index, token in enumerate(outer_tokens):
        if token == ">":
            return len(inner_tokens) > index
        if index >= len(inner_tokens) or inner_tokens[index] == ">":
            return False
        if token != "*" and token != inner_tokens[index]:
            return False
    return len(inner_tokens) == len(outer_tokens)


def _acl_within(child: tuple[str, ...], parent: tuple[str, ...]) -> list[str]:
    return [p for p in child if not any(pattern_contains(outer, p) for outer in parent)]


def _check_hop(child: Grant, parent: Grant) -> None:
    """One envelope hop: the child holds nothing its spawner does not."""
    fix = f"narrow the grant of {child.principal} or widen its spawner {parent.principal}"
    wider = sorted(set(child.scope) - set(parent.scope))
    if wider:
        raise _not_granted(f"{child.principal} holds scope {', '.join(wider)} its spawner lacks - {fix}")
    for name, mine, theirs in (
        ("allowSubscribe", child.allow_subscribe, parent.allow_subscribe),
        ("allowPublish", child.allow_publish, parent.allow_publish),
    ):
        outside = _acl_within(mine, theirs)
        if outside:
            raise _not_granted(f"{child.principal} {name} {', '.join(outside)} is outside its spawner's - {fix}")
    if child.role is not None and f"role:{child.role}" not in parent.scope:
        raise _not_granted(f"{child.principal} has role {child.role} but its spawner lacks scope role:{child.role} - {fix}")


def _spawner_row(child: RowT, lookup: Callable[[str, str], RowT | None], seen: set[str]) -> RowT:
    assert child.parent is not None
    parent_owner, parent_actor = split_principal(child.parent)
    if parent_owner != child.owner:
        raise _not_granted(f"{child.principal} names a spawner of another owner ({child.parent}) - re-spawn it under its own owner")
    if child.parent in seen:
        raise _not_granted(f"the spawner chain of {child.principal} loops at {child.parent} - revoke and re-grant the agents in the loop")
    seen.add(child.parent)
    parent = lookup(parent_owner, parent_actor)
    if parent is None or parent.principal != child.parent:
        raise _not_granted(f"spawner {child.parent} of {child.principal} is no longer granted - re-grant the spawner or revoke {child.principal}")
    return parent


def check_within_spawner_grant(row: RowT, lookup: Callable[[str, str], RowT | None]) -> RowT:
    """Walk ``row``'s spawner chain to its authority root (upstream ``assertWithinSpawnerGrant``).

    From ``row``, follow ``parent`` links. Each hop must stay with the same owner and must not
    loop. The walk stops at an **authority root**: a spawner holding scope ``admin`` (which
    delegates without the containment checks: the "admin parent's containment bypass") or a
    row without a parent. Every other hop must be contained: child scope a subset of the
    spawner's, each child ``allowSubscribe``/``allowPublish`` pattern contained in one of the
    spawner's (:func:`pattern_contains`), and a child ``role`` needs ``role:<r>`` in the
    spawner's scope. Used by the CLI's managed grant and by every agent exchange.

    Args:
        row: the row to check (normally managed): a :class:`Grant`, in practice a ``LedgerRow``.
        lookup: ``lookup(owner, actor)`` returning the fresh row of either kind, or ``None``
            (a :data:`~cotal_trio.core.ledger.RowLookup`).

    Returns:
        The authority root row (``row`` itself when it has no parent).

    Raises:
        Refused: NOT_GRANTED naming the broken hop and its fix.
    """
    seen = {row.principal}
    child = row
    while child.parent is not None:
        parent = _spawner_row(child, lookup, seen)
        if ADMIN_SCOPE in parent.scope:
            return parent
        _check_hop(child, parent)
        child = parent
    return child
