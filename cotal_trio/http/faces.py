"""What an HTTP face needs to mint a bearer, and the exchange itself (DESIGN 7).

:class:`ExchangeContext` holds the ports one space's face uses. :func:`mint_exchange` runs one
``POST /exchange`` body through the pure core (upstream-notes 3.5; spec "Bridge contract"):

* **human arm** ``{idpToken, actor, ttlSec?}``: verify the IdP token against the pinned key set,
  derive the owner from the pinned issuer and ``sub``, read the principal's interactive row,
  authorize, cap the lifetime by the proof's ``exp``, issue;
* **agent arm** ``{owner, actor, actorToken, ttlSec?}``: read the principal's managed row,
  check the secret and the spawner envelope, cap the lifetime at 300 s, issue.

Both are synchronous: the ports are sync (the ledger read is a fresh small file read), and the
clock is read once by the caller.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from nacl.signing import VerifyKey

from cotal_trio.core.bearer import issue_bearer
from cotal_trio.core.jose import IssuerKey
from cotal_trio.core.errors import CodecError, ConfigError, RefusalCode, Refused
from cotal_trio.core.exchange import (
    AgentExchange,
    HumanExchange,
    agent_bearer_ttl,
    grant_from_row,
    human_bearer_ttl,
)
from cotal_trio.core.identity import MIN_OWNER_SECRET_BYTES, check_space, derive_owner
from cotal_trio.core.idp import IdpPin, verify_idp_token
from cotal_trio.core.ledger import (
    AGENT_EXCHANGE_REFUSAL,
    LedgerRow,
    ReadRows,
    authorize_agent_exchange,
    authorize_human_exchange,
)
from cotal_trio.state import row_lookup

__all__ = ["ExchangeContext", "Minted", "exchange_arm", "mint_exchange"]

_CAPABILITY = re.compile(r"[0-9a-f]{64}")


@dataclass(frozen=True, slots=True, kw_only=True)
class ExchangeContext:
    """The ports one space's HTTP face needs (DESIGN 7).

    Attributes:
        space: the space name (bearer ``aud``; ``iss`` is ``urn:cotal:auth:<space>``).
        capability: the loopback exchange capability, 64 lowercase hex (upstream-notes 4.1);
            published only in the 0600 ``auth-service.json``.
        issuer_key: the space's active bearer-signing key.
        owner_secret: the space's owner-derivation secret, at least 32 bytes.
        idp_pin: the pinned IdP coordinates; ``idp_pin.issuer`` keys owner derivation.
        idp_keys: returns the current pinned IdP key set ``{kid: VerifyKey}``; sync.
        read_ledger: :data:`~cotal_trio.core.ledger.ReadRows`; sync, fresh per call.
        clock: wall time, unix seconds as a float; read once per request.
        metrics: optional; called with one outcome name per exchange request (``minted``,
            ``refused``, ``throttled``, ``bad-capability``); sync, must not block.

    Raises:
        ConfigError: the capability is not 64 lowercase hex, the owner secret is shorter than
            32 bytes, or the space breaks the space grammar.
    """

    space: str
    capability: str = field(repr=False)
    issuer_key: IssuerKey
    owner_secret: bytes = field(repr=False)
    idp_pin: IdpPin
    idp_keys: Callable[[], Mapping[str, VerifyKey]]
    read_ledger: ReadRows
    clock: Callable[[], float]
    metrics: Callable[[str], None] | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.capability, str) or _CAPABILITY.fullmatch(self.capability) is None:
            raise ConfigError("the exchange capability must be 64 lowercase hex characters")
        if not isinstance(self.owner_secret, bytes) or len(self.owner_secret) < MIN_OWNER_SECRET_BYTES:
            raise ConfigError("the owner secret must be at least 32 bytes - regenerate the space's secrets")
        try:
            check_space(self.space)
        except Refused:
            raise ConfigError(f"{self.space!r} is not a space name (1 to 64 letters, digits, _ and -)") from None

    def count(self, outcome: str) -> None:
        """Report one outcome to :attr:`metrics`, if set."""
        if self.metrics is not None:
            self.metrics(outcome)


@dataclass(frozen=True, slots=True, kw_only=True)
class Minted:
    """A successful exchange: the ``200`` body ``{"token", "owner", "exp"}``.

    Attributes:
        token: the Cotal bearer (compact JWS).
        owner: the bearer's owner ``u_…``.
        exp: the bearer's expiry, unix seconds.
    """

    token: str
    owner: str
    exp: int

    def body(self) -> dict[str, object]:
        """The JSON response body."""
        return {"token": self.token, "owner": self.owner, "exp": self.exp}


def exchange_arm(request: HumanExchange | AgentExchange) -> str:
    """``"agent"`` or ``"human"``: which arm a parsed request takes (for the refusal log line)."""
    return "agent" if isinstance(request, AgentExchange) else "human"


def _issue(ctx: ExchangeContext, row: LedgerRow, *, now: int, ttl_s: int) -> Minted:
    token, exp = issue_bearer(grant_from_row(row), key=ctx.issuer_key, space=ctx.space, now=now, ttl_s=ttl_s)
    return Minted(token=token, owner=row.owner, exp=exp)


def _mint_human(ctx: ExchangeContext, request: HumanExchange, now: float) -> Minted:
    identity = verify_idp_token(request.id_token, pin=ctx.idp_pin, keys=ctx.idp_keys(), now=now)
    owner = derive_owner(ctx.owner_secret, ctx.idp_pin.issuer, identity.sub)
    interactive, _managed = ctx.read_ledger(owner, request.actor)
    row = authorize_human_exchange(owner, request.actor, interactive)
    ttl_s = human_bearer_ttl(request.ttl_s, identity.exp, int(now))
    return _issue(ctx, row, now=int(now), ttl_s=ttl_s)


def _mint_agent(ctx: ExchangeContext, request: AgentExchange, now: float) -> Minted:
    _interactive, managed = ctx.read_ledger(request.owner, request.actor)
    lookup = row_lookup(ctx.read_ledger)
    row = authorize_agent_exchange(request.owner, request.actor, request.actor_token, managed, lookup)
    return _issue(ctx, row, now=int(now), ttl_s=agent_bearer_ttl(request.ttl_s))


def mint_exchange(ctx: ExchangeContext, request: HumanExchange | AgentExchange, *, now: float) -> Minted:
    """Run one parsed exchange through its arm (upstream-notes 3.5; spec "Bridge contract").

    Args:
        ctx: the face's ports.
        request: the body parsed by ``core.exchange.parse_exchange_body``.
        now: wall time, unix seconds (read once by the caller).

    Returns:
        The :class:`Minted` bearer.

    Raises:
        Refused: the caller's fault: BAD_CREDENTIAL for a bad IdP token, NOT_GRANTED for a
            missing grant, a corrupt ledger row (named on the human arm) or a wrong agent
            secret (one shared sentence for every agent-arm failure).
        Exception: anything else a port raises (an I/O error) propagates; the edge answers
            it with a generic 500.
    """
    try:
        if isinstance(request, AgentExchange):
            return _mint_agent(ctx, request, now)
        return _mint_human(ctx, request, now)
    except CodecError as corrupt:  # a corrupt ledger row is a refusal, never a 500 (1.3)
        if isinstance(request, AgentExchange):  # one sentence for every agent-arm failure
            raise Refused(RefusalCode.NOT_GRANTED, AGENT_EXCHANGE_REFUSAL) from None
        raise Refused(RefusalCode.NOT_GRANTED, str(corrupt)) from None
