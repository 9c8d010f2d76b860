"""The fields a registration row shares: a manager instance (``mgr.<owner>.<instanceId>``,
:mod:`.managers`) and a service endpoint (``svcep.<endpoint>``, :mod:`.service_endpoints`) both
bind a running instance to one principal, and both rows carry the same six fields with the same
grammar (docs/managers-and-sessions.md, docs/http-api.md "Service endpoints"). Their two doors,
``POST /manager-service-authority`` and ``POST /service-endpoint-authority``, take the same body
``{idpToken, request}``, ``request`` a ``register`` or a ``retire`` of one registration; each door
is an :class:`AuthorityDoor` here, with its own sentences and members, and one parser.

Pure and synchronous.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar

from .errors import CodecError, RefusalCode, Refused
from .identity import is_actor, is_lifecycle_uid, is_owner

__all__ = [
    "INSTANCE_ID_RULE",
    "LABEL_RULE",
    "MAX_LABEL_CHARS",
    "AuthorityDoor",
    "Registration",
    "RegistrationRequest",
    "check_registration",
    "is_label",
]

MAX_LABEL_CHARS = 128
LABEL_RULE = f"label must be printable text of at most {MAX_LABEL_CHARS} characters"
INSTANCE_ID_RULE = "instanceId must be the id the registration answered ([a-z0-9]{26,32})"
# Every request of either door names its kind and its actor.
_EVERY_REQUEST = frozenset({"kind", "actor"})

T = TypeVar("T")


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


@dataclass(frozen=True, slots=True, kw_only=True)
class RegistrationRequest:
    """One parsed authority body: a person registers or retires one registration of theirs
    (``POST /manager-service-authority`` parses to this; ``POST /service-endpoint-authority`` to
    :class:`~cotal_trio.core.service_endpoints.AuthorityRequest`, this plus the endpoint).

    Attributes:
        idp_token: the person's IdP JWT (the human arm only: a person registers, never an agent).
        kind: ``"register"`` or ``"retire"``.
        actor: the actor the registration binds (its ledger row is read and its scope checked).
        instance_id: the registration to retire (``retire`` only, a lifecycle token), else None.
        label: free text shown beside the registration (``register`` only), or None.
    """

    idp_token: str
    kind: str
    actor: str
    instance_id: str | None = None
    label: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class AuthorityDoor(Generic[T]):
    """One authority door's body: ``{idpToken, request}`` and nothing else, ``request`` one of
    ``kinds`` (docs/http-api.md ``POST /manager-service-authority``, ``POST
    /service-endpoint-authority``).

    Attributes:
        body_rule: the 400 sentence for another outer shape.
        request_rule: the 400 sentence for a ``request`` that is not an object, of an unknown
            kind, missing a member its kind requires, with a member it does not take, or whose
            ``actor`` is not a string.
        kinds: ``{kind: (required, optional)}``, the members of each kind beside ``kind``,
            ``actor`` and ``own``. A member only ``optional`` is still checked by its rule
            (``instanceId`` of a ``retire`` by :data:`INSTANCE_ID_RULE`, None included).
        own: the door's members every kind requires, each with its check (which raises Refused
            with its rule and returns the value), checked in this order after the shape and
            before ``instanceId`` and ``label``.
        build: the door's value type (:class:`RegistrationRequest` or one extending it), called
            with its fields: ``idp_token``, ``kind``, ``actor``, ``instance_id`` (None unless
            ``retire``), ``label`` (None if absent or null) and each ``own`` member by name.
    """

    body_rule: str
    request_rule: str
    kinds: Mapping[str, tuple[frozenset[str], frozenset[str]]]
    build: Callable[..., T]
    own: Mapping[str, Callable[[object], str]] = field(default_factory=dict)

    def parse(self, body: object) -> T:
        """The request ``body`` holds, built with :attr:`build`.

        Raises:
            Refused: BAD_REQUEST with the first rule ``body`` breaks: :attr:`body_rule`,
                :attr:`request_rule`, an ``own`` member's rule, :data:`INSTANCE_ID_RULE` (a
                ``retire`` whose ``instanceId`` is not a lifecycle token), :data:`LABEL_RULE`.
        """
        if not isinstance(body, dict) or set(body) != {"idpToken", "request"} or not isinstance(body["idpToken"], str):
            raise Refused(RefusalCode.BAD_REQUEST, self.body_rule)
        request = body["request"]
        kind = request.get("kind") if isinstance(request, dict) else None
        members = self.kinds.get(kind) if isinstance(kind, str) else None
        if members is None or not self._fits(request, *members) or not isinstance(request["actor"], str):
            raise Refused(RefusalCode.BAD_REQUEST, self.request_rule)
        own = {name: check(request[name]) for name, check in self.own.items()}
        instance_id = request.get("instanceId")
        if kind == "retire" and not is_lifecycle_uid(instance_id):
            raise Refused(RefusalCode.BAD_REQUEST, INSTANCE_ID_RULE)
        label = request.get("label")
        if label is not None and not is_label(label):
            raise Refused(RefusalCode.BAD_REQUEST, LABEL_RULE)
        return self.build(idp_token=body["idpToken"], kind=kind, actor=request["actor"], instance_id=instance_id, label=label, **own)

    def _fits(self, request: dict, required: frozenset[str], optional: frozenset[str]) -> bool:
        needed = _EVERY_REQUEST | set(self.own) | required
        return needed <= set(request) <= needed | optional
