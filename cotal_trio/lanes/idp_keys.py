"""The pinned IdP's key set, fetched from its JWKS and cached (spec "Bridge contract" step 1).

Keys resolve only through the pinned JWKS URI, which must be ``https://`` or loopback
``http://``. The HTTP faces read the cache synchronously (:meth:`IdpKeyCache.keys`); only the
host fetches, so a request never waits on the IdP.
"""

from __future__ import annotations

import json
import logging
import urllib.error
from collections.abc import Mapping
from typing import NoReturn

import trio
from nacl.signing import VerifyKey

from ..core.errors import CodecError, ConfigError, Unavailable
from ..core.idp import parse_jwks
from ..http.client import check_url, no_redirect_opener

__all__ = ["IdpKeyCache", "check_jwks_uri", "fetch_jwks", "open_pinned_keys"]

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
        Unavailable: the IdP did not answer, answered an error, or sent no usable Ed25519 key.
    """
    check_jwks_uri(uri)
    remaining = trio.current_effective_deadline() - trio.current_time()
    timeout_s = max(0.1, min(10.0, remaining))
    try:
        body = await trio.to_thread.run_sync(_get, uri, timeout_s, abandon_on_cancel=True)
        if len(body) > MAX_JWKS_BYTES:
            raise Unavailable(f"the IdP JWKS at {uri} is larger than {MAX_JWKS_BYTES} bytes")
        return parse_jwks(json.loads(body))
    except (OSError, urllib.error.URLError, ValueError, CodecError) as exc:
        raise Unavailable(f"could not read the IdP JWKS at {uri}: {exc}") from exc


class IdpKeyCache:
    """The last good key set of the pinned IdP; :meth:`keys` is what the faces read."""

    def __init__(self, keys: Mapping[str, VerifyKey]) -> None:
        self._keys = dict(keys)

    def keys(self) -> Mapping[str, VerifyKey]:
        """Sync: the current key set ``{kid: VerifyKey}``."""
        return self._keys

    def replace(self, keys: Mapping[str, VerifyKey]) -> None:
        """Sync: install a freshly fetched key set (a failed fetch keeps the last good one)."""
        self._keys = dict(keys)


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
            cache = IdpKeyCache(await fetch_jwks(uri))
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
