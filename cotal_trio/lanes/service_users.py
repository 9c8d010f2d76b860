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
  cannot rewrite the append-only issued stores. It has no expiry (renewing its connection would
  drop its claim keeper's work in flight; follow-up).
* the **issuer session** (:class:`IssuerSession`): the ``issuer`` profile
  (:func:`~cotal_trio.core.profiles.issuer_permissions`) minted for :data:`ISSUER_LIFETIME_S`,
  over which the callout issues, resolves and retires at connect (the
  :class:`~cotal_trio.lanes.issued.IssuedStores` it hands out), and a replica checks the issued
  stores' shape. A task in the lane's nursery opens a new session a third of the lifetime before
  the current one expires, swaps it in, and closes the old one a sixth of the lifetime before its
  expiry, so minting has no gap and calls in flight finish on the old one.
"""

from __future__ import annotations

import contextlib
import logging
import math
import secrets
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

import trio

from ..broker.provision import mint_service_user
from ..core import wire
from ..core.errors import Unavailable
from ..core.issuance import ISSUANCE_KEY_PREFIX
from ..core.profiles import issuer_permissions, provisioner_permissions
from ..natsio import Connection, open_connection
from ..state import SpaceMaterial
from .issued import IssuedStores

__all__ = [
    "ISSUER_LIFETIME_S",
    "IssuerSession",
    "open_service_user",
    "replica_store_permissions",
    "store_permissions",
]

log = logging.getLogger("cotal.lane")

ISSUER_LIFETIME_S = 300
"""The issuer session's credential lifetime (spec "Profiles": "its five-minute credential"). Seconds."""
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
      the four message streams, the presence and admission buckets, and the pinned consumer creates
      and consumer infos of the bind-only durables; plus ``STREAM.UPDATE`` of the presence bucket;
    * ``STREAM.INFO`` and ``STREAM.CREATE`` of the issued and accepted stores (created or checked
      at start; everything written or read in them rides the issuer session).

    ``sub.allow``: ``_INBOX_<inbox_nonce>.>``.

    Raises:
        Refused: BAD_REQUEST for a bad space or nonce.
    """
    provisioner = provisioner_permissions(space=space, inbox_nonce=inbox_nonce).pub_allow
    issued = [wire.kv_stream(wire.issued_bucket(space)), wire.kv_stream(wire.accepted_bucket(space))]
    return _own([
        *(s for bucket in (wire.auth_bucket(space), wire.records_bucket(space), wire.sessions_bucket(space))
          for s in _kv_rw(bucket)),
        *(s for s in provisioner if s != wire.USER_INFO_SUBJECT),
        *_stream_api(wire.kv_stream(wire.presence_bucket(space)), "UPDATE"),
        *(s for stream in issued for s in _stream_api(stream, "INFO", "CREATE")),
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


def new_inbox_nonce() -> str:
    """Sync: a fresh inbox nonce for a service user (24 hex digits, from the CSPRNG)."""
    return secrets.token_hex(NONCE_BYTES)


@contextlib.asynccontextmanager
async def open_service_user(
    material: SpaceMaterial, server_url: str, *, name: str, permissions: Callable[[str], Mapping[str, Any]],
    iat: int, exp: int | None, reconnect: bool,
) -> AsyncIterator[Connection]:
    """Trio-flavoured async context manager: a connection as a fresh data-account service user.

    The user is minted in memory with ``permissions(inbox_nonce)`` for a fresh nonce, and the
    connection uses the inbox prefix ``_INBOX_<nonce>``. Must be entered inside an ``open_loop()``.

    Args:
        name: the user JWT's and the connection's name (the broker's monitoring shows it).
        iat, exp: unix seconds; ``exp`` None for a user that never expires.
        reconnect: as :func:`~cotal_trio.natsio.open_connection`.

    Raises:
        Unavailable: the broker refused the connect or did not answer.
    """
    nonce = new_inbox_nonce()
    creds = mint_service_user(material, name=name, permissions=permissions(nonce), iat=iat, exp=exp)
    async with open_connection(
        server_url, creds=creds, name=name, inbox_prefix=f"_INBOX_{nonce}", reconnect=reconnect
    ) as conn:
        yield conn


def renewal_times(lifetime_s: int, remaining_s: float) -> tuple[float, float]:
    """Sync: ``(renew_in, close_in)`` seconds from now for a session ``remaining_s`` from its
    expiry: renew a third of the lifetime before it, close the old one a sixth before it (never
    negative)."""
    return max(0.0, remaining_s - lifetime_s / 3), max(0.0, remaining_s - lifetime_s / 6)


class IssuerSession:
    """A lane's issuer session, renewed before it expires (spec "Profiles", issuer row).

    :meth:`run` is a startable for the lane's nursery: ``started`` with the
    :class:`~cotal_trio.lanes.issued.IssuedStores` over the first session once it is connected;
    then it replaces the session for as long as the lane runs, rebinding those stores to each new
    one (no gap: the new one is connected before the swap). A failed renewal is retried every
    ``lifetime_s / 30`` seconds (at least 0.2 s) and logged; once no session has been up for a whole
    lifetime the task raises, ending the lane.

    Args:
        material: the space's material (its service signing key signs the sessions).
        server_url: the broker.
        lifetime_s: each session's credential lifetime (seconds; :data:`ISSUER_LIFETIME_S`, tests
            shorten it), at least 3.
        clock: wall time, unix seconds (the credentials' ``iat``/``exp``).
        reconnect: as :func:`~cotal_trio.natsio.open_connection`.

    Raises:
        ValueError: ``lifetime_s`` under 3.
    """

    def __init__(
        self, material: SpaceMaterial, server_url: str, *, lifetime_s: int, clock: Callable[[], float], reconnect: bool
    ) -> None:
        if lifetime_s < 3:
            raise ValueError(f"an issuer session lives at least 3 s, got {lifetime_s}")
        self._material, self._url, self._clock, self._reconnect = material, server_url, clock, reconnect
        self.space = material.space
        self.lifetime_s = lifetime_s
        self.renewals = 0

    def _permissions(self, nonce: str) -> Mapping[str, Any]:
        return issuer_permissions(space=self.space, inbox_nonce=nonce).to_nats()

    async def _hold(self, *, task_status: trio.TaskStatus[tuple[Connection, float]] = trio.TASK_STATUS_IGNORED) -> None:
        """Open one session; ``started`` with it and its expiry on trio time; close it a sixth of
        the lifetime before that expiry (or when cancelled, or when the broker closes it)."""
        iat = math.floor(self._clock())
        exp = iat + self.lifetime_s
        async with open_service_user(
            self._material, self._url, name=f"cotal:issuer:{self.space}", permissions=self._permissions,
            iat=iat, exp=exp, reconnect=self._reconnect,
        ) as conn:  # fmt: skip
            remaining = exp - self._clock()
            task_status.started((conn, trio.current_time() + remaining))
            _, close_in = renewal_times(self.lifetime_s, remaining)
            with trio.move_on_after(close_in):
                await conn.closed.wait()

    async def run(self, *, task_status: trio.TaskStatus[IssuedStores] = trio.TASK_STATUS_IGNORED) -> None:
        """Trio: serve and renew the session until cancelled (startable; see the class).

        Raises:
            Unavailable: the first session was refused (before ``started``), or no session could be
                opened for a whole lifetime.
        """
        async with trio.open_nursery() as nursery:
            conn, expires = await nursery.start(self._hold)
            stores = IssuedStores(conn, self.space)
            task_status.started(stores)
            while True:
                renew_in, _ = renewal_times(self.lifetime_s, expires - trio.current_time())
                with trio.move_on_after(renew_in):
                    await conn.closed.wait()
                conn, expires = await self._replace(nursery, expires)
                stores.rebind(conn)
                self.renewals += 1
                log.info("space %s: issuer session renewed (%d), valid %d s", self.space, self.renewals, self.lifetime_s)

    async def _replace(self, nursery: trio.Nursery, expires: float) -> tuple[Connection, float]:
        """A new session; retried until one is up, or raise once none has been for a lifetime."""
        retry_s = max(0.2, self.lifetime_s / 30)
        give_up = max(expires, trio.current_time()) + self.lifetime_s
        while True:
            try:
                return await nursery.start(self._hold)
            except (Unavailable, OSError) as exc:  # refused, unreachable, or no broker there
                if trio.current_time() + retry_s >= give_up:
                    raise Unavailable(
                        f"space {self.space}: no issuer session could be opened for {self.lifetime_s} s ({exc})"
                        " - check that the broker runs and trusts the space's account"
                    ) from exc
                log.warning("space %s: issuer session not renewed, retrying in %.1f s: %s", self.space, retry_s, exc)
            await trio.sleep(retry_s)
