"""What an HTTP face needs to mint a bearer: its ports, the caller's verification, the signing.

:class:`ExchangeContext` holds the ports one space's face uses. :func:`authenticate` verifies
a parsed credential and its ledger grant, :func:`mint_for` signs the bearer (upstream-notes 3.5;
spec "Bridge contract"):

* **human arm** ``{idpToken, actor, ttlSec?, view?, managerInstanceId?, transferWriter?}``: the
  :class:`~cotal_trio.core.bridge.IdpBridge` verifies the IdP token against the pinned key set,
  derives the owner and asks its ``authorize_actor`` hook (stock: the interactive row); the
  bearer is capped by the proof's ``exp`` read at signing;
* **agent arm** ``{owner, actor, actorToken, ttlSec?, view?, managerInstanceId?}``: the
  principal's managed row, the secret and the spawner envelope; the lifetime is at most 300 s.

The ledger step of either arm blocks on a disk (a fresh small file read), so it never runs on
the trio thread the lane's callout also runs on: :func:`authenticate` awaits it in a worker
thread of the context's own :class:`~cotal_trio.state.ledger_threads.BlockingCalls` (at most
:data:`LEDGER_THREADS` at once), abandoned at :data:`LEDGER_READ_S` with a 503, as the callout
awaits ``read_in_threads`` (issue 15 item 7). The decisions stay in core
(:meth:`~cotal_trio.core.bridge.IdpBridge.verify` before any read,
:func:`~cotal_trio.core.ledger.authorize_human_exchange`,
:func:`~cotal_trio.core.ledger.authorize_agent_exchange`). A ``manager-caller`` view adds the
manager selection in the records store (:func:`select_manager_for`).

The routes built on these are ``face_routes.py`` (``/health``, ``/jwks``, ``POST /exchange`` in
the order of :func:`~cotal_trio.core.exchange.decide_exchange`, the password-proof door) and
the doors and mesh routes; the transport pre-checks and the JSON body are ``transport.py``.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

import trio
from nacl.signing import VerifyKey

from cotal_trio.core.bearer import BearerGrant, issue_bearer
from cotal_trio.core.bridge import (
    Authenticated,
    AuthorizeActor,
    ConnectCredentialRequest,
    IdpBridge,
    MintConnectCredential,
    Minted,
    bounded_lifetime,
    no_root_credential,
)
from cotal_trio.core.errors import CodecError, ConfigError, RefusalCode, Refused, Unavailable
from cotal_trio.core.exchange import AgentExchange, HumanExchange, agent_bearer_ttl, grant_from_row
from cotal_trio.core.identity import MIN_OWNER_SECRET_BYTES, check_space
from cotal_trio.core.idp import IdpPin
from cotal_trio.core.jose import IssuerKey
from cotal_trio.core.ledger import (
    AGENT_EXCHANGE_REFUSAL,
    LedgerRow,
    ReadRows,
    authorize_agent_exchange,
    authorize_human_exchange,
)
from cotal_trio.core.limits import Limited
from cotal_trio.core.managers import SHED_PINNED, SHED_UNPINNED, ManagerInstance, SelectionRefused, select_manager
from cotal_trio.core.service_endpoints import ServiceEndpointRecord
from cotal_trio.core.sessions import ChatSession
from cotal_trio.core.views import ServiceEndpointBinding, SessionBinding, TransferTarget, view_ttl_cap
from cotal_trio.core.windows import WindowLru
from cotal_trio.state import row_lookup
from cotal_trio.state.ledger_threads import BlockingCalls

__all__ = [
    "NO_VIEW",
    "SESSION_CALLER",
    "Caller",
    "RecordsPort",
    "Uncounted",
    "ViewGrant",
    "authenticate",
    "LEDGER_READ_S",
    "LEDGER_THREADS",
    "LEDGER_STALLED",
    "ExchangeContext",
    "Minted",
    "mint_for",
    "select_manager_for",
    "stock_authorizer",
]

_CAPABILITY = re.compile(r"[0-9a-f]{64}")
TOO_MANY_REFUSALS = "too many refused exchanges - wait a minute and retry"
T = TypeVar("T")
# The ledger step of one request waits at most this long (seconds) for its read, then answers
# 503; read at each request. At most LEDGER_THREADS reads of one face run at once.
LEDGER_READ_S = 5.0
LEDGER_THREADS = 8
LEDGER_STALLED = (
    "the actor ledger did not answer within {s:g} s - check the disk that holds the space's root "
    "(a hung mount, a FIFO in actors/ or managed-actors/)"
)


class RecordsPort(Protocol):
    """The records and sessions stores a face reads and writes (``stores.records.RecordsStore``;
    docs/managers-and-sessions.md). Every method is trio-flavoured and raises Unavailable when
    the store does not answer."""

    async def get_manager(self, owner: str, instance_id: str) -> ManagerInstance | None: ...
    async def list_managers(self, owner: str | None = None) -> list[ManagerInstance]: ...
    async def register_manager(self, instance: ManagerInstance) -> int: ...
    async def retire_manager(self, owner: str, instance_id: str) -> bool: ...
    async def open_session(self, row: ChatSession, *, now: float) -> int: ...
    async def get_session(self, session_id: str) -> ChatSession | None: ...
    async def retire_session(self, session_id: str) -> bool: ...
    async def get_service_endpoint(self, endpoint: str) -> tuple[ServiceEndpointRecord, int] | None: ...
    async def register_service_endpoint(self, record: ServiceEndpointRecord, *, last_revision: int | None) -> int: ...
    async def retire_service_endpoint(self, endpoint: str, *, last_revision: int) -> None: ...


SESSION_CALLER = "session-caller"


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
        read_ledger: :data:`~cotal_trio.core.ledger.ReadRows`; sync, fresh per call, blocking:
            the exchange calls it only from a worker thread (:meth:`blocking`).
        clock: wall time, unix seconds as a float; read once per request.
        metrics: optional; called once per ``POST /exchange`` answer with ``(arm, status)``:
            ``"human"``, ``"agent"`` or :data:`NO_ARM`, and the HTTP status answered (see
            :func:`counted_exchange`); sync, must not block (``LaneMetrics.exchange_answered``).
        peek_limits: optional; ``(owner, actor) -> Limited | None``, the lane's connect limits
            as the callout would charge them now (``ConnectLimiter.peek_principal``); sync,
            spends nothing. While it answers a :class:`~cotal_trio.core.limits.Limited`, an
            exchange that would mint for that actor answers 429 instead (spec "Connect limits").
        refetch_idp_keys: optional; ``await refetch_idp_keys(kid)`` re-reads the pinned JWKS
            when an IdP token names a ``kid`` that :attr:`idp_keys` lacks, at most once per 30 s
            (:meth:`~cotal_trio.service.idp_keys.IdpKeyCache.refetch`). None: the key set is fixed.
        authorize_actor: the bridge's actor hook (spec "Bridge contract" step 3), for a hosted
            composition; None: the stock one, the fresh interactive row of :attr:`read_ledger`
            (:func:`stock_authorizer`). Sync; the exchange calls it from a worker thread.
        mint_connect_credential: the bridge's root-credential hook; None: the stock one, no
            credential id (:func:`~cotal_trio.core.bridge.no_root_credential`).
        records: the records and sessions stores (:class:`RecordsPort`) the manager-caller
            view, ``/manager-instances``, ``/manager-service-authority`` and the chat-session
            routes use; None: those answer that this service keeps no registry.
        provision: optional; ``await provision(row)`` before a bearer of the agent profile (no
            view) is minted: the provisioner pre-creates the principal's bind-only DM inbox,
            its presence and channel-registry watch readers and its role's task queue (spec credential-authority "Provisioning"), so the bearer's
            first connect can bind them. Raises Unavailable when the broker does not answer.
        bridge: the :class:`~cotal_trio.core.bridge.IdpBridge` the human arm runs, built from the
            fields above with both hooks set.
        threads: the worker threads this context's ledger steps run in (:data:`LEDGER_THREADS`
            at once), fresh for each context (``dataclasses.replace`` gives the public face
            threads of its own).

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
    metrics: Callable[[str, int], None] | None = None
    peek_limits: Callable[[str, str], Limited | None] | None = None
    refetch_idp_keys: Callable[[str], Awaitable[None]] | None = None
    authorize_actor: AuthorizeActor | None = None
    mint_connect_credential: MintConnectCredential | None = None
    records: RecordsPort | None = None
    provision: Callable[[LedgerRow], Awaitable[None]] | None = None
    bridge: IdpBridge = field(init=False, repr=False)
    threads: BlockingCalls = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if not isinstance(self.capability, str) or _CAPABILITY.fullmatch(self.capability) is None:
            raise ConfigError("the exchange capability must be 64 lowercase hex characters")
        if not isinstance(self.owner_secret, bytes) or len(self.owner_secret) < MIN_OWNER_SECRET_BYTES:
            raise ConfigError("the owner secret must be at least 32 bytes - regenerate the space's secrets")
        try:
            check_space(self.space)
        except Refused:
            raise ConfigError(f"{self.space!r} is not a space name (1 to 64 letters, digits, _ and -)") from None
        bridge = IdpBridge(
            space=self.space, idp_pin=self.idp_pin, idp_keys=self.idp_keys, owner_secret=self.owner_secret,
            issuer_key=self.issuer_key,
            authorize_actor=self.authorize_actor or stock_authorizer(self.read_ledger),
            mint_connect_credential=self.mint_connect_credential or no_root_credential, clock=self.clock,
        )  # fmt: skip
        object.__setattr__(self, "bridge", bridge)
        object.__setattr__(self, "threads", BlockingCalls(max_threads=LEDGER_THREADS))

    async def blocking(self, call: Callable[..., T], *args: object) -> T:
        """Trio: ``call(*args)``, a ledger step that may block on a disk, in a worker thread.

        Waits at most :data:`LEDGER_READ_S` (the read's thread is then abandoned: it finishes
        on its own, its result dropped), so a stalled disk holds this request only, never the
        lane's trio thread, the callout on it or another exchange (issue 15 item 7).

        Raises:
            Unavailable: no answer within :data:`LEDGER_READ_S` (the edge answers 503 and logs
                this sentence at warning, no traceback).
            Exception: what ``call`` raised.
        """
        limit = LEDGER_READ_S
        with trio.move_on_after(limit):
            return await self.threads.run(call, *args)
        raise Unavailable(LEDGER_STALLED.format(s=limit))

    def count(self, arm: str, status: int) -> None:
        """Report one exchange answer to :attr:`metrics`, if set."""
        if self.metrics is not None:
            self.metrics(arm, status)

    def check_limits(self, owner: str, actor: str) -> None:
        """Refuse while the actor or its owner is out of connects (spec "Connect limits").

        Raises:
            RateLimited: the bucket that ran out, with its ``retry-after`` seconds.
        """
        limited = None if self.peek_limits is None else self.peek_limits(owner, actor)
        if limited is not None:
            raise limited.error()


@dataclass(frozen=True, slots=True, kw_only=True)
class Caller:
    """A caller whose credential and ledger grant verified (either arm).

    Attributes:
        arm: ``"human"`` or ``"agent"``.
        row: the authorized ledger row (interactive for a human, managed for an agent).
        auth: the bridge's result for a human (its proof bounds the bearer); None for an agent.
    """

    arm: str
    row: LedgerRow
    auth: Authenticated | None = None

    @property
    def owner(self) -> str:
        """The caller's owner ``u_…``."""
        return self.row.owner

    @property
    def principal(self) -> str:
        """The selection-window principal (spec "Proxy attribution"): the derived owner for a
        human, ``owner.actor`` for a managed agent."""
        return self.row.owner if self.arm == "human" else self.row.principal


def stock_authorizer(read_ledger: ReadRows) -> AuthorizeActor:
    """The stock ``authorize_actor`` hook: the principal's fresh interactive row (upstream-notes
    1.3), read through ``read_ledger`` and decided by
    :func:`~cotal_trio.core.ledger.authorize_human_exchange`. Blocking: :func:`authenticate`
    runs it in a worker thread.

    Raises (from the returned hook): Refused NOT_GRANTED naming ``cotal actor grant``; CodecError
    for a corrupt row (answered as a refusal naming the row).
    """

    def authorize_actor(owner: str, actor: str) -> LedgerRow:
        interactive, managed = read_ledger(owner, actor)
        return authorize_human_exchange(owner, actor, interactive, managed_row=managed)

    return authorize_actor


def _agent_row(read_ledger: ReadRows, request: AgentExchange) -> LedgerRow:
    """The agent arm's ledger step (blocking: the rows and the spawner chain are read fresh)."""
    _interactive, managed = read_ledger(request.owner, request.actor)
    return authorize_agent_exchange(request.owner, request.actor, request.actor_token, managed, row_lookup(read_ledger))


async def authenticate(ctx: ExchangeContext, request: HumanExchange | AgentExchange, *, now: float) -> Caller:
    """Trio: verify a parsed credential and its ledger grant, without minting (upstream-notes 3.5).

    Human arm: the bridge's steps 1-2 (before any ledger read), ``authorize_actor``, then the
    bridge's check of the row; agent arm: the managed row, the secret's hash and the spawner
    envelope. The ledger step runs in a worker thread (:meth:`ExchangeContext.blocking`).

    Raises:
        Refused: BAD_CREDENTIAL for a bad IdP token; NOT_GRANTED for a missing grant, a corrupt
            ledger row (named on the human arm) or any agent-arm failure (one shared sentence).
        Unavailable: the ledger did not answer within :data:`LEDGER_READ_S` (503).
        Exception: a port's I/O error propagates (the edge answers 500).
    """
    try:
        if isinstance(request, AgentExchange):
            row = await ctx.blocking(_agent_row, ctx.read_ledger, request)
            return Caller(arm="agent", row=row)
        proven = ctx.bridge.verify(request.id_token, request.actor, now=now)
        auth = ctx.bridge.admit(proven, await ctx.blocking(ctx.bridge.authorize_actor, proven.owner, proven.actor))
        return Caller(arm="human", row=auth.row, auth=auth)
    except CodecError as corrupt:  # a corrupt ledger row is a refusal, never a 500 (1.3)
        if isinstance(request, AgentExchange):  # one sentence for every agent-arm failure
            raise Refused(RefusalCode.NOT_GRANTED, AGENT_EXCHANGE_REFUSAL) from None
        raise Refused(RefusalCode.NOT_GRANTED, str(corrupt)) from None


@dataclass(frozen=True, slots=True, kw_only=True)
class ViewGrant:
    """The view a bearer is minted with and its binding (spec "Listener policy"); all None: none."""

    view: str | None = None
    manager_instance_id: str | None = None
    session: SessionBinding | None = None
    transfer_writer: TransferTarget | None = None
    service_endpoint: ServiceEndpointBinding | None = None


NO_VIEW = ViewGrant()
SESSION_EXPIRED = "the chat session has expired - open a new one with POST /chat-session/open"


def mint_for(
    ctx: ExchangeContext, caller: Caller, *, ttl_s: int | None, view: ViewGrant = NO_VIEW,
    extra: Mapping[str, object] | None = None,
) -> Minted:
    """Sign the caller's bearer, dated by the clock read just before signing.

    The lifetime: a human's ``min(ttl_s or 900, 900, proof exp - now)``, an agent's
    ``min(ttl_s or 300, 300)``, both within the view's cap (300 s for ``transfer-writer``) and,
    for a ``session-caller`` view, ending by the session's ``exp``.

    Raises:
        RateLimited: the actor or its owner is out of connects (``ctx.peek_limits``).
        Refused: NOT_GRANTED when the row lacks the view's scope or the session has expired;
            BAD_CREDENTIAL when the proof expired before signing.
    """
    row = caller.row
    ctx.check_limits(row.owner, row.actor)  # the credential is good: only now say "limited"
    not_after = None if view.session is None else view.session.exp

    def grant(authorized: LedgerRow, credential_id: str | None) -> BearerGrant:
        return grant_from_row(
            authorized, credential_id=credential_id, view=view.view, manager_instance_id=view.manager_instance_id,
            session=view.session, transfer_writer=view.transfer_writer, service_endpoint=view.service_endpoint,
        )  # fmt: skip

    cap_s = view_ttl_cap(view.view)
    if caller.auth is not None:
        return ctx.bridge.issue(
            caller.auth, ttl_s=ttl_s, grant=grant, cap_s=cap_s, not_after=not_after, expired=SESSION_EXPIRED,
            extra=extra,
        )  # fmt: skip
    credential_id = ctx.bridge.mint_connect_credential(  # the agent arm's "root credential ensure" (3.5)
        ConnectCredentialRequest(owner=row.owner, actor=row.actor, lifecycle_uid=row.lifecycle_uid)
    )
    bearer_grant = grant(row, credential_id)
    signed_at = int(ctx.clock())
    lifetime = bounded_lifetime(
        agent_bearer_ttl(ttl_s, view=view.view), signed_at, cap_s=cap_s, not_after=not_after, expired=SESSION_EXPIRED
    )
    token, exp = issue_bearer(bearer_grant, key=ctx.issuer_key, space=ctx.space, now=signed_at, ttl_s=lifetime)
    return Minted(token=token, owner=row.owner, exp=exp, extra=dict(extra or {}))


class Uncounted(Exception):
    """A refusal answered with its own reason (or its own 429) that spends no face budget
    (spec "Proxy attribution": manager selection has per-principal windows of its own)."""

    def __init__(self, refusal: Refused) -> None:
        super().__init__(refusal.detail)
        self.refusal = refusal


PINNED, UNPINNED = "pinned", "unpinned"


async def select_manager_for(
    ctx: ExchangeContext, caller: Caller, pinned: str | None, *, face: str, windows: WindowLru | None, now: float
) -> ManagerInstance:
    """Trio: the live manager instance a ``manager-caller`` bearer is bound to (spec "Proxy
    attribution"; upstream-notes 3.4).

    On the public face (``windows`` given) the principal's class window (``pinned`` when
    ``managerInstanceId`` was named, else ``unpinned``) is checked first: while it is full, the
    class is shed with its 429 remedy, even for a request that would have succeeded; a
    selection failure is recorded in it. On the loopback face an unpinned failure (no live
    manager, or several) keeps its reason without spending the shared budget; a pinned one
    counts as any refusal.

    Raises:
        Uncounted: the shed 429, or a selection refusal that spends no face budget.
        SelectionRefused: a loopback pinned selection failure (counted by the caller).
        Refused: NOT_GRANTED when this auth service has no manager registry.
        Unavailable: the records store did not answer.
    """
    if ctx.records is None:
        raise Refused(RefusalCode.NOT_GRANTED, NO_MANAGER_REGISTRY)
    key = (caller.principal, PINNED if pinned else UNPINNED)
    if windows is not None and windows.is_full(key, now):
        raise Uncounted(Refused(RefusalCode.RATE_LIMITED, SHED_PINNED if pinned else SHED_UNPINNED))
    if pinned is not None:
        found = await ctx.records.get_manager(caller.owner, pinned)
        instances = [] if found is None else [found]
    else:
        instances = await ctx.records.list_managers(caller.owner)
    try:
        return select_manager(instances, owner=caller.owner, pinned=pinned)
    except SelectionRefused as refusal:
        if windows is not None:
            windows.try_acquire(key, now)
            raise Uncounted(refusal) from None
        if not refusal.pinned:
            raise Uncounted(refusal) from None
        raise


NO_MANAGER_REGISTRY = (
    "this auth service keeps no manager registry (a callout replica or a hosted composition without one) - "
    "exchange view manager-caller at the space's full auth service"
)
