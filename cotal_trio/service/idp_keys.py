"""The pinned IdP's key set, fetched from its JWKS and cached (spec "Bridge contract" step 1).

Keys resolve only through the pinned JWKS URI, which must be ``https://`` or loopback
``http://``. The HTTP faces read the cache synchronously (:meth:`IdpKeyCache.keys`). The host
re-reads the JWKS every ``JWKS_REFRESH_S``; besides, a token naming a ``kid`` the cache lacks
(the IdP rotated its keys) makes the face await :meth:`IdpKeyCache.refetch` before it verifies:
at most one read per ``REFETCH_COOLDOWN_S`` (30 s), bounded by ``REFETCH_WAIT_S``, so a flood of
made-up ``kid`` values costs the IdP one request every 30 s.
"""

from __future__ import annotations

import http.client
import json
import logging
import urllib.error
from collections.abc import Awaitable, Callable, Mapping
from typing import NoReturn

import trio
from nacl.signing import VerifyKey

from cotal_trio.core.errors import CodecError, ConfigError, Unavailable
from cotal_trio.core.idp import parse_jwks
from cotal_trio.core.jose import shown
from cotal_trio.http.client import check_url, no_redirect_opener

__all__ = ["REFETCH_COOLDOWN_S", "REFETCH_WAIT_S", "IdpKeyCache", "check_jwks_uri", "fetch_jwks", "open_pinned_keys"]

log = logging.getLogger("cotal.idp")

MAX_JWKS_BYTES = 256 * 1024


def check_jwks_uri(uri: str) -> str:
    """Return ``uri`` when it is https, or http to a loopback host; else ConfigError."""
    try:
        return check_url(uri)
    except ConfigError:
        raise ConfigError(f"the IdP JWKS URI {uri} must be https:// (or http:// on loopback) - fix --idp") from None


def _get(uri: str, timeout_s: float) -> bytes:
    # No redirects: a 3xx could point the key set at a host the pin never named.
    with no_redirect_opener(uri).open(uri, timeout=timeout_s) as response:
        return response.read(MAX_JWKS_BYTES + 1)


async def fetch_jwks(uri: str) -> dict[str, VerifyKey]:
    """Fetch and parse the JWKS at ``uri`` (checkpoint; the fetch runs in a worker thread).

    Bounded by the caller's trio deadline, else 10 s.

    Raises:
        ConfigError: the URI is not https/loopback.
        Unavailable: the IdP did not answer, answered an error or not HTTP, or sent no usable
            Ed25519 key.
    """
    check_jwks_uri(uri)
    remaining = trio.current_effective_deadline() - trio.current_time()
    timeout_s = max(0.1, min(10.0, remaining))
    try:
        body = await trio.to_thread.run_sync(_get, uri, timeout_s, abandon_on_cancel=True)
        if len(body) > MAX_JWKS_BYTES:
            raise Unavailable(f"the IdP JWKS at {uri} is larger than {MAX_JWKS_BYTES} bytes")
        return parse_jwks(json.loads(body))
    # http.client's own errors (a bad status line, a broken chunked body) are not OSErrors.
    except (OSError, urllib.error.URLError, http.client.HTTPException, ValueError, CodecError) as exc:
        raise Unavailable(f"could not read the IdP JWKS at {uri}: {str(exc) or type(exc).__name__}") from exc


# An unknown kid re-reads the JWKS at most once per this many seconds, and a request waits at
# most this long for that read (then it is verified against the keys there are).
REFETCH_COOLDOWN_S = 30.0
REFETCH_WAIT_S = 5.0

Fetch = Callable[[str], Awaitable[dict[str, VerifyKey]]]


class IdpKeyCache:
    """The last good key set of the pinned IdP; :meth:`keys` is what the faces read.

    Args:
        keys: the key set read at start.
        uri: the pinned JWKS URI, for :meth:`refetch` (None: the key set never changes, as a
            development IdP's).
        fetch: how the JWKS is read (:func:`fetch_jwks`; a fake in tests).
    """

    def __init__(self, keys: Mapping[str, VerifyKey], *, uri: str | None = None, fetch: Fetch | None = None) -> None:
        self._keys = dict(keys)
        self._uri, self._fetch = uri, fetch_jwks if fetch is None else fetch
        self._last_refetch: float | None = None  # trio time of the last refetch started
        self._refetching: trio.Event | None = None

    def keys(self) -> Mapping[str, VerifyKey]:
        """Sync: the current key set ``{kid: VerifyKey}``."""
        return self._keys

    def replace(self, keys: Mapping[str, VerifyKey]) -> None:
        """Sync: install a freshly fetched key set (a failed fetch keeps the last good one)."""
        self._keys = dict(keys)

    async def refetch(self, kid: str) -> None:
        """Trio: re-read the JWKS because a token names ``kid``, which the key set lacks.

        Returns at once when ``kid`` is known by now, when there is no URI, or when the last
        refetch began less than ``REFETCH_COOLDOWN_S`` ago (unless that one is still running:
        then it waits for it). Waits at most ``REFETCH_WAIT_S``, then abandons the read. A
        failed read is logged and keeps the last good keys. Never raises for the IdP's failures.
        """
        if kid in self._keys or self._uri is None:
            await trio.lowlevel.checkpoint()
            return
        with trio.move_on_after(REFETCH_WAIT_S):
            if self._refetching is not None:
                await self._refetching.wait()
                return
            now = trio.current_time()
            if self._last_refetch is not None and now - self._last_refetch < REFETCH_COOLDOWN_S:
                await trio.lowlevel.checkpoint()
                return
            self._last_refetch, self._refetching = now, trio.Event()
            try:
                self.replace(await self._fetch(self._uri))
                log.info("idp: re-read the JWKS at %s for unknown key %s", self._uri, shown(kid))
            except Unavailable as exc:
                log.warning("idp: could not re-read the JWKS at %s for key %s (%s)", self._uri, shown(kid), exc)
            finally:
                self._refetching.set()
                self._refetching = None


# How long one JWKS read may take, and how often a pinned IdP's JWKS is re-read (its
# Cache-Control max-age of 300 s, upstream-notes 3.1).
JWKS_FETCH_CEILING_S = 15.0
JWKS_REFRESH_S = 300.0


async def open_pinned_keys(uri: str, nursery: trio.Nursery) -> IdpKeyCache:
    """Read the pinned JWKS now and keep re-reading it in ``nursery`` (checkpoint).

    Raises:
        ConfigError: the URI is not https/loopback.
        Unavailable: the first read failed or did not answer within ``JWKS_FETCH_CEILING_S``.
    """
    try:
        with trio.fail_after(JWKS_FETCH_CEILING_S):
            cache = IdpKeyCache(await fetch_jwks(uri), uri=uri)
    except trio.TooSlowError:
        raise Unavailable(f"the IdP JWKS at {uri} did not answer in time - check the IdP, or --idp") from None
    nursery.start_soon(_refresh, uri, cache)
    return cache


async def _refresh(uri: str, cache: IdpKeyCache) -> NoReturn:
    """Re-read the JWKS every ``JWKS_REFRESH_S``; a failed read keeps the last good keys."""
    while True:
        await trio.sleep(JWKS_REFRESH_S)
        try:
            with trio.fail_after(JWKS_FETCH_CEILING_S):
                cache.replace(await fetch_jwks(uri))
        except (Unavailable, trio.TooSlowError) as exc:
            log.warning("idp: could not refresh the JWKS at %s (%s); keeping the last good keys", uri, exc)
