"""A lane's own data-account users, each holding only what it uses (issue 15 item 4; spec
credential-authority "Profiles", issuer row; spec auth-service-integration "Callout replicas";
docs/wire-layout.md "The service's own users").

A lane connects to its space's data account as two users, both minted in memory per lane start
(signed by the space's service signing key, never written to disk) and each with its own reply
inbox ``_INBOX_<nonce>`` (it cannot read another connection's replies):

* the **store user** (:func:`store_permissions`, :func:`replica_store_permissions`): the plane
  claim, the issuance rows, the records and sessions stores, and, for a full lane, creating and
  checking the space's streams and buckets and the bind-only durables. It holds no ``$JS.API.>``,
  no purge, no stream or message delete, no direct get and no write on the issued stores, so it
  cannot rewrite the append-only issued stores. It is minted for :data:`STORE_LIFETIME_S` (a
  day) and renewed like the issuer session (:class:`RenewedUser`): the lane holds a
  :class:`RenewedConnection` that repoints itself to each new session, so the claim keeper and
  the stores never see the swap and their calls in flight finish on the old session. (Not
  nats-py's reconnect with a fresh JWT from ``user_jwt_cb``: on the broker's ``-ERR 'User
  Authentication Expired'`` nats-py closes the connection for good, even with reconnect on -
  measured: closed 0.5 s after ``exp``, no reconnect - so nothing would re-mint the user.)
* the **issuer session** (:class:`IssuerSession`): the ``issuer`` profile
  (:func:`~cotal_trio.core.profiles.issuer_permissions`) minted for :data:`ISSUER_LIFETIME_S`,
  over which the callout issues, resolves and retires at connect (the
  :class:`~cotal_trio.stores.issued.IssuedStores` it hands out), and a replica checks the issued
  stores' shape. A task in the lane's nursery opens a new session a third of the lifetime before
  the current one expires, swaps it in, and only then closes the old one (a sixth of the lifetime
  later, never past its expiry), so minting has no gap and calls in flight finish on the old one;
  if the old one expires with no renewal in, the lane ends.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import math
import secrets
import typing
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

import trio

from cotal_trio.broker.provision import mint_service_user
from cotal_trio.core import wire
from cotal_trio.core.errors import Unavailable
from cotal_trio.core.issuance import ISSUANCE_KEY_PREFIX
from cotal_trio.core.profiles import issuer_permissions, provisioner_permissions
from cotal_trio.natsio import Connection, open_connection, open_native_connection, speaks_native
from cotal_trio.state import SpaceMaterial
from cotal_trio.stores.issued import IssuedStores

__all__ = [
    "ISSUER_LIFETIME_S",
    "IssuerSession",
    "RenewedConnection",
    "RenewedUser",
    "STORE_LIFETIME_S",
    "new_inbox_nonce",
    "open_service_user",
    "recreate_permissions",
    "replica_store_permissions",
    "store_permissions",
]

log = logging.getLogger("cotal.lane")

ISSUER_LIFETIME_S = 300
"""The issuer session's credential lifetime (spec "Profiles": "its five-minute credential"). Seconds."""
STORE_LIFETIME_S = 86400
"""A lane's store user's credential lifetime (a day; it is renewed a third of that before it
expires, like the issuer session). Seconds."""
# Seconds a session the broker dropped (not expired) is renewed for before its task gives up.
DROPPED_GRACE_S = 5.0
# Bytes of randomness in a service user's inbox nonce (hex: twice as many characters).
NONCE_BYTES = 12

Permissions = dict[str, dict[str, list[str]]]


def _stream_api(stream: str, *verbs: str) -> list[str]:
    return [f"$JS.API.STREAM.{verb}.{stream}" for verb in verbs]


def _own(permissions: list[str], inbox_nonce: str) -> Permissions:
    """``pub.allow`` as given (duplicates dropped, in order); ``sub.allow`` the user's own inbox."""
    return {"pub": {"allow": list(dict.fromkeys(permissions))}, "sub": {"allow": [wire.inbox_subject(inbox_nonce)]}}


def _kv_rw(bucket: str) -> list[str]:
    """A bucket the user creates, checks and uses: its stream's info, create and update (the
    rollup tightening of ``ensure_bucket``), its reads (``STREAM.MSG.GET``) and key writes."""
    stream = wire.kv_stream(bucket)
    return [*_stream_api(stream, "INFO", "CREATE", "UPDATE", "MSG.GET"), wire.kv_subject(bucket, ">")]


def store_permissions(space: str, inbox_nonce: str) -> Permissions:
    """Sync: a full lane's store user, exactly what the lane does with it.

    ``pub.allow``:

    * the auth bucket ``cotal_auth_S`` (plane claim, admission row, issuance rows), the records
      and sessions stores: ``STREAM.INFO``/``CREATE``/``UPDATE``/``MSG.GET`` of their streams and
      writes on ``$KV.<bucket>.>``;
    * the provisioner's lists without its ``$SYS.REQ.USER.INFO``
      (:func:`~cotal_trio.core.profiles.provisioner_permissions`): ``STREAM.CREATE``/``INFO`` of
      the four message streams, the presence, channel-registry and admission buckets, and the pinned consumer creates
      and consumer infos of the bind-only durables; plus ``STREAM.UPDATE`` of the presence bucket;
    * ``STREAM.INFO`` and ``STREAM.CREATE`` of the issued and accepted stores (created or checked
      at start; everything written or read in them rides the issuer session);
    * ``STREAM.UPDATE`` of the four message streams, the admission store and the issued and
      accepted stores: the lane scales them up to the space's ``replicas`` (issue 17 item 1; the
      broker refuses undoing their append-only flags anyway, err_code 10052).

    ``sub.allow``: ``_INBOX_<inbox_nonce>.>``.

    Raises:
        Refused: BAD_REQUEST for a bad space or nonce.
    """
    provisioner = provisioner_permissions(space=space, inbox_nonce=inbox_nonce).pub_allow
    issued = [wire.kv_stream(wire.issued_bucket(space)), wire.kv_stream(wire.accepted_bucket(space))]
    scaled = [*(s.name for s in wire.all_streams(space)), wire.kv_stream(wire.channels_bucket(space)),
              wire.kv_stream(wire.admission_bucket(space)), *issued]  # fmt: skip
    return _own([
        *(s for bucket in (wire.auth_bucket(space), wire.records_bucket(space), wire.sessions_bucket(space))
          for s in _kv_rw(bucket)),
        *(s for s in provisioner if s != wire.USER_INFO_SUBJECT),
        *_stream_api(wire.kv_stream(wire.presence_bucket(space)), "UPDATE"),
        *(s for stream in issued for s in _stream_api(stream, "INFO", "CREATE")),
        # the replica count's scale-up (issue 17 item 1): the streams the provisioner's lists create
        *(s for stream in scaled for s in _stream_api(stream, "UPDATE")),
    ], inbox_nonce)  # fmt: skip


def replica_store_permissions(space: str, inbox_nonce: str) -> Permissions:
    """Sync: a callout replica's store user (spec "Callout replicas": it "reads the auth, records
    and sessions stores and creates each connect's issuance row; it creates no store").

    ``pub.allow``: ``STREAM.MSG.GET`` of ``KV_cotal_auth_S``, ``KV_cotal_records_S`` and
    ``KV_cotal_sessions_S``, writes on ``$KV.cotal_auth_S.natkey.>``, and ``STREAM.INFO`` of
    ``KV_cotal_auth_S`` (a write no stream answered: missing, or without a leader?). ``sub.allow``:
    ``_INBOX_<inbox_nonce>.>``.

    Raises:
        Refused: BAD_REQUEST for a bad space or nonce.
    """
    reads = (wire.auth_bucket(space), wire.records_bucket(space), wire.sessions_bucket(space))
    return _own([
        *(wire.js_msg_get(wire.kv_stream(bucket)) for bucket in reads),
        wire.kv_subject(wire.auth_bucket(space), f"{ISSUANCE_KEY_PREFIX}>"),
        # a row write no stream answered asks whether the store exists (natsio/_js.py, issue 17 item 2)
        wire.js_stream_info(wire.kv_stream(wire.auth_bucket(space))),
    ], inbox_nonce)  # fmt: skip


def recreate_permissions(space: str, inbox_nonce: str) -> Permissions:
    """Sync: the one-off user of ``--recreate-issued-stores`` (``cotal up`` and ``cotal auth
    recreate-issued-stores``; :func:`~cotal_trio.stores.issued.recreate_issued_stores`), exactly
    what the step does and only on the two issued stores.

    ``pub.allow``: ``STREAM.INFO``, ``STREAM.MSG.GET`` (the backup reads each message),
    ``STREAM.DELETE`` and ``STREAM.CREATE`` of ``KV_cotal_issued_S`` and ``KV_cotal_accepted_S``.
    No write in them, no purge, no other stream. ``sub.allow``: ``_INBOX_<inbox_nonce>.>``.

    Raises:
        Refused: BAD_REQUEST for a bad space or nonce.
    """
    streams = (wire.kv_stream(wire.issued_bucket(space)), wire.kv_stream(wire.accepted_bucket(space)))
    return _own([s for stream in streams for s in _stream_api(stream, "INFO", "MSG.GET", "DELETE", "CREATE")], inbox_nonce)


def new_inbox_nonce() -> str:
    """Sync: a fresh inbox nonce for a service user (24 hex digits, from the CSPRNG)."""
    return secrets.token_hex(NONCE_BYTES)


@contextlib.asynccontextmanager
async def open_service_user(
    material: SpaceMaterial, server_url: str, *, name: str,
    permissions: Callable[[str], Mapping[str, Any]] | Mapping[str, Any], iat: int, exp: int | None, reconnect: bool,
    native: bool = False,
) -> AsyncIterator[Connection]:
    """Trio-flavoured async context manager: a connection as a fresh data-account service user.

    The user is minted in memory, signed by the space's service signing key, never written to
    disk. Given a callable, it is minted with ``permissions(inbox_nonce)`` for a fresh nonce and
    the connection uses the inbox prefix ``_INBOX_<nonce>`` (its own reply inbox); given a
    mapping, with exactly that and the default ``_INBOX`` prefix. Must be entered inside an
    ``open_loop()``.

    Args:
        server_url: the broker's seed URLs, comma-separated (as ``open_connection`` takes them).
        name: the user JWT's and the connection's name (the broker's monitoring shows it).
        permissions: ``{"pub": {...}, "sub": {...}}`` as :func:`mint_service_user` takes them, or
            a function of the inbox nonce returning them.
        iat, exp: unix seconds; ``exp`` None for a user that never expires.
        reconnect: as :func:`~cotal_trio.natsio.open_connection`.
        native: over :func:`~cotal_trio.natsio.open_native_connection` (trio sockets, no
            asyncio bridge; ``nats://`` seeds only), duck-typed as a ``Connection`` for the
            JetStream calls of natsio (request, request_many, requests_sent, publish), not for
            ``pull_next``. The issuer session's writes at connect ride it (issue 14).

    Raises:
        Unavailable: the broker refused the connect or did not answer.
    """
    if callable(permissions):
        nonce = new_inbox_nonce()
        allowed, prefix = permissions(nonce), f"_INBOX_{nonce}"
    else:
        allowed, prefix = permissions, None
    creds = mint_service_user(material, name=name, permissions=allowed, iat=iat, exp=exp)
    opener = open_native_connection if native else open_connection
    async with opener(server_url, creds=creds, name=name, inbox_prefix=prefix, reconnect=reconnect) as conn:
        yield typing.cast(Connection, conn)


def renewal_times(lifetime_s: int, remaining_s: float) -> tuple[float, float]:
    """Sync: ``(renew_in, grace)`` seconds for a session ``remaining_s`` from its expiry: renew a
    third of the lifetime before it; once a replacement is swapped in, the old one stays open
    ``grace`` seconds more for the calls in flight on it (a sixth of the lifetime, never past its
    expiry; never negative)."""
    return max(0.0, remaining_s - lifetime_s / 3), max(0.0, min(remaining_s, lifetime_s / 6))


def _check_lifetime(what: str, lifetime_s: int) -> None:
    if lifetime_s < 3:
        raise ValueError(f"the {what} lives at least 3 s, got {lifetime_s}")


@dataclasses.dataclass(frozen=True, slots=True)
class _Held:
    """One open session: its connection, its expiry (trio time) and the scope that closes it."""

    conn: Connection
    expires: float
    scope: trio.CancelScope


class RenewedConnection:
    """Connection-shaped: each attribute read goes to the current session's
    :class:`~cotal_trio.natsio.Connection`, so a call made after a renewal rides the new session
    and one in flight finishes on the old. Hand it out as a ``Connection``
    (``typing.cast``); its holders never see the swap.

    Attributes:
        closed: a ``trio.Event`` set once the current session's connection closed without being
            replaced (the broker dropped it); a retired session's close does not set it.
    """

    def __init__(self, conn: Connection) -> None:
        self._current = conn
        self.closed = trio.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._current, name)

    def _swap(self, conn: Connection) -> None:
        self._current = conn


class RenewedUser:
    """A data-account service user whose credential expires and is renewed before it does.

    :meth:`run` is a startable for the lane's nursery: ``started`` with a
    :class:`RenewedConnection` over the first session once it is connected; then it replaces the
    session for as long as the lane runs. No gap: a third of the lifetime before the current
    session expires a new one is opened; only once it is connected and swapped in is the old one
    closed (a sixth of the lifetime later, so calls in flight finish on it). A failed renewal is
    retried every ``lifetime_s / 30`` seconds (at least 0.2 s) and logged as a warning, with
    :attr:`trouble` saying so, while the old session keeps serving; if its credential expires
    with no replacement in, the task raises ``Unavailable`` naming the cause, ending the lane (the
    host restarts it). A session is never held past its credential's expiry, so no caller rides
    a connection the broker closed.

    Attributes:
        renewals: sessions swapped in after the first.
        trouble: while a renewal is failing, why (a sentence); None otherwise.

    Args:
        material: the space's material (its service signing key signs the sessions).
        server_url: the broker's seed URLs, comma-separated: each renewal reconnects through the
            first seed that answers (issue 17 item 3).
        what: the session's name in logs and errors (``"issuer session"``).
        name: each user's and connection's name (``cotal:issuer:S``).
        permissions: the user's permissions for an inbox nonce (:func:`open_service_user`).
        lifetime_s: each session's credential lifetime (seconds), at least 3.
        clock: wall time, unix seconds (the credentials' ``iat``/``exp``).
        reconnect: as :func:`~cotal_trio.natsio.open_connection`.
        open_user: opens each session (:func:`open_service_user`'s signature; tests make it fail).
        watched: the holder watches :attr:`RenewedConnection.closed` (the lane's ``_until_lost``):
            a session the broker drops then only sets it and :meth:`run` returns. Otherwise a
            dropped session is renewed at once, and :meth:`run` raises ``Unavailable`` when
            none is let in within ``DROPPED_GRACE_S`` (5 s).

    Raises:
        ValueError: ``lifetime_s`` under 3.
    """

    def __init__(
        self, material: SpaceMaterial, server_url: str, *, what: str, name: str,
        permissions: Callable[[str], Mapping[str, Any]], lifetime_s: int, clock: Callable[[], float], reconnect: bool,
        open_user: Callable[..., contextlib.AbstractAsyncContextManager[Connection]] | None = None,
        watched: bool = False,
    ) -> None:  # fmt: skip
        _check_lifetime(what, lifetime_s)
        self._material, self._url, self._clock, self._reconnect = material, server_url, clock, reconnect
        self._what, self._name, self._permissions, self._watched = what, name, permissions, watched
        self._open_user = open_user or open_service_user
        self.space = material.space
        self.lifetime_s = lifetime_s
        self.renewals = 0
        self.trouble: str | None = None

    async def _hold(self, *, task_status: trio.TaskStatus[_Held] = trio.TASK_STATUS_IGNORED) -> None:
        """Open one session; ``started`` with it; hold it until its scope's deadline (at the
        latest its credential's expiry, which :meth:`run` brings forward once it is replaced),
        until cancelled, or until the broker closes it."""
        iat = math.floor(self._clock())
        exp = iat + self.lifetime_s
        async with self._open_user(
            self._material, self._url, name=self._name, permissions=self._permissions,
            iat=iat, exp=exp, reconnect=self._reconnect,
        ) as conn:  # fmt: skip
            expires = trio.current_time() + (exp - self._clock())
            with trio.CancelScope(deadline=expires) as scope:
                task_status.started(_Held(conn, expires, scope))
                await conn.closed.wait()

    async def run(self, *, task_status: trio.TaskStatus[RenewedConnection] = trio.TASK_STATUS_IGNORED) -> None:
        """Trio: serve and renew the session until cancelled (startable; see the class).

        Raises:
            Unavailable: the first session was refused (before ``started``); the current one
                expired with no renewal let in (names the last renewal's failure); or, unless
                ``watched``, the broker closed it and no renewal was let in within
                ``DROPPED_GRACE_S``.
        """
        async with trio.open_nursery() as nursery:
            held: _Held = await nursery.start(self._hold)
            proxy = RenewedConnection(held.conn)
            task_status.started(proxy)
            while True:
                renew_in, _ = renewal_times(self.lifetime_s, held.expires - trio.current_time())
                with trio.move_on_after(renew_in):
                    await held.conn.closed.wait()
                give_up = held.expires
                if held.conn.closed.is_set():  # the broker dropped it: lost, not due for renewal
                    if self._watched:
                        proxy.closed.set()
                        return  # the holder watching `closed` ends the lane with the reason
                    # Renewed at once; a broker that is gone altogether is the lane's to name
                    # first (its callout and store connections), so this waits that long.
                    give_up = min(give_up, trio.current_time() + DROPPED_GRACE_S)
                    log.warning("space %s: the broker closed the %s (%s); renewing it now", self.space, self._what,
                                held.conn.last_error or "no reason given")  # fmt: skip
                try:
                    new = await self._replace(nursery, give_up)
                except Unavailable:
                    proxy.closed.set()
                    raise
                self.trouble = None
                proxy._swap(new.conn)
                _, grace = renewal_times(self.lifetime_s, held.expires - trio.current_time())
                held.scope.deadline = min(held.scope.deadline, trio.current_time() + grace)
                held = new
                self.renewals += 1
                log.info("space %s: %s renewed (%d), valid %d s", self.space, self._what, self.renewals, self.lifetime_s)

    async def _replace(self, nursery: trio.Nursery, give_up: float) -> _Held:
        """A new session, retried until one is up; raise once trio time ``give_up`` (the old
        session's expiry, or sooner once the broker dropped it) passes without one. A try in
        progress is never cancelled (a connect cut off midway leaks its late error into the loop),
        so a hung broker ends it one connect's bound (:func:`~cotal_trio.natsio.open_connection`,
        5 s) after ``give_up``."""
        retry_s = max(0.2, self.lifetime_s / 30)
        while True:
            try:
                return await nursery.start(self._hold)
            except (Unavailable, OSError) as exc:  # refused, unreachable, or no broker there
                left = give_up - trio.current_time()
                if left <= 0:  # nothing serves any more
                    raise Unavailable(
                        f"space {self.space}: the {self._what} expired and no renewal was let in ({exc})"
                        " - check that the broker runs and trusts the space's account"
                    ) from exc
                self.trouble = f"the {self._what} is not renewed ({exc}); it ends in {left:.0f} s"
                log.warning("space %s: %s not renewed, retrying in %.1f s: %s", self.space, self._what, retry_s, exc)
            # the last try is made just before the old session's expiry, not after it
            await trio.sleep(max(0.0, min(retry_s, left - 0.05)))


class IssuerSession(RenewedUser):
    """A lane's issuer session (spec "Profiles", issuer row): a :class:`RenewedUser` named
    ``cotal:issuer:S`` with the ``issuer`` profile, whose :meth:`run` is ``started`` with the
    :class:`~cotal_trio.stores.issued.IssuedStores` over it.

    Args:
        lifetime_s: :data:`ISSUER_LIFETIME_S`; tests shorten it (at least 3).
        others: as :class:`RenewedUser`; without ``open_user`` each session is native
            (:func:`open_service_user` with ``native``) on ``nats://`` seeds (issue 14).

    Raises:
        ValueError: ``lifetime_s`` under 3.
    """

    def __init__(
        self, material: SpaceMaterial, server_url: str, *, lifetime_s: int, clock: Callable[[], float], reconnect: bool,
        open_user: Callable[..., contextlib.AbstractAsyncContextManager[Connection]] | None = None,
    ) -> None:
        _check_lifetime("issuer session", lifetime_s)
        space = material.space
        super().__init__(
            material, server_url, what="issuer session", name=f"cotal:issuer:{space}",
            permissions=lambda nonce: issuer_permissions(space=space, inbox_nonce=nonce).to_nats(),
            lifetime_s=lifetime_s, clock=clock, reconnect=reconnect,
            # the connect's issued-authority writes on trio sockets, without the bridge (issue 14)
            open_user=open_user or functools.partial(open_service_user, native=speaks_native(server_url)),
        )  # fmt: skip

    async def run(self, *, task_status: trio.TaskStatus[IssuedStores] = trio.TASK_STATUS_IGNORED) -> None:  # type: ignore[override]
        """Trio: as :meth:`RenewedUser.run`, ``started`` with the issued stores over the session."""
        async with trio.open_nursery() as nursery:
            conn = await nursery.start(super().run)
            task_status.started(IssuedStores(typing.cast(Connection, conn), self.space))
