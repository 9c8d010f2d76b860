"""The offline secret inventory of a space: where its secret keys live, listed but never read.

Spec "Auth service integration", section "Offline secret inventory" (issue 5 item 8): the
inventory "returns keys only and performs no deletion or secret read", and a key outside the
selected space's secret segment cannot take part in a local reset. Here the segment is the space
folder ``<root>/spaces/<space>/``; root-level keys (operator, system account, development
IdP) serve every space, so they are listed apart as *shared*, never as the space's.

The space's secret keys (DESIGN.md sections 2 and 4: what a lane holds for its space):

================================  =====================  ===========================  ======================
kind                              file                   field                        public key from
================================  =====================  ===========================  ======================
auth-account-signing-key          ``callout.json``       ``auth.signingSeed``         ``auth.signingKey``
data-account-callout-signing-key  ``callout.json``       ``data.calloutSigningSeed``  ``data.signingKeys.0``
data-account-service-signing-key  ``callout.json``       ``data.serviceSigningSeed``  ``data.signingKeys.1``
xkey                              ``callout.json``       ``xkeySeed``                 ``auth.xkey``
callout-user                      ``callout.json``       ``calloutCreds``             ``auth.calloutUser``
bearer-issuer-keys                ``issuer.json``        ``keys.*.privateJwk``        (none)
owner-secret                      ``owner-secret.json``  ``secretB64``                (none)
capability                        ``auth-service.json``  ``cap``                      (none)
================================  =====================  ===========================  ======================

Public keys come only from ``accounts.json`` (account pubs and JWTs: no secret in it). Left out on
purpose: the sentinel (``sentinelCreds``, ``sentinel.creds``) is public material (DESIGN.md
section 4); ``idp.json``, ``mode.json`` and ``accounts.json`` hold no secret; ledger rows hold
only a SHA-256 of a managed actor's token. ``auth-service.json`` exists only while a lane runs.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cotal_trio.core.errors import ConfigError
from cotal_trio.core.identity import is_space
from cotal_trio.core.nkeys import Prefix

from .files import read_fields
from .layout import RootPaths, SpacePaths
from .material import public_key_field
from .space_folders import require_space

__all__ = [
    "SecretInventory",
    "SecretKey",
    "SecretLocation",
    "deprovision_secret_keys",
    "shared_secret_locations",
    "space_secret_locations",
]

# The role of each public key ``accounts.json`` records, by its dotted field.
_PUBLIC_ROLES = {
    "auth.signingKey": Prefix.ACCOUNT,
    "data.signingKeys.0": Prefix.ACCOUNT,
    "data.signingKeys.1": Prefix.ACCOUNT,
    "auth.xkey": Prefix.CURVE,
    "auth.calloutUser": Prefix.USER,
}


@dataclass(frozen=True, slots=True, kw_only=True)
class SecretLocation:
    """Where one secret key lives: its file and its dotted field there. A plan: no I/O.

    ``public_field`` is the ``accounts.json`` field naming its public key, if one does.
    """

    kind: str
    path: Path
    field: str
    public_field: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class SecretKey:
    """One inventoried secret key: its location, whether its file exists, and the file's mode.

    Attributes:
        mode: the permission bits (``stat.S_IMODE``), or None when the file does not exist.
        public_key: the key's public ``A...``/``U...``/``X...`` key, or None when no
            non-secret file names it.
    """

    kind: str
    path: Path
    field: str
    exists: bool
    mode: int | None
    public_key: str | None

    def __post_init__(self) -> None:
        if self.exists != (self.mode is not None):
            raise ValueError("a secret key has a mode exactly when its file exists")

    def to_json(self) -> dict[str, Any]:
        """``{kind, path, field, exists, mode: "0600"|null, publicKey}``."""
        mode = None if self.mode is None else f"{self.mode:04o}"
        return {"kind": self.kind, "path": str(self.path), "field": self.field,
                "exists": self.exists, "mode": mode, "publicKey": self.public_key}


@dataclass(frozen=True, slots=True, kw_only=True)
class SecretInventory:
    """A space's secret keys (all inside ``segment``) and the root-level keys it shares."""

    space: str
    segment: Path
    keys: tuple[SecretKey, ...]
    shared: tuple[SecretKey, ...]

    def __post_init__(self) -> None:
        # Spec: a key outside the space's secret segment cannot take part in a local reset.
        outside = [str(key.path) for key in self.keys if not key.path.is_relative_to(self.segment)]
        if outside:
            raise ValueError(f"secret keys outside {self.segment}: {', '.join(outside)}")

    def to_json(self) -> dict[str, Any]:
        """``{space, segment, keys: [SecretKey.to_json()...], shared: [...]}``."""
        return {"space": self.space, "segment": str(self.segment),
                "keys": [key.to_json() for key in self.keys],
                "shared": [key.to_json() for key in self.shared]}


def space_secret_locations(sp: SpacePaths) -> tuple[SecretLocation, ...]:
    """Where the space's secret keys live, in the module table's order (pure, no I/O)."""
    callout = sp.callout_json
    return (
        SecretLocation(kind="auth-account-signing-key", path=callout, field="auth.signingSeed",
                       public_field="auth.signingKey"),
        SecretLocation(kind="data-account-callout-signing-key", path=callout,
                       field="data.calloutSigningSeed", public_field="data.signingKeys.0"),
        SecretLocation(kind="data-account-service-signing-key", path=callout,
                       field="data.serviceSigningSeed", public_field="data.signingKeys.1"),
        SecretLocation(kind="xkey", path=callout, field="xkeySeed", public_field="auth.xkey"),
        SecretLocation(kind="callout-user", path=callout, field="calloutCreds",
                       public_field="auth.calloutUser"),
        SecretLocation(kind="bearer-issuer-keys", path=sp.issuer_json, field="keys.*.privateJwk"),
        SecretLocation(kind="owner-secret", path=sp.owner_secret_json, field="secretB64"),
        SecretLocation(kind="capability", path=sp.auth_service_json, field="cap"),
    )


def shared_secret_locations(paths: RootPaths) -> tuple[SecretLocation, ...]:
    """Root-level secret keys every space of the root relies on (pure, no I/O)."""
    broker = paths.broker_json
    return (
        SecretLocation(kind="operator-identity-key", path=broker, field="operator.seed"),
        SecretLocation(kind="operator-signing-key", path=broker, field="operator.signingSeed"),
        SecretLocation(kind="system-account-signing-key", path=broker, field="system.signingSeed"),
        SecretLocation(kind="system-user", path=broker, field="system.userCreds"),
        SecretLocation(kind="dev-idp-key", path=paths.devidp_json, field="privateJwk"),
    )


def deprovision_secret_keys(paths: RootPaths, space: str) -> SecretInventory:
    """The offline secret inventory of ``space`` (spec "Offline secret inventory").

    Lists the locations of :func:`space_secret_locations` as ``keys`` and of
    :func:`shared_secret_locations` as ``shared``, each stat-ed for existence and mode. No
    secret file is opened and nothing is written or deleted; the only file read is the space's
    ``accounts.json`` (public keys), when it exists. Blocking file I/O, not a checkpoint: call it
    through ``trio.to_thread.run_sync`` from trio.

    Returns:
        A :class:`SecretInventory` (``to_json()`` gives ``{space, segment, keys, shared}``).

    Raises:
        ConfigError: ``space`` is not a space name; the root does not hold the space
            (:func:`cotal_trio.state.space_folders.require_space`: names ``cotal space list``); or ``accounts.json`` is
            corrupt or written for another space.
        OSError: a file cannot be stat-ed for a reason other than not existing.
    """
    if not is_space(space):
        raise ConfigError(f"{space!r} is not a space name - use 1 to 64 letters, digits, _ and -")
    sp = paths.space(space)
    if not sp.dir.is_dir():  # a partly provisioned space (a folder, no callout.json) is listed
        require_space(paths, space)  # raises: no root, an earlier folder name, or not in the root
    public = _public_keys(sp)
    return SecretInventory(
        space=space, segment=sp.dir,
        keys=tuple(_inventoried(where, public) for where in space_secret_locations(sp)),
        shared=tuple(_inventoried(where, {}) for where in shared_secret_locations(paths)),
    )


def _inventoried(where: SecretLocation, public: dict[str, str]) -> SecretKey:
    try:
        mode: int | None = stat.S_IMODE(os.stat(where.path).st_mode)
    except FileNotFoundError:
        mode = None
    return SecretKey(
        kind=where.kind, path=where.path, field=where.field, exists=mode is not None, mode=mode,
        public_key=public.get(where.public_field) if where.public_field else None,
    )


def _public_keys(sp: SpacePaths) -> dict[str, str]:
    """``{accounts.json field: public key}``; empty when the space has no ``accounts.json``."""
    if not sp.accounts_json.exists():
        return {}
    f = read_fields(sp.accounts_json)
    if f.get("space", str) != sp.space:
        raise f.bad(f"it belongs to space {f.get('space', str)!r}, not {sp.space!r}")
    return {dotted: public_key_field(f, dotted, role) for dotted, role in _PUBLIC_ROLES.items()}

