"""Manager instances: the registry row, its codec, and manager selection (spec "Listener policy", "Proxy attribution").

A manager instance is one running manager process registered to an owner. Its row lives in the
space's records store ``cotal_records_<space>`` under ``mgr.<owner>.<instanceId>``; a present row
is a **live** instance, and retiring it deletes the row (there is no other state). Row (version
1, closed, camelCase as every other row)::

    {"ver": 1, "instanceId": "<[a-z0-9]{26,32}>", "owner": "u_…", "actor": "<manager actor>",
     "serveEpoch": 1, "registeredAt": 1767225600, "label": "build box" | null}

``instanceId`` has the lifecycle UID grammar (minted with
:func:`~cotal_trio.core.identity.mint_lifecycle_uid`); ``serveEpoch`` counts the instance's
serving generations (>= 1); ``registeredAt`` is unix seconds; ``label`` is free printable text
of at most ``MAX_LABEL_CHARS`` characters, or null.

:func:`select_manager` is the ``manager-caller`` view's selection (spec "Proxy attribution";
upstream-notes 3.4 "zero/ambiguous candidates refused; optional explicit managerInstanceId"): it
refuses with a :class:`SelectionRefused` whose sentence names the remedy of its request class,
and :data:`SHED_UNPINNED` / :data:`SHED_PINNED` are the 429 sentences once a class's window is
full. :func:`parse_manager_authority_body` parses ``POST /manager-service-authority``'s body
(docs/http-api.md).

Pure and synchronous: :mod:`cotal_trio.stores.records` does the I/O.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass

from .errors import CodecError, RefusalCode, Refused
from .identity import is_lifecycle_uid, is_owner
from .registration import MAX_LABEL_CHARS, AuthorityDoor, RegistrationRequest, check_registration
from .rowcodec import decode_row

__all__ = [
    "AUTHORITY_BODY",
    "AUTHORITY_REQUEST",
    "MANAGER_KEY_PREFIX",
    "MAX_LABEL_CHARS",
    "MAX_LISTED_IDS",
    "ROW_VERSION",
    "SHED_PINNED",
    "SHED_UNPINNED",
    "ManagerInstance",
    "SelectionRefused",
    "manager_key",
    "owner_prefix",
    "parse_manager_authority_body",
    "parse_manager_row",
    "render_manager_row",
    "select_manager",
]

ROW_VERSION = 1
MANAGER_KEY_PREFIX = "mgr."
# An ambiguous selection names at most this many candidate ids (sorted).
MAX_LISTED_IDS = 5
_KEYS = ("ver", "instanceId", "owner", "actor", "serveEpoch", "registeredAt", "label")

# The remedies of the two request classes (spec "Proxy attribution").
# The spec's words (--on, `cotal manager start`) name a manager CLI this service does not ship; the
# sentences name the commands that exist here.
_PICK_REMEDY = "pick one with --manager-instance <id> (`cotal manager list` shows them)"
_START_REMEDY = "register a running manager with `cotal manager register`"
_UNPINNED_REMEDY = f"{_PICK_REMEDY}, or {_START_REMEDY}"
_PINNED_REMEDY = "check that the pinned manager instance is live and registered to you: `cotal manager list`"

SHED_UNPINNED = f"too many manager selections without a pinned instance were refused - wait a minute, then {_UNPINNED_REMEDY}"
SHED_PINNED = f"too many pinned manager selections were refused - wait a minute, and {_PINNED_REMEDY}"


@dataclass(frozen=True, slots=True, kw_only=True)
class ManagerInstance:
    """One registered manager instance (the key, ``mgr.<owner>.<instanceId>``, is derived).

    Attributes:
        instance_id: lifecycle-UID grammar ``[a-z0-9]{26,32}``.
        owner: the derived owner it serves, ``u_…``.
        actor: the manager actor (its ledger row carries scope ``supervise``).
        serve_epoch: the instance's serving generation, an int >= 1.
        registered_at: unix seconds.
        label: printable text of at most ``MAX_LABEL_CHARS`` characters, or None.

    Raises:
        CodecError: a field breaks its grammar; the message names it.
    """

    instance_id: str
    owner: str
    actor: str
    serve_epoch: int
    registered_at: int
    label: str | None = None

    def __post_init__(self) -> None:
        check_registration(self, what="manager instance row")

    @property
    def key(self) -> str:
        """``mgr.<owner>.<instanceId>``."""
        return manager_key(self.owner, self.instance_id)


def _require(ok: bool, problem: str) -> None:
    if not ok:
        raise CodecError(f"manager instance row: {problem}")


def manager_key(owner: str, instance_id: str) -> str:
    """``mgr.<owner>.<instanceId>``.

    Raises:
        CodecError: ``owner`` is not a derived owner or ``instance_id`` not a lifecycle token.
    """
    _require(is_owner(owner), "owner is not a derived owner")
    _require(is_lifecycle_uid(instance_id), "instanceId is not a lifecycle token ([a-z0-9]{26,32})")
    return f"{MANAGER_KEY_PREFIX}{owner}.{instance_id}"


def owner_prefix(owner: str) -> str:
    """``mgr.<owner>.``: the key prefix of every instance of ``owner`` (CodecError if malformed)."""
    _require(is_owner(owner), "owner is not a derived owner")
    return f"{MANAGER_KEY_PREFIX}{owner}."


def render_manager_row(instance: ManagerInstance) -> bytes:
    """The row's stored bytes: compact JSON, keys in the documented order.

    ``parse_manager_row(render_manager_row(i)) == i``.
    """
    obj = {
        "ver": ROW_VERSION, "instanceId": instance.instance_id, "owner": instance.owner,
        "actor": instance.actor, "serveEpoch": instance.serve_epoch,
        "registeredAt": instance.registered_at, "label": instance.label,
    }
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()


def parse_manager_row(data: bytes) -> ManagerInstance:
    """Decode stored bytes.

    Raises:
        CodecError: not UTF-8 JSON, not an object with exactly the version-1 keys, or a field
            breaking its grammar.
    """
    obj = decode_row(data, what="manager instance row", keys=_KEYS, version=ROW_VERSION)
    return ManagerInstance(
        instance_id=obj["instanceId"], owner=obj["owner"], actor=obj["actor"],
        serve_epoch=obj["serveEpoch"], registered_at=obj["registeredAt"], label=obj["label"],
    )


# --- POST /manager-service-authority -----------------------------------------------------------

AUTHORITY_BODY = "manager-service authority needs { idpToken, request } and nothing else"
AUTHORITY_REQUEST = (
    'request must be {"kind": "register", "actor": "<manager actor>", "label"?: "<text>"} or '
    '{"kind": "retire", "actor": "<manager actor>", "instanceId": "<id>"}'
)


# instanceId is optional in the retire shape, so a retire without one gets the instanceId rule's
# sentence, not the shape's (docs/http-api.md lists both).
_DOOR = AuthorityDoor(
    body_rule=AUTHORITY_BODY, request_rule=AUTHORITY_REQUEST, build=RegistrationRequest,
    kinds={"register": (frozenset(), frozenset({"label"})), "retire": (frozenset(), frozenset({"instanceId"}))},
)  # fmt: skip


def parse_manager_authority_body(body: object) -> RegistrationRequest:
    """Parse ``{idpToken, request}`` (closed; docs/http-api.md ``POST /manager-service-authority``).

    Raises:
        Refused: BAD_REQUEST :data:`AUTHORITY_BODY` for another outer shape, :data:`AUTHORITY_REQUEST`
            for an unknown kind or member, or the rule a field breaks (instanceId, label).
    """
    return _DOOR.parse(body)


class SelectionRefused(Refused):
    """Manager selection found no single live instance for the caller (code NOT_GRANTED).

    Attributes:
        pinned: True when the request named ``managerInstanceId`` (the ``pinned`` class of the
            per-principal windows), False for the ``unpinned`` class.
        kind: ``"none"``, ``"ambiguous"`` (unpinned) or ``"pinned"``.
    """

    def __init__(self, detail: str, *, pinned: bool, kind: str) -> None:
        super().__init__(RefusalCode.NOT_GRANTED, detail)
        self.pinned = pinned
        self.kind = kind


def select_manager(instances: Iterable[ManagerInstance], *, owner: str, pinned: str | None) -> ManagerInstance:
    """The one live manager instance a ``manager-caller`` view of ``owner`` binds to.

    Args:
        instances: the live instances read from the records store (instances of other owners
            are ignored, so passing every row is safe).
        owner: the caller's derived owner.
        pinned: the requested ``managerInstanceId``, or None (unpinned).

    Raises:
        SelectionRefused: pinned and no live instance of ``owner`` has that id; unpinned and
            ``owner`` has none, or more than one (the sentence lists up to ``MAX_LISTED_IDS``
            ids, sorted).
    """
    mine = sorted((i for i in instances if i.owner == owner), key=lambda i: i.instance_id)
    if pinned is not None:
        for instance in mine:
            if instance.instance_id == pinned:
                return instance
        named = f"manager instance {pinned}" if is_lifecycle_uid(pinned) else "the pinned manager instance"
        raise SelectionRefused(f"{named} is not live or not registered to you - {_PINNED_REMEDY}", pinned=True, kind="pinned")
    if len(mine) == 1:
        return mine[0]
    if not mine:
        raise SelectionRefused(
            f"no live manager instance is registered to you - {_START_REMEDY}, then exchange again",
            pinned=False, kind="none",
        )
    ids = ", ".join(i.instance_id for i in mine[:MAX_LISTED_IDS])
    more = f" and {len(mine) - MAX_LISTED_IDS} more" if len(mine) > MAX_LISTED_IDS else ""
    raise SelectionRefused(
        f"{len(mine)} live manager instances are registered to you ({ids}{more}), so none was chosen - {_PICK_REMEDY}",
        pinned=False, kind="ambiguous",
    )
