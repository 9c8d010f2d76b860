"""Static credentials: the record of what was minted, expiry, ``--replace``, and doctor's verdicts.

Spec "Credential authority", section "Provisioning"; issue 6 items 3 and 4; docs/static-credentials.md.
A static space (``cotal space add NAME --static``) has no callout, so its clients connect with
a ``.creds`` file the root holder mints out of band (``cotal auth mint``). Every such file is
recorded under a **label** (the actor grammar, ``[A-Za-z0-9_]{1,64}``) so it can be listed,
replaced and revoked. A label's record holds its current credential and the ones it replaced
that can still connect (no expiry and not revoked), so none is ever forgotten while it works.

Rules, all pure (the shell passes ``now`` in unix seconds):

* **Lifetime**: 24 h by default; ``--expires-in`` seconds, ``--expires-at`` unix seconds, or
  ``--no-expiry``; at most one of them (:func:`choose_expiry`).
* **Replace**: a label's credential is replaced only with ``--replace``, and only once it has
  expired, when it has no expiry, or when its key was revoked (:func:`check_replace`).
* **Renewal** (spec "Issued authority"): a near-expiry static agent that carries an issued
  generation before its horizon is renewed in place (:func:`renew_command`, ``cotal auth renew``);
  one without, or past its horizon, is minted again with ``--identity``.
* **Health** (:func:`classify`): ``expired`` at or after ``exp``; ``near-expiry`` with less than
  10 % of its lifetime left; ``no-expiry`` (a warning: minted on purpose with
  ``--no-expiry``); ``revoked``; ``pending`` (a live standalone caller whose mint did not
  finish); else ``healthy``. A replaced credential that can still connect
  forever is a finding (:func:`unbounded_replaced`).
* **Revocation**: NATS refuses a user JWT whose ``iat`` is at or before the time its account's
  ``revocations`` map lists for its key. So a revoked key stays usable for a later JWT (``--identity``)
  whose ``iat`` is later (:func:`issue_time`); :func:`revocations` is the map the data account
  carries.
* **Standalone callers** (spec "Standalone callers"; :mod:`cotal_trio.core.callers`): a credential
  minted with ``--endpoint`` also records its ``endpoint``, the surface digest and verbs it was
  minted from, and ``pending`` while its mint is between the private issuance intent and the
  handed-out file. A live pending credential refuses every later mint of its label, naming the
  interrupted lifecycle UID, whether its file is there, and the remedy (:func:`check_replace`,
  :func:`interrupted_sentence`), so an interrupted mint is never replayed blindly.
* **Principal**: a static space has one owner, the root holding its signing key:
  :func:`static_owner` derives it like any owner, from the space's owner secret, with the fixed
  issuer ``cotal:static`` and subject ``root``. A fresh mint's actor is its label.

Pure and synchronous: no clock, no file, no randomness (keys, nonces and UIDs come in as values).
"""

from __future__ import annotations

import enum
import re
import shlex
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from . import natsjwt
from .errors import CodecError, ConfigError
from .identity import (
    derive_owner,
    is_actor,
    is_channel_pattern,
    is_inbox_nonce,
    is_lifecycle_uid,
    is_owner,
    is_role,
    is_space,
    principal,
)
from .nkeys import Prefix, looks_like_public_key
from .sessions import is_endpoint
from .issued import horizon_of, is_accepted_token, is_generation

__all__ = [
    "DEFAULT_LIFETIME_S",
    "NEAR_EXPIRY_FRACTION",
    "PROFILES",
    "Credential",
    "Finding",
    "Health",
    "LabelRecord",
    "Severity",
    "choose_expiry",
    "check_label",
    "check_replace",
    "classify",
    "credential_claims",
    "credential_tags",
    "credential_findings",
    "describe_state",
    "interrupted_sentence",
    "issue_time",
    "mint_command",
    "renew_command",
    "principal_of_claims",
    "receipt",
    "revocations",
    "static_owner",
    "missing_revocations",
    "unbounded_replaced",
    "verdict",
    "with_revocations",
]

DEFAULT_LIFETIME_S = 24 * 3600
# The latest expiry a credential may carry: 9999-12-31T23:59:59Z (later ones overflow time codecs).
MAX_EXPIRES_AT = 253402300799
# Near expiry: less than this share of the lifetime left (a short credential minted on purpose
# is healthy when minted).
NEAR_EXPIRY_FRACTION = 0.1
PROFILES = ("agent", "observer", "admin")
# A static space's one owner: derive_owner(owner secret, STATIC_ISSUER, STATIC_SUBJECT).
STATIC_ISSUER = "cotal:static"
STATIC_SUBJECT = "root"
RECORD_VERSION = 1


def static_owner(owner_secret: bytes) -> str:
    """The owner of every principal minted in a static space (module docstring)."""
    return derive_owner(owner_secret, STATIC_ISSUER, STATIC_SUBJECT)


def check_label(label: object) -> str:
    """``label`` if it is a label (``[A-Za-z0-9_]{1,64}``, the actor grammar); else ConfigError."""
    if not is_actor(label):
        raise ConfigError("--label is 1 to 64 letters, digits and _ (it names the credential and its actor)")
    return label  # type: ignore[return-value]


def choose_expiry(
    *, now: int, expires_in: int | None, expires_at: int | None, no_expiry: bool
) -> int | None:
    """The credential's ``exp`` in unix seconds, or None for ``--no-expiry``.

    Raises:
        ConfigError: more than one of the three flags, ``--expires-in`` not above 0, or
            ``--expires-at`` not after ``now``.
    """
    given = [name for name, on in (("--expires-in", expires_in is not None),
                                   ("--expires-at", expires_at is not None),
                                   ("--no-expiry", no_expiry)) if on]  # fmt: skip
    if len(given) > 1:
        raise ConfigError(f"{' and '.join(given)} both set the lifetime - pass at most one of them")
    if expires_in is not None:
        if expires_in <= 0:
            raise ConfigError(f"--expires-in {expires_in} is not a lifetime - pass seconds above 0")
        return _bounded(now + expires_in, "--expires-in")
    if expires_at is not None:
        if expires_at <= now:
            raise ConfigError(f"--expires-at {expires_at} is not in the future (now is {now}) - pass a later unix time")
        return _bounded(expires_at, "--expires-at")
    return None if no_expiry else now + DEFAULT_LIFETIME_S


def _bounded(exp: int, flag: str) -> int:
    """``exp`` when it is before :data:`MAX_EXPIRES_AT` (a date every clock and codec can write).

    Raises:
        ConfigError: later than that; names ``--no-expiry`` for a credential meant to last.
    """
    if exp > MAX_EXPIRES_AT:
        raise ConfigError(
            f"{flag} ends after {MAX_EXPIRES_AT} (9999-12-31) - pass an earlier time, or --no-expiry for a credential that never expires"
        )
    return exp


# -- the record ---------------------------------------------------------------------------------


def _bad(why: str) -> CodecError:
    return CodecError(f"a credential record {why}")


def _is_time(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


@dataclass(frozen=True, slots=True, kw_only=True)
class Credential:
    """One minted ``.creds`` file, as its record keeps it (no secret: the seed is in the file only).

    Attributes:
        label: the record's label.
        space: the static space it connects to.
        profile: ``agent``, ``observer`` or ``admin``.
        owner, actor: its principal ``<owner>.<actor>``.
        lifecycle_uid: this incarnation (a new one at every mint, ``--identity`` included).
        user_key: the user's public nkey, the JWT's ``sub``.
        issued_at, expires_at: unix seconds; ``expires_at`` None for ``--no-expiry``.
        path: where the file was written (absolute).
        inbox_nonce: the agent's reply inbox is ``_INBOX_<nonce>``.
        role, allow_publish, allow_subscribe: the agent's flags as minted.
        revoked_at: unix seconds it was revoked with ``cotal auth revoke-credential``, or None.
        endpoint: a standalone caller's endpoint (``--endpoint``), else None; then also
            ``surface_digest`` (``sha256:<hex>``), ``verbs`` (the surface's, in its order) and
            ``pending`` (True from before its issuance intent until its file is written). A
            standalone caller is an ``agent`` with no role, the same read and post channels, and
            an expiry. Records without these fields (older ones) read as None, (), False.

    Raises:
        CodecError: a field breaks its grammar (so a record read back is never half-valid).
    """

    label: str
    space: str
    profile: str
    owner: str
    actor: str
    lifecycle_uid: str
    user_key: str
    issued_at: int
    expires_at: int | None
    path: str
    inbox_nonce: str
    role: str | None = None
    allow_publish: tuple[str, ...] = ()
    allow_subscribe: tuple[str, ...] = ()
    revoked_at: int | None = None
    endpoint: str | None = None
    surface_digest: str | None = None
    verbs: tuple[str, ...] = ()
    pending: bool = False
    generation: str | None = None
    accepted_token: str | None = None

    def __post_init__(self) -> None:
        checks = (
            (is_actor(self.label), "label"), (is_space(self.space), "space"),
            (self.profile in PROFILES, "profile"), (is_owner(self.owner), "owner"),
            (is_actor(self.actor), "actor"), (is_lifecycle_uid(self.lifecycle_uid), "lifecycle UID"),
            (looks_like_public_key(self.user_key, Prefix.USER), "user key"),
            (_is_time(self.issued_at), "issue time"),
            (self.expires_at is None or (_is_time(self.expires_at) and self.expires_at > self.issued_at), "expiry"),
            (isinstance(self.path, str) and bool(self.path), "path"),
            (is_inbox_nonce(self.inbox_nonce), "inbox nonce"),
            (self.role is None or is_role(self.role), "role"),
            (_patterns(self.allow_publish) and _patterns(self.allow_subscribe), "channel list"),
            (self.revoked_at is None or _is_time(self.revoked_at), "revocation time"),
            (self.endpoint is None or self._caller_ok(), "standalone caller"),
            (self.endpoint is not None or (self.surface_digest, self.verbs, self.pending) == (None, (), False), "endpoint"),
            (self.generation is None and self.accepted_token is None or self._issued_ok(), "issued generation"),
        )  # fmt: skip
        for ok, what in checks:
            if not ok:
                raise _bad(f"has a malformed {what}")

    def _caller_ok(self) -> bool:
        """A standalone caller's fields: an endpoint, a digest, 1+ distinct verbs, an agent with no
        role, the same read and post channels, and an expiry."""
        verbs = self.verbs
        return (
            is_endpoint(self.endpoint) and self.endpoint != "v1" and isinstance(self.surface_digest, str)
            and _DIGEST.fullmatch(self.surface_digest) is not None and isinstance(verbs, tuple) and bool(verbs)
            and all(is_endpoint(v) for v in verbs) and len(set(verbs)) == len(verbs) and type(self.pending) is bool
            and self.profile == "agent" and self.role is None and self.allow_publish == self.allow_subscribe
            and self.expires_at is not None
        )  # fmt: skip

    def _issued_ok(self) -> bool:
        """A static agent's issuance (spec "Issued authority"): a generation and the accepted
        token chosen at its mint, on an agent that is no standalone caller."""
        return (
            is_generation(self.generation) and is_accepted_token(self.accepted_token) and self.profile == "agent"
            and self.endpoint is None
        )  # fmt: skip

    @property
    def principal(self) -> str:
        """``<owner>.<actor>``."""
        return principal(self.owner, self.actor)

    def to_json(self) -> dict[str, Any]:
        """The record's JSON object (camelCase); a standalone caller's adds ``endpoint``,
        ``surfaceDigest``, ``verbs`` and ``pending``."""
        obj = {
            "label": self.label, "space": self.space, "profile": self.profile, "owner": self.owner,
            "actor": self.actor, "lifecycleUid": self.lifecycle_uid, "userKey": self.user_key,
            "issuedAt": self.issued_at, "expiresAt": self.expires_at, "path": self.path,
            "inboxNonce": self.inbox_nonce, "role": self.role, "allowPublish": list(self.allow_publish),
            "allowSubscribe": list(self.allow_subscribe), "revokedAt": self.revoked_at,
        }  # fmt: skip
        if self.endpoint is not None:
            obj |= {"endpoint": self.endpoint, "surfaceDigest": self.surface_digest, "verbs": list(self.verbs),
                    "pending": self.pending}  # fmt: skip
        if self.generation is not None:
            obj |= {"generation": self.generation, "acceptedToken": self.accepted_token}
        return obj

    @classmethod
    def from_json(cls, obj: object) -> Credential:
        """Read :meth:`to_json`'s form back.

        Raises:
            CodecError: not an object of exactly those fields, or a field is malformed.
        """
        if not isinstance(obj, dict) or set(obj) not in (_FIELDS, _FIELDS | _CALLER_FIELDS, _FIELDS | _ISSUED_FIELDS):
            raise _bad("is not an object of the credential fields")
        caller: dict[str, Any] = {}
        if "endpoint" in obj:
            caller = {"endpoint": obj["endpoint"], "surface_digest": obj["surfaceDigest"],
                      "verbs": _tuple(obj["verbs"]), "pending": obj["pending"]}  # fmt: skip
        if "generation" in obj:
            caller = {"generation": obj["generation"], "accepted_token": obj["acceptedToken"]}
        try:
            return cls(
                label=obj["label"], space=obj["space"], profile=obj["profile"], owner=obj["owner"],
                actor=obj["actor"], lifecycle_uid=obj["lifecycleUid"], user_key=obj["userKey"],
                issued_at=obj["issuedAt"], expires_at=obj["expiresAt"], path=obj["path"],
                inbox_nonce=obj["inboxNonce"], role=obj["role"], allow_publish=_tuple(obj["allowPublish"]),
                allow_subscribe=_tuple(obj["allowSubscribe"]), revoked_at=obj["revokedAt"], **caller,
            )  # fmt: skip
        except TypeError:
            raise _bad("has a field of the wrong type") from None


_FIELDS = {
    "label", "space", "profile", "owner", "actor", "lifecycleUid", "userKey", "issuedAt", "expiresAt",
    "path", "inboxNonce", "role", "allowPublish", "allowSubscribe", "revokedAt",
}
_CALLER_FIELDS = {"endpoint", "surfaceDigest", "verbs", "pending"}
_ISSUED_FIELDS = {"generation", "acceptedToken"}
_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")


def _patterns(value: object) -> bool:
    return isinstance(value, tuple) and all(is_channel_pattern(p) for p in value)


def _tuple(value: object) -> tuple[Any, ...]:
    if not isinstance(value, list):
        raise _bad("has a list field that is not a list")
    return tuple(value)


@dataclass(frozen=True, slots=True, kw_only=True)
class LabelRecord:
    """A label's credentials: the current one, and replaced ones that can still connect forever.

    Raises:
        CodecError: a credential belongs to another label or space.
    """

    current: Credential
    replaced: tuple[Credential, ...] = field(default=())

    def __post_init__(self) -> None:
        for old in self.replaced:
            if (old.label, old.space) != (self.current.label, self.current.space):
                raise _bad("mixes the credentials of two labels")

    @property
    def label(self) -> str:
        return self.current.label

    def all(self) -> tuple[Credential, ...]:
        """The current credential, then the replaced ones."""
        return (self.current, *self.replaced)

    def replace_with(self, fresh: Credential, *, now: int) -> LabelRecord:
        """The record once ``fresh`` replaces the current credential.

        Every credential from before that has not expired is kept: a revoked one because the
        account's revocations are rebuilt from the records (:func:`revocations`), an unbounded
        unrevoked one because it still connects and doctor reports it. Expired ones are dropped.
        """
        kept = tuple(c for c in self.all() if c.expires_at is None or c.expires_at > now)
        return LabelRecord(current=fresh, replaced=kept)

    def to_json(self) -> dict[str, Any]:
        return {"ver": RECORD_VERSION, "current": self.current.to_json(),
                "replaced": [c.to_json() for c in self.replaced]}  # fmt: skip

    @classmethod
    def from_json(cls, obj: object) -> LabelRecord:
        """Read :meth:`to_json`'s form back.

        Raises:
            CodecError: another version, or a malformed credential.
        """
        if not isinstance(obj, dict) or obj.get("ver") != RECORD_VERSION or not isinstance(obj.get("replaced"), list):
            raise _bad(f"is not a version {RECORD_VERSION} record")
        return cls(current=Credential.from_json(obj.get("current")),
                   replaced=tuple(Credential.from_json(c) for c in obj["replaced"]))  # fmt: skip


# -- the rules ------------------------------------------------------------------------------------


class Health(enum.StrEnum):
    """What doctor says of one credential."""

    HEALTHY = "healthy"
    NEAR_EXPIRY = "near-expiry"
    EXPIRED = "expired"
    NO_EXPIRY = "no-expiry"
    REVOKED = "revoked"
    PENDING = "pending"


def classify(cred: Credential, *, now: int) -> Health:
    """The health of ``cred`` at ``now`` (module docstring); a live standalone caller whose mint
    did not finish is ``pending``."""
    if cred.revoked_at is not None:
        return Health.REVOKED
    if cred.expires_at is None:
        return Health.NO_EXPIRY
    left = cred.expires_at - now
    if left <= 0:
        return Health.EXPIRED
    if cred.pending:
        return Health.PENDING
    lifetime = cred.expires_at - cred.issued_at
    if left < NEAR_EXPIRY_FRACTION * lifetime:
        return Health.NEAR_EXPIRY
    return Health.HEALTHY


def describe_state(cred: Credential, *, now: int) -> str:
    """A few words on why a credential can or cannot be replaced (used in refusals)."""
    health = classify(cred, now=now)
    if health is Health.REVOKED:
        return f"its key was revoked at {cred.revoked_at}"
    if health is Health.NO_EXPIRY:
        return "it has no expiry"
    if health is Health.EXPIRED:
        return f"it expired at {cred.expires_at}"
    return f"it is live until {cred.expires_at} ({cred.expires_at - now} s left)"  # type: ignore[operator]


def check_replace(record: LabelRecord | None, *, replace: bool, space: str, now: int, pending_file: bool = False) -> None:
    """Whether a mint may write the label of ``record`` (None: the label is new).

    ``--replace`` on a new label mints it (nothing to replace).

    Raises:
        ConfigError: the label's live credential is a standalone caller whose mint was
            interrupted (``pending``: its intent may exist), named with its lifecycle UID, whether
            its file is there (``pending_file``: the shell looked at its path) and the remedy
            (:func:`interrupted_sentence`); the label has a credential and ``replace`` is
            not set (the sentence names ``--replace`` when it would be allowed); or ``replace`` is
            set and the credential is live with an expiry and an unrevoked key.
    """
    if record is None:
        return
    cred, label = record.current, record.label
    state = describe_state(cred, now=now)
    live = classify(cred, now=now) in (Health.HEALTHY, Health.NEAR_EXPIRY, Health.PENDING)
    if live and cred.pending:
        raise ConfigError(interrupted_sentence(cred, file_exists=pending_file))
    if live:
        raise ConfigError(
            f"label {label} already has a live credential, which cannot be replaced: {state} - revoke it first "
            f"with `cotal auth revoke-credential {label} --space {space}`, or choose another --label"
        )
    if not replace:
        raise ConfigError(f"label {label} already has a credential ({state}) - pass --replace to replace it")


def interrupted_sentence(cred: Credential, *, file_exists: bool) -> str:
    """Why a label whose standalone-caller mint did not finish refuses another mint, and the fix.

    Args:
        cred: the pending credential; file_exists: whether a file is at its path (then it is
            usable until revoked, and the sentence says so).

    Spec "Standalone callers" ("blocks blind replay after interruption").
    """
    head = f"the mint of label {cred.label} (lifecycle {cred.lifecycle_uid}, endpoint {cred.endpoint})"
    remedy = f"run `cotal auth revoke-credential {cred.label} --space {cred.space}`, then mint again with --replace"
    if file_exists:
        return (f"{head} did not finish: its file {cred.path} was written but never recorded as handed out, and it "
                f"connects until revoked - {remedy}")  # fmt: skip
    return (f"{head} was interrupted after its issuance intent: the intent may exist but the file was never handed out, "
            f"and the mint is not run again blindly - {remedy}")  # fmt: skip


def issue_time(record: LabelRecord | None, user_key: str, *, now: int) -> int:
    """The ``iat`` of a new JWT for ``user_key``: ``now``, or one second past every earlier JWT
    and revocation of that key in ``record``, so an earlier revocation of the key (``--identity``
    after ``cotal auth revoke-credential``) never reaches the new JWT."""
    times = [now]
    for cred in record.all() if record is not None else ():
        if cred.user_key == user_key:
            times += [cred.issued_at + 1, (cred.revoked_at or 0) + 1]
    return max(times)


def revocations(records: Iterable[LabelRecord], *, now: int) -> dict[str, int]:
    """The data account's ``revocations``: user key -> the latest revocation time of its JWTs.

    A revoked credential that has expired is left out (the broker refuses it anyway).
    """
    revoked: dict[str, int] = {}
    for record in records:
        for cred in record.all():
            if cred.revoked_at is None or (cred.expires_at is not None and cred.expires_at <= now):
                continue
            revoked[cred.user_key] = max(revoked.get(cred.user_key, 0), cred.revoked_at)
    return dict(sorted(revoked.items()))


def unbounded_replaced(record: LabelRecord) -> tuple[Credential, ...]:
    """The replaced credentials of ``record`` that can still connect forever (a finding)."""
    return tuple(c for c in record.replaced if c.expires_at is None and c.revoked_at is None)


def with_revocations(account: Mapping[str, Any], revoked: Mapping[str, int]) -> dict[str, Any]:
    """An account JWT's claims, ready to sign again, carrying exactly ``revoked``.

    ``iss``, ``iat`` and ``jti`` are dropped (:func:`cotal_trio.core.natsjwt.encode` adds them);
    everything else is kept as it was; an empty map removes ``nats.revocations``.
    """
    claims = {k: v for k, v in account.items() if k not in ("iss", "iat", "jti")}
    nats = {k: v for k, v in claims["nats"].items() if k != "revocations"}
    if revoked:
        nats["revocations"] = dict(revoked)
    claims["nats"] = nats
    return claims


def missing_revocations(account: Mapping[str, Any], revoked: Mapping[str, int]) -> dict[str, int]:
    """The entries of ``revoked`` an account's claims do not carry (or carry with an earlier time)."""
    nats = account.get("nats")
    held = nats.get("revocations") if isinstance(nats, dict) else None
    held = held if isinstance(held, dict) else {}
    return {key: at for key, at in revoked.items() if not (isinstance(held.get(key), int) and held[key] >= at)}


# -- the JWT and the receipt --------------------------------------------------------------------


def credential_claims(cred: Credential, *, data_account: str, permissions: Mapping[str, Any]) -> dict[str, Any]:
    """The user claims of ``cred`` (sign with a data-account signing key at ``cred.issued_at``).

    ``name`` is ``<owner>-<actor>`` and the tags ``owner:``, ``actor:``, ``principal:`` as the
    callout's users (:func:`cotal_trio.core.callout.mint_user_jwt`), plus ``profile:``,
    ``lifecycle:`` and ``label:``.
    """
    return natsjwt.user_claims(
        user=cred.user_key, name=f"{cred.owner}-{cred.actor}", issuer_account=data_account,
        permissions=permissions, exp=cred.expires_at,
        tags=credential_tags(owner=cred.owner, actor=cred.actor, profile=cred.profile, uid=cred.lifecycle_uid,
                             label=cred.label),
    )  # fmt: skip


def credential_tags(*, owner: str, actor: str, profile: str, uid: str, label: str) -> tuple[str, ...]:
    """A minted credential's JWT tags, in order: ``owner:``, ``actor:``, ``principal:``,
    ``profile:``, ``lifecycle:``, ``label:`` (the host check of a standalone caller rebuilds them)."""
    return (f"owner:{owner}", f"actor:{actor}", f"principal:{principal(owner, actor)}", f"profile:{profile}",
            f"lifecycle:{uid}", f"label:{label}")  # fmt: skip


def principal_of_claims(claims: Mapping[str, Any]) -> tuple[str, str]:
    """``(owner, actor)`` from a minted credential's ``principal:`` tag (for ``--identity``).

    Raises:
        ConfigError: no ``principal:`` tag naming ``<owner>.<actor>``.
    """
    nats = claims.get("nats")
    tags = nats.get("tags") if isinstance(nats, dict) else None
    for tag in tags if isinstance(tags, list) else ():
        if isinstance(tag, str) and tag.startswith("principal:"):
            owner, _, actor = tag.removeprefix("principal:").partition(".")
            if is_owner(owner) and is_actor(actor):
                return owner, actor
    raise ConfigError("the --identity credential names no principal (no principal:<owner>.<actor> tag) - "
                      "pass a file `cotal auth mint` wrote")  # fmt: skip


def receipt(cred: Credential, *, replaced: bool) -> dict[str, Any]:
    """What ``cotal auth mint`` prints (``--json``): no secret, everything a client needs; a
    standalone caller's adds ``endpoint``, ``surfaceDigest``, ``verbs`` and ``channels``."""
    obj = {
        "space": cred.space, "label": cred.label, "principal": cred.principal, "profile": cred.profile,
        "lifecycleUid": cred.lifecycle_uid, "userKey": cred.user_key, "issuedAt": cred.issued_at,
        "expiresAt": cred.expires_at, "path": cred.path, "inboxPrefix": f"_INBOX_{cred.inbox_nonce}",
        "replaced": replaced,
    }  # fmt: skip
    if cred.endpoint is not None:
        obj |= {"endpoint": cred.endpoint, "surfaceDigest": cred.surface_digest, "verbs": list(cred.verbs),
                "channels": list(cred.allow_publish)}  # fmt: skip
    if cred.generation is not None:
        obj |= {"generation": cred.generation, "acceptedToken": cred.accepted_token,
                "horizon": horizon_of(cred.generation)}  # fmt: skip
    return obj


# -- doctor ---------------------------------------------------------------------------------------


class Severity(enum.StrEnum):
    """A warning leaves the root healthy; a finding does not."""

    WARNING = "warning"
    FINDING = "finding"


@dataclass(frozen=True, slots=True, kw_only=True)
class Finding:
    """Something ``cotal doctor auth`` reports.

    Attributes:
        severity: warning or finding.
        subject: what it is about (a label, a file, a space).
        problem: what is wrong, in words.
        next: the command (or step) that fixes it.
    """

    severity: Severity
    subject: str
    problem: str
    next: str

    def to_json(self) -> dict[str, str]:
        return {"severity": self.severity.value, "subject": self.subject, "problem": self.problem, "next": self.next}


def mint_command(cred: Credential, *, flags: str, identity: str | None = None) -> str:
    """The ``cotal auth mint ... --replace`` that mints ``cred`` again with the same grant and lifetime.

    Args:
        flags: ``--space <s>`` (and ``--root <r>``), shell-quoted by the caller.
        identity: the shell-quoted path of the current file, to keep its nkey and principal
            (ignored for a standalone caller: ``--identity`` is refused with ``--endpoint``).
    """
    parts = ["cotal auth mint", flags, f"--profile {cred.profile}", f"--label {cred.label}"]
    if cred.endpoint is not None:  # a standalone caller: --identity is refused with --endpoint
        parts += [f"--endpoint {cred.endpoint}", f"--out {shlex.quote(cred.path)}"]
        if cred.allow_publish:
            parts.append(f"--channels {shlex.quote(','.join(cred.allow_publish))}")
        identity = None
    elif cred.allow_publish:
        parts.append(f"--allow-publish {shlex.quote(','.join(cred.allow_publish))}")  # `tasks.>` is a redirect
    if cred.allow_subscribe and cred.endpoint is None:
        parts.append(f"--allow-subscribe {shlex.quote(','.join(cred.allow_subscribe))}")
    if cred.role is not None:
        parts.append(f"--role {cred.role}")
    if cred.expires_at is None:
        parts.append("--no-expiry")
    elif cred.expires_at - cred.issued_at != DEFAULT_LIFETIME_S:
        parts.append(f"--expires-in {cred.expires_at - cred.issued_at}")
    if identity is not None:
        parts.append(f"--identity {identity}")
    return " ".join([*parts, "--replace"])


def renew_command(cred: Credential, *, flags: str) -> str:
    """The ``cotal auth renew`` that renews an issued static agent's ``cred`` with the same
    lifetime (it keeps its generation: the same ceiling; spec "Issued authority").

    Args:
        flags: ``--space <s>`` (and ``--root <r>``), shell-quoted by the caller.
    """
    parts = ["cotal auth renew", cred.label, flags]
    if cred.expires_at is not None and cred.expires_at - cred.issued_at != DEFAULT_LIFETIME_S:
        parts.append(f"--expires-in {cred.expires_at - cred.issued_at}")
    return " ".join(parts)


def credential_findings(record: LabelRecord, *, now: int, flags: str, identity: str | None) -> list[Finding]:
    """What doctor says of one label's record (module docstring, "Health").

    Args:
        flags: ``--space <s>`` (and ``--root <r>``), shell-quoted.
        identity: the shell-quoted path of the label's current file when it is there, else None.
    """
    cred, label = record.current, record.label
    subject = f"credential {label} (space {cred.space})"
    revoke = f"cotal auth revoke-credential {label} {flags}"
    health = classify(cred, now=now)
    found: list[Finding] = []
    if health is Health.PENDING:
        mint = f"its standalone-caller mint (lifecycle {cred.lifecycle_uid})"
        problem = (f"{mint} did not finish: its file was written but never recorded as handed out, and it connects until "
                   "revoked") if identity is not None else f"{mint} was interrupted after its issuance intent; its file was never handed out"  # fmt: skip
        found.append(Finding(severity=Severity.FINDING, subject=subject, problem=problem,
                             next=f"{revoke} && {mint_command(cred, flags=flags)}"))  # fmt: skip
        return found
    if health is Health.EXPIRED:
        found.append(Finding(severity=Severity.FINDING, subject=subject, problem=f"expired at {cred.expires_at}",
                             next=mint_command(cred, flags=flags)))
    elif health is Health.NEAR_EXPIRY:
        renewable = cred.generation is not None and now < horizon_of(cred.generation)
        found.append(Finding(
            severity=Severity.FINDING, subject=subject,
            problem=f"expires at {cred.expires_at}, in {cred.expires_at - now} s",  # type: ignore[operator]
            next=renew_command(cred, flags=flags) if renewable else f"{revoke} && {mint_command(cred, flags=flags, identity=identity)}",
        ))
    elif health is Health.NO_EXPIRY:
        found.append(Finding(
            severity=Severity.WARNING, subject=subject,
            problem="minted with --no-expiry: it connects until its key is revoked", next=revoke,
        ))
    for old in unbounded_replaced(record):
        found.append(Finding(
            severity=Severity.FINDING, subject=f"replaced credential {label} key {old.user_key} (space {cred.space})",
            problem="has no expiry and was never revoked: it still connects",
            next=f"{revoke} --key {old.user_key}",
        ))
    return found


def verdict(findings: Iterable[Finding]) -> tuple[bool, str]:
    """``(healthy, last line)``: ``healthy``, or the first finding's next command."""
    for finding in findings:
        if finding.severity is Severity.FINDING:
            return False, f"next: {finding.next}"
    return True, "healthy"
