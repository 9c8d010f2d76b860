"""The fields a registration row shares: a manager instance (``mgr.<owner>.<instanceId>``,
:mod:`.managers`) and a service endpoint (``svcep.<endpoint>``, :mod:`.service_endpoints`) both
bind a running instance to one principal, and both rows carry the same six fields with the same
grammar (docs/managers-and-sessions.md, docs/http-api.md "Service endpoints").

Pure and synchronous.
"""

from __future__ import annotations

from typing import Protocol

from .errors import CodecError
from .identity import is_actor, is_lifecycle_uid, is_owner

__all__ = ["LABEL_RULE", "MAX_LABEL_CHARS", "Registration", "check_registration", "is_label"]

MAX_LABEL_CHARS = 128
LABEL_RULE = f"label must be printable text of at most {MAX_LABEL_CHARS} characters"


class Registration(Protocol):
    """What :func:`check_registration` reads: the shared fields of a registration row."""

    @property
    def instance_id(self) -> str: ...
    @property
    def owner(self) -> str: ...
    @property
    def actor(self) -> str: ...
    @property
    def serve_epoch(self) -> int: ...
    @property
    def registered_at(self) -> int: ...
    @property
    def label(self) -> str | None: ...


def is_label(value: object) -> bool:
    """True for printable text of at most :data:`MAX_LABEL_CHARS` characters."""
    return isinstance(value, str) and len(value) <= MAX_LABEL_CHARS and value.isprintable()


def check_registration(record: Registration, *, what: str) -> None:
    """Check the shared fields of ``record``, in row order, and stop at the first broken one.

    Args:
        record: the value type being built (its ``__post_init__`` calls this).
        what: the row's name in errors (``"manager instance row"``).

    Raises:
        CodecError: ``<what>: <problem>``, the problem naming the field: ``instanceId`` is not a
            lifecycle token ``[a-z0-9]{26,32}``, ``owner`` not a derived owner, ``actor`` not an
            actor name, ``serveEpoch`` not an int >= 1, ``registeredAt`` not whole unix seconds,
            or ``label`` neither None nor :func:`is_label` text (:data:`LABEL_RULE`).
    """
    def require(ok: bool, problem: str) -> None:
        if not ok:
            raise CodecError(f"{what}: {problem}")

    require(is_lifecycle_uid(record.instance_id), "instanceId is not a lifecycle token ([a-z0-9]{26,32})")
    require(is_owner(record.owner), "owner is not a derived owner")
    require(is_actor(record.actor), "actor is not an actor name")
    require(type(record.serve_epoch) is int and record.serve_epoch >= 1, "serveEpoch must be an int >= 1")
    require(type(record.registered_at) is int and record.registered_at >= 0, "registeredAt must be whole unix seconds")
    require(record.label is None or is_label(record.label), LABEL_RULE)
