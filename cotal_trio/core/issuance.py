"""Issuance rows: the callout's record of each user JWT it mints (DESIGN.md 6 step 6, section 8).

Before the auth callout answers a mint it creates, create-only, the row
``natkey.<owner>.<actor>.<user nkey>`` in the space's auth bucket ``cotal_auth_<space>``, then
checks the actor's authority again and only then answers (upstream-notes 2.4 item 7; issue 4
item 6). Callout replicas write these rows too (spec "Callout replicas": a replica "creates each
connect's issuance row"). The broker generates a fresh user nkey for every connect, so a row
that already exists means the request was answered before, and the connect is denied.

Key. Upstream keys the row ``natkey.<user nkey>`` (upstream-notes 2.4 item 7); this service puts
the principal in the key, ``natkey.<owner>.<actor>.<user nkey>`` (owner and actor are single
subject tokens), so retiring a lifecycle finds its principal's rows with one subject-filtered
listing, ``natkey.<owner>.<actor>.>`` (:func:`principal_rows`), and costs what that principal
has, not what the space has (issue 15 item 1). A user nkey is fresh per connect, so the key is
as unique as before and the replayed-request check is unchanged. Rows in the upstream form
(written by an earlier version of this service, or a replica not yet upgraded) are
:data:`LEGACY_ROWS`, ``natkey.*``: a key with exactly one token after ``natkey.``, so that
listing never matches a keyed-by-principal row. The withdrawal reads them too, and the prune
sweep lists ``natkey.>``, both forms.

Row (version 1, closed). Upstream describes only the content ("the bearer's
space/owner/actor/lifecycle/credential/view and the minted JWT's iat/exp", upstream-notes 11
lists the field names as a gap), so the names are ours, camelCase as every other row::

    {"ver": 1, "space": "alpha", "owner": "u_…", "actor": "cli",
     "lifecycleUid": "<the bearer's lifecycle UID>", "credentialId": null, "view": null,
     "iat": 1767225600, "exp": 1767225900}

``credentialId`` and ``view`` are the bearer's (``null`` while the exchange issues neither);
``iat`` and ``exp`` are the minted user JWT's, unix seconds.

Lifetime: a row is over ``EXPIRY_TOLERANCE_S`` after its ``exp`` (the JWT's expiry plus the
bearer clock skew, upstream "exp + clock tolerance"). It is written with a NATS per-message TTL
that ends then (:func:`row_ttl_s`), and the full service's sweep prunes any row past that point
at start and every ``PRUNE_EVERY_S`` (:func:`is_expired`).

Pure and synchronous: the lane (:mod:`cotal_trio.stores.issuance`) does the I/O.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .bearer import CLOCK_SKEW_S, KNOWN_VIEWS, ValidatedBearer, is_credential_id
from .callout import ConnectGrant
from .errors import CodecError
from .identity import is_actor, is_lifecycle_uid, is_owner, is_space
from .nkeys import Prefix, is_public_key
from .rowcodec import decode_row, encode_row

__all__ = [
    "EXPIRY_TOLERANCE_S",
    "ISSUANCE_KEY_PREFIX",
    "IssuanceRow",
    "LEGACY_ROWS",
    "PRUNE_EVERY_S",
    "ROW_VERSION",
    "exists_reason",
    "is_expired",
    "issuance_key",
    "issuance_row",
    "parse_row",
    "principal_prefix",
    "principal_rows",
    "render_row",
    "row_ttl_s",
    "store_missing_reason",
    "write_failed_reason",
]

ROW_VERSION = 1
ISSUANCE_KEY_PREFIX = "natkey."
# The keys of rows written in the upstream form ``natkey.<user nkey>`` (a KV key pattern).
LEGACY_ROWS = ISSUANCE_KEY_PREFIX + "*"
# Upstream prunes at start and every `nativeIssuancePruneMs` (default 60 s).
PRUNE_EVERY_S = 60.0
# A row outlives its JWT by the clock tolerance the bearer check allows (seconds).
EXPIRY_TOLERANCE_S = CLOCK_SKEW_S
_KEYS = ("ver", "space", "owner", "actor", "lifecycleUid", "credentialId", "view", "iat", "exp")


@dataclass(frozen=True, slots=True, kw_only=True)
class IssuanceRow:
    """One issuance row (its key, :func:`issuance_key`, is not part of it).

    Attributes:
        space: the space the connect was for.
        owner, actor: the principal the user JWT was minted for.
        lifecycle_uid: the bearer's lifecycle UID.
        credential_id: the bearer's ``act.credentialId``, or None.
        view: the bearer's ``act.view``, or None (no view is issued yet).
        iat, exp: the minted user JWT's issue and expiry times, unix seconds (``exp > iat``).

    Raises:
        CodecError: a field breaks its grammar; the message names it.
    """

    space: str
    owner: str
    actor: str
    lifecycle_uid: str
    credential_id: str | None
    view: str | None
    iat: int
    exp: int

    def __post_init__(self) -> None:
        _require(is_space(self.space), "space is not a space name")
        _require(is_owner(self.owner), "owner is not a derived owner")
        _require(is_actor(self.actor), "actor is not an actor name")
        _require(is_lifecycle_uid(self.lifecycle_uid), "lifecycleUid is malformed")
        _require(self.credential_id is None or is_credential_id(self.credential_id), "credentialId is malformed")
        _require(self.view is None or (isinstance(self.view, str) and self.view in KNOWN_VIEWS), "view is not a known view")
        _require(_is_seconds(self.iat) and _is_seconds(self.exp), "iat and exp must be whole unix seconds")
        _require(self.exp > self.iat, "exp must be after iat")


def _require(ok: bool, problem: str) -> None:
    if not ok:
        raise CodecError(f"issuance row: {problem}")


def _is_seconds(value: object) -> bool:
    return type(value) is int and value >= 0


def issuance_key(owner: str, actor: str, user_nkey: str) -> str:
    """``natkey.<owner>.<actor>.<user nkey>``: the key of the row minted for principal
    ``<owner>.<actor>`` under the broker-generated user key ``U…`` (module docstring, Key).

    Raises:
        CodecError: ``user_nkey`` is not a public user nkey (the broker's request is signed,
            so this is a broken request, never a client's input), or owner/actor break their
            grammar (never for a validated bearer's).
    """
    if not is_public_key(user_nkey, Prefix.USER):
        raise CodecError("issuance row: the request's user_nkey is not a public user nkey")
    return f"{principal_prefix(owner, actor)}{user_nkey}"


def principal_prefix(owner: str, actor: str) -> str:
    """``natkey.<owner>.<actor>.``: the key prefix of every row of that principal.

    Raises:
        CodecError: ``owner`` is not a derived owner or ``actor`` not an actor name.
    """
    _require(is_owner(owner), "owner is not a derived owner")
    _require(is_actor(actor), "actor is not an actor name")
    return f"{ISSUANCE_KEY_PREFIX}{owner}.{actor}."


def principal_rows(owner: str, actor: str) -> str:
    """``natkey.<owner>.<actor>.>``: the KV key pattern matching exactly that principal's rows
    (a subject filter: ``cli`` does not match ``cli2``).

    Raises:
        CodecError: as :func:`principal_prefix`.
    """
    return principal_prefix(owner, actor) + ">"


def issuance_row(bearer: ValidatedBearer, grant: ConnectGrant, *, space: str, iat: int) -> IssuanceRow:
    """The row for a connect about to be minted (DESIGN.md 6 step 6).

    Args:
        bearer: the connect's validated bearer (lifecycle UID, credential, view).
        grant: the decision the user JWT is minted from; its ``exp`` is the JWT's.
        space: this lane's space.
        iat: the ``now`` the user JWT is signed with (``mint_user_jwt(now=iat)``), unix seconds.
    """
    return IssuanceRow(
        space=space, owner=grant.owner, actor=grant.actor, lifecycle_uid=bearer.lifecycle_uid,
        credential_id=bearer.credential_id, view=bearer.view, iat=iat, exp=grant.exp,
    )


def render_row(row: IssuanceRow) -> bytes:
    """The row's stored bytes: compact JSON, keys in the documented order.

    ``parse_row(render_row(row)) == row``; the bytes also identify the row as this request's
    when the lane withdraws it.
    """
    obj = {
        "ver": ROW_VERSION, "space": row.space, "owner": row.owner, "actor": row.actor,
        "lifecycleUid": row.lifecycle_uid, "credentialId": row.credential_id, "view": row.view,
        "iat": row.iat, "exp": row.exp,
    }
    return encode_row(obj)


def parse_row(data: bytes) -> IssuanceRow:
    """Decode stored bytes.

    Raises:
        CodecError: not UTF-8 JSON, not an object with exactly the version-1 keys, or a field
            breaking its grammar.
    """
    obj = decode_row(data, what="issuance row", keys=_KEYS, version=ROW_VERSION)
    return IssuanceRow(
        space=obj["space"], owner=obj["owner"], actor=obj["actor"], lifecycle_uid=obj["lifecycleUid"],
        credential_id=obj["credentialId"], view=obj["view"], iat=obj["iat"], exp=obj["exp"],
    )


def is_expired(row: IssuanceRow, *, now: float) -> bool:
    """True once ``row`` may be pruned: ``now >= exp + EXPIRY_TOLERANCE_S`` (unix seconds)."""
    return now >= row.exp + EXPIRY_TOLERANCE_S


def row_ttl_s(row: IssuanceRow, *, now: float) -> int:
    """The row's per-message TTL written at ``now``: whole seconds (>= 1) until it expires."""
    return max(1, math.ceil(row.exp + EXPIRY_TOLERANCE_S - now))


def exists_reason(user_nkey: str) -> str:
    """The denial reason when the row is already there: this connect was answered before."""
    return (
        f"the issuance row of user key {user_nkey} already exists - the broker delivered this"
        " connect twice; connect again (the broker generates a new user key)"
    )


def write_failed_reason(space: str, detail: str) -> str:
    """The denial reason when the row could not be written (``detail``: the store's error)."""
    return (
        f"the issuance row could not be recorded in cotal_auth_{space} ({detail}) - check the"
        " broker's JetStream for this space's data account, then connect again"
    )


def store_missing_reason(space: str) -> str:
    """The denial reason when the space's auth store does not exist (a replica creates none)."""
    return (
        f"space {space} has no auth store cotal_auth_{space}, so the issuance row cannot be recorded"
        f" - start the full auth service for space {space} once (it creates the store)"
    )
