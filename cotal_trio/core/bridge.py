"""The IdP bridge: an IdP token becomes a Cotal bearer, in three steps (spec "Bridge contract").

1. **Bearer validation**: the IdP's JWT is verified offline against the pinned JWKS, EdDSA only,
   no embedded key headers, exact issuer and audience (:func:`cotal_trio.core.idp.verify_idp_token`).
2. **Owner derivation**: ``derive_owner(space secret, pinned issuer, sub)``; the encoding is
   frozen (:func:`cotal_trio.core.identity.derive_owner`).
3. **Actor authorization and mint**: the ``authorize_actor`` hook authorizes ``(owner, actor)``
   and is the only source of the bearer's scope and parent; the ``mint_connect_credential`` hook
   names the incarnation's live root credential id; the issuer signs.

Both hooks are **mandatory** (spec "Bridge contract"): a hosted composition wires its own ledger
and credential authority into :class:`IdpBridge`, and the stock service passes its ledger hook
(``http/faces.py`` ``stock_authorizer``: the fresh interactive row, decided by
:func:`~cotal_trio.core.ledger.authorize_human_exchange`) and :func:`no_root_credential`. The
proof's ``exp`` is read when the bearer is signed, after the hooks ran, so time spent in them
shortens the bearer instead of extending it, and an exchange whose proof expired meanwhile is
refused.

Synchronous and pure: the hooks are sync ports the shell supplies, and the clock is a port read
at the two moments the contract names (verification and signing). Nothing here reads a file.
Step 3's authorization is its own step between :meth:`IdpBridge.verify` and
:meth:`IdpBridge.admit`, so a shell on trio runs the ``authorize_actor`` hook (which may block on
a disk) in a worker thread while the decisions stay here (issue 15 item 7);
:meth:`IdpBridge.authenticate` runs the three in line for a synchronous composition.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from nacl.signing import VerifyKey

from .bearer import BearerGrant, issue_bearer
from .errors import ConfigError, RefusalCode, Refused
from .exchange import human_bearer_ttl
from .identity import MIN_OWNER_SECRET_BYTES, check_actor, derive_owner
from .idp import IdpIdentity, IdpPin, verify_idp_token
from .jose import IssuerKey
from .ledger import LedgerRow

__all__ = [
    "Authenticated",
    "AuthorizeActor",
    "ConnectCredentialRequest",
    "IdpBridge",
    "MintConnectCredential",
    "Minted",
    "Proven",
    "bounded_lifetime",
    "no_root_credential",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class ConnectCredentialRequest:
    """What ``mint_connect_credential`` is asked for: one incarnation of one principal.

    Attributes:
        owner: the derived owner ``u_…``.
        actor: the actor.
        lifecycle_uid: the incarnation's lifecycle UID, from the authorized ledger row.
    """

    owner: str
    actor: str
    lifecycle_uid: str


AuthorizeActor = Callable[[str, str], LedgerRow]
"""``authorize_actor(owner, actor) -> row``: the authorized interactive row (its scope, parent and
lifecycle UID become the bearer's); raises :class:`~cotal_trio.core.errors.Refused` NOT_GRANTED
with a sentence naming the fix when the pair is not granted."""

MintConnectCredential = Callable[[ConnectCredentialRequest], "str | None"]
"""``mint_connect_credential(request) -> credential id | None``: the incarnation's live root
credential id, bound into the bearer's ``act.credentialId``. The host finalizes durable authority
before it releases that id and returns the same id for the same incarnation (never a fresh one
per exchange); ``None`` when the composition keeps no root-credential ledger (the stock service)."""


def no_root_credential(request: ConnectCredentialRequest) -> None:
    """The stock ``mint_connect_credential``: this service keeps no root-credential ledger, so
    its bearers carry no ``credentialId`` (the lifecycle UID binds them to the incarnation)."""
    del request
    return None


def bounded_lifetime(lifetime: int, signed_at: int, *, cap_s: int | None, not_after: int | None, expired: str) -> int:
    """``lifetime`` (seconds) cut to ``cap_s`` and to end by ``not_after`` (unix seconds).

    Raises:
        Refused: NOT_GRANTED with ``expired`` when ``not_after`` is not after ``signed_at``.
    """
    if cap_s is not None:
        lifetime = min(lifetime, cap_s)
    if not_after is not None:
        if not_after <= signed_at:
            raise Refused(RefusalCode.NOT_GRANTED, expired or "the bearer's bound has passed - ask again")
        lifetime = min(lifetime, not_after - signed_at)
    return lifetime


@dataclass(frozen=True, slots=True, kw_only=True)
class Minted:
    """A successful exchange: the ``200`` body ``{"token", "owner", "exp"}``.

    Attributes:
        token: the Cotal bearer (compact JWS).
        owner: the bearer's owner ``u_…``.
        exp: the bearer's expiry, unix seconds.
        extra: more members of the body (``managerInstanceId`` for a manager-caller view).
    """

    token: str
    owner: str
    exp: int
    extra: Mapping[str, object] = field(default_factory=dict)

    def body(self) -> dict[str, object]:
        """The JSON response body."""
        return {"token": self.token, "owner": self.owner, "exp": self.exp, **self.extra}


@dataclass(frozen=True, slots=True, kw_only=True)
class Proven:
    """Steps 1 and 2 done: a verified proof and its derived owner, for the requested actor.

    Attributes:
        identity: the verified IdP token's claims.
        owner: the derived owner ``u_…``.
        actor: the requested actor (its grammar checked).
    """

    identity: IdpIdentity
    owner: str
    actor: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Authenticated:
    """Steps 1 to 3a done: a verified proof, its derived owner and the authorized row.

    Attributes:
        identity: the verified IdP token's claims (``exp`` bounds the bearer).
        owner: the derived owner.
        row: the row ``authorize_actor`` returned.
    """

    identity: IdpIdentity
    owner: str
    row: LedgerRow


@dataclass(frozen=True, slots=True, kw_only=True)
class IdpBridge:
    """``createIdpBridge`` for one space (spec "Bridge contract").

    Attributes:
        space: the space (bearer ``aud``).
        idp_pin: the pinned issuer, audience and JWKS URL; ``idp_pin.issuer`` keys owner derivation.
        idp_keys: ``() -> {kid: VerifyKey}``, the pinned JWKS as last fetched; sync.
        owner_secret: the space's owner-derivation secret, at least 32 bytes.
        issuer_key: the space's active bearer-signing key.
        authorize_actor: mandatory :data:`AuthorizeActor` hook.
        mint_connect_credential: mandatory :data:`MintConnectCredential` hook.
        clock: wall time, unix seconds; read at verification and again at signing.

    Raises:
        ConfigError: a hook is missing or not callable, or the owner secret is too short.
    """

    space: str
    idp_pin: IdpPin
    idp_keys: Callable[[], Mapping[str, VerifyKey]]
    owner_secret: bytes = field(repr=False)
    issuer_key: IssuerKey
    authorize_actor: AuthorizeActor
    mint_connect_credential: MintConnectCredential
    clock: Callable[[], float]

    def __post_init__(self) -> None:
        for hook in ("authorize_actor", "mint_connect_credential"):
            if not callable(getattr(self, hook)):
                raise ConfigError(f"the IdP bridge needs its {hook} hook - both hooks are mandatory (spec 'Bridge contract')")
        if not isinstance(self.owner_secret, bytes) or len(self.owner_secret) < MIN_OWNER_SECRET_BYTES:
            raise ConfigError("the owner secret must be at least 32 bytes - regenerate the space's secrets")

    def verify(self, id_token: str, actor: str, *, now: float) -> Proven:
        """Steps 1 and 2: check the actor's grammar, verify the proof, derive the owner.

        Pure: reads only :attr:`idp_keys` (the key set as last fetched). Runs before any
        ledger read, so a token the pins refuse costs no read.

        Args:
            id_token: the IdP JWT.
            actor: the requested actor.
            now: wall time, unix seconds, the proof is checked at.

        Raises:
            Refused: BAD_REQUEST for a bad actor; BAD_CREDENTIAL for a token the pins refuse.
        """
        check_actor(actor)
        identity = verify_idp_token(id_token, pin=self.idp_pin, keys=self.idp_keys(), now=now)
        owner = derive_owner(self.owner_secret, self.idp_pin.issuer, identity.sub)
        return Proven(identity=identity, owner=owner, actor=actor)

    def admit(self, proven: Proven, row: LedgerRow) -> Authenticated:
        """Step 3's authorization, given the row ``authorize_actor(proven.owner, proven.actor)``
        returned (the shell may have run the hook in a worker thread).

        Raises:
            Refused: NOT_GRANTED when the row is of another principal (a hook bug must not mint
                for someone else).
        """
        if row.owner != proven.owner or row.actor != proven.actor:
            raise Refused(RefusalCode.NOT_GRANTED, f'actor "{proven.actor}" is not granted for this user - ask the mesh operator')
        return Authenticated(identity=proven.identity, owner=proven.owner, row=row)

    def authenticate(self, id_token: str, actor: str, *, now: float) -> Authenticated:
        """Steps 1, 2 and the authorization of step 3 in line: :meth:`verify`, the
        ``authorize_actor`` hook, :meth:`admit` (for a synchronous composition).

        Raises:
            Refused: as :meth:`verify` and :meth:`admit`; NOT_GRANTED from ``authorize_actor``.
        """
        proven = self.verify(id_token, actor, now=now)
        return self.admit(proven, self.authorize_actor(proven.owner, proven.actor))

    def issue(
        self, auth: Authenticated, *, ttl_s: int | None, grant: Callable[[LedgerRow, str | None], BearerGrant] | None = None,
        cap_s: int | None = None, not_after: int | None = None, expired: str = "", extra: Mapping[str, object] | None = None,
    ) -> Minted:
        """The mint of step 3: credential hook, then sign dated by the clock read now.

        Args:
            auth: from :meth:`authenticate`.
            ttl_s: the requested lifetime, seconds, or None for the default (900).
            grant: ``(row, credential_id) -> BearerGrant``; default: the row's grant, no view.
            cap_s: a further lifetime cap in seconds (a view's), or None.
            not_after: unix seconds the bearer must end by (a chat session's ``exp``), or None.
            expired: the refusal sentence when ``not_after`` has passed at signing.
            extra: members added to the response body.

        Returns:
            The :class:`Minted` bearer; ``exp`` no later than the proof's ``exp``.

        Raises:
            Refused: BAD_CREDENTIAL when the proof expired before signing; NOT_GRANTED with
                ``expired`` when ``not_after`` had passed; what ``grant`` raises.
        """
        row = auth.row
        credential_id = self.mint_connect_credential(
            ConnectCredentialRequest(owner=auth.owner, actor=row.actor, lifecycle_uid=row.lifecycle_uid)
        )
        if grant is None:
            bearer_grant = BearerGrant(
                owner=row.owner, actor=row.actor, scope=row.scope, lifecycle_uid=row.lifecycle_uid,
                parent=row.parent, credential_id=credential_id,
            )  # fmt: skip
        else:
            bearer_grant = grant(row, credential_id)
        signed_at = int(self.clock())  # step 1: the proof's exp, read when it signs
        lifetime = human_bearer_ttl(ttl_s, auth.identity.exp, signed_at)
        lifetime = bounded_lifetime(lifetime, signed_at, cap_s=cap_s, not_after=not_after, expired=expired)
        token, exp = issue_bearer(bearer_grant, key=self.issuer_key, space=self.space, now=signed_at, ttl_s=lifetime)
        return Minted(token=token, owner=auth.owner, exp=exp, extra=dict(extra or {}))

    def exchange(self, id_token: str, actor: str, *, ttl_s: int | None = None) -> Minted:
        """The whole bridge in one call, for a hosted composition: :meth:`authenticate` at the
        clock's time, then :meth:`issue` with no view.

        Raises:
            Refused: as :meth:`authenticate` and :meth:`issue`.
        """
        return self.issue(self.authenticate(id_token, actor, now=self.clock()), ttl_s=ttl_s)
