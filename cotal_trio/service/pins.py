"""A space's IdP pin (``idp.json``): the development IdP's or a real one's, set once.

``cotal up`` pins its space when it first serves it; ``cotal space add`` pins a new space when it
adds it, so a host started with ``cotal auth-service`` can serve it at once. A pin never changes:
changing it would give every user a new owner (spec "IdP compatibility").
"""

from __future__ import annotations

import os
from urllib.parse import urlsplit

from cotal_trio.core.errors import ConfigError
from cotal_trio.devidp import DevIdpMaterial, create_dev_idp
from cotal_trio.state import IdpPinRecord, RootPaths, atomic_create, load_idp_pin, missing
from cotal_trio.service.idp_keys import check_jwks_uri, fetch_jwks

__all__ = ["choose_pin", "dev_pin", "ensure_dev_idp", "load_pinned_dev_idp", "oidc_pin"]


def oidc_pin(url: str) -> IdpPinRecord:
    """The pin of a real EdDSA IdP at base ``url``: issuer and audience its origin, JWKS at
    ``<url>/jwks``.

    Raises:
        ConfigError: ``url`` is not a URL, or its JWKS address is neither https nor loopback.
    """
    parts = urlsplit(url.rstrip("/"))
    if not parts.scheme or not parts.netloc:
        raise ConfigError(f"--idp {url} is not a URL - pass the IdP's base URL, e.g. https://idp.example")
    origin = f"{parts.scheme}://{parts.netloc}"
    base = url.rstrip("/")
    return IdpPinRecord(kind="oidc", url=base, issuer=origin, audience=origin, jwks_uri=check_jwks_uri(f"{base}/jwks"))


def ensure_dev_idp(paths: RootPaths) -> DevIdpMaterial:
    """The root's development IdP, created (0600, once) when missing (blocking file I/O).

    Raises:
        ConfigError: ``devidp.json`` is corrupt.
    """
    atomic_create(paths.devidp_json, create_dev_idp(os.urandom).to_json().encode())
    return DevIdpMaterial.from_json(paths.devidp_json.read_bytes())


def load_pinned_dev_idp(root: RootPaths, space: str, issuer: str) -> DevIdpMaterial:
    """The root's development IdP, as a lane pinned to it (``issuer``) loads it at its start;
    ``cotal doctor auth`` runs the same check (blocking file I/O).

    Raises:
        ConfigError: ``devidp.json`` is missing, corrupt (:meth:`DevIdpMaterial.from_json`), or
            holds another development IdP than the space pins.
    """
    path = root.devidp_json
    if not path.exists():
        raise missing(path)
    dev = DevIdpMaterial.from_json(path.read_bytes())
    if dev.issuer != issuer:
        raise ConfigError(
            f"space {space} pins another development IdP ({issuer}) than {path} ({dev.issuer}) - "
            "restore that file from a backup"
        )
    return dev


def dev_pin(dev: DevIdpMaterial) -> IdpPinRecord:
    """The pin of the development IdP ``dev``."""
    return IdpPinRecord(kind="dev", url="", issuer=dev.issuer, audience=dev.audience, jwks_uri="")


async def choose_pin(paths: RootPaths, space: str, *, idp_url: str | None) -> IdpPinRecord | None:
    """The pin a new space gets, or None when it is pinned already (and ``idp_url`` agrees).

    With ``idp_url`` the IdP's JWKS is read first (a typo must not pin a space for good);
    without it the root's development IdP is the pin (``devidp.json`` created when missing).
    Nothing is written to the space: the caller saves the pin (``add_space(idp_pin=...)``)
    before the space is hosted, so no lane starts unpinned. Trio-flavoured (the fetch runs in a
    worker thread; bounded by the caller's deadline).

    Raises:
        ConfigError: ``idp_url`` differs from the space's pin, is not a URL, or a pin file is
            corrupt.
        Unavailable: the IdP's JWKS could not be read.
    """
    path = paths.space(space).idp_json
    pinned = load_idp_pin(path) if path.exists() else None
    wanted = oidc_pin(idp_url) if idp_url is not None else None
    if pinned is not None:
        if wanted is not None and (pinned.issuer, pinned.jwks_uri) != (wanted.issuer, wanted.jwks_uri):
            raise ConfigError(
                f"space {space} is pinned to IdP {pinned.issuer}; changing the pin re-keys every owner"
                " - keep the pinned IdP, or use a new space"
            )
        return None
    if wanted is not None:
        await fetch_jwks(wanted.jwks_uri)
        return wanted
    return dev_pin(ensure_dev_idp(paths))
