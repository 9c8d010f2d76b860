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

The reset itself (issue 19 item 6) is :func:`delete_secret_keys`: it deletes the files holding
the inventoried keys, all or none. Every file of the table holds the space's secret keys and
otherwise only their public halves (``callout.json``'s account pubs and ``sentinelCreds``, which
``sentinel.creds`` keeps), so a key is deleted by deleting its file: a ``callout.json`` without
its seeds would be a file no lane can load. The files are first renamed into a fresh folder
``<space folder>/.deprovision-<random>/`` (the same file system, so each move is one atomic
``rename``); a failed move puts the moved ones back, and only once all are aside is that folder
deleted. ``callout.json``, the file provisioning writes first (its commit point), moves last, so
until the reset commits the space is still in the root as every command finds it. A process
killed in between leaves its ``.deprovision-*`` folder: the next run deletes it with the rest
(the operator confirmed that reset), so a rerun always completes it.
"""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cotal_trio.core.errors import ConfigError
from cotal_trio.core.identity import is_space
from cotal_trio.core.nkeys import Prefix

from .files import _fsync_dir, naming, read_fields
from .layout import RootPaths, SpacePaths
from .material import public_key_field
from .space_folders import require_space

__all__ = [
    "ASIDE_PREFIX",
    "DeletedSecrets",
    "SecretInventory",
    "SecretKey",
    "SecretLocation",
    "delete_secret_keys",
    "deprovision_secret_keys",
    "shared_secret_locations",
    "space_secret_locations",
]

# The folder a reset moves the space's secret files into before it deletes them.
ASIDE_PREFIX = ".deprovision-"

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
    """A space's secret keys (all inside ``segment``) and the root-level keys it shares.

    Attributes:
        aside: ``.deprovision-*`` folders in ``segment`` an interrupted reset left (secret files
            moved aside, not yet deleted); the next :func:`delete_secret_keys` deletes them.
    """

    space: str
    segment: Path
    keys: tuple[SecretKey, ...]
    shared: tuple[SecretKey, ...]
    aside: tuple[Path, ...] = ()

    def __post_init__(self) -> None:
        # Spec: a key outside the space's secret segment cannot take part in a local reset.
        outside = [str(key.path) for key in self.keys if not key.path.is_relative_to(self.segment)]
        outside += [str(folder) for folder in self.aside if folder.parent != self.segment]
        if outside:
            raise ValueError(f"secret keys outside {self.segment}: {', '.join(outside)}")

    def to_json(self) -> dict[str, Any]:
        """``{space, segment, keys: [SecretKey.to_json()...], shared: [...], aside: [path...]}``."""
        return {"space": self.space, "segment": str(self.segment),
                "keys": [key.to_json() for key in self.keys],
                "shared": [key.to_json() for key in self.shared],
                "aside": [str(folder) for folder in self.aside]}

    @property
    def on_disk(self) -> tuple[SecretKey, ...]:
        """The keys whose file exists: what a reset deletes."""
        return tuple(key for key in self.keys if key.exists)


@dataclass(frozen=True, slots=True, kw_only=True)
class DeletedSecrets:
    """What :func:`delete_secret_keys` deleted.

    Attributes:
        keys: the keys deleted (those of the inventory whose file existed), in inventory order.
        files: the files deleted, in the order they were moved aside (``callout.json`` last).
        aside: the ``.deprovision-*`` folders of an interrupted earlier reset, deleted too.
    """

    space: str
    segment: Path
    keys: tuple[SecretKey, ...]
    files: tuple[Path, ...]
    aside: tuple[Path, ...]


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
        aside=_aside_folders(sp.dir),
    )


def delete_secret_keys(inventory: SecretInventory) -> DeletedSecrets:
    """Delete the files holding ``inventory``'s keys, all or none (spec "Offline secret
    inventory"; the module docstring gives the order). Blocking file I/O.

    The caller has checked that nothing uses the keys any more (no manifest lists the space, no
    lane of it runs): this function only deletes. Files the inventory found missing are skipped;
    a file that vanished since is a failure like any other (everything moved is put back).

    Returns:
        A :class:`DeletedSecrets`; empty ``files`` and ``aside`` when nothing was on disk.

    Raises:
        ConfigError: a key's file is not a regular file (a symlink would move the link and leave
            the secret where it points): nothing is moved. A move failed (names the file): every
            file moved before it is back in place. The files were all moved aside but the folder
            could not be deleted (names it; a rerun deletes it). A failed move could not be
            undone (names where the moved files are).
    """
    files = tuple(dict.fromkeys(key.path for key in reversed(inventory.on_disk)))
    for path in files:
        if not stat.S_ISREG(os.lstat(path).st_mode):
            raise ConfigError(f"{path} is not a regular file - put the space's own file there, or remove it by hand")
    keys = inventory.on_disk
    if not files and not inventory.aside:
        return DeletedSecrets(space=inventory.space, segment=inventory.segment, keys=(), files=(), aside=())
    folder = Path(tempfile.mkdtemp(prefix=ASIDE_PREFIX, dir=inventory.segment))
    moved: list[Path] = []
    try:
        for path in files:
            with naming(path):
                os.rename(path, folder / path.name)
            moved.append(path)
        _fsync_dir(inventory.segment)
    except OSError as exc:
        _put_back(folder, moved)
        raise ConfigError(
            f"moving {exc.filename or inventory.segment} aside failed ({exc.strerror or exc}) - nothing was"
            " deleted (every file is back in place); fix that and run the reset again"
        ) from None
    for aside in (*inventory.aside, folder):
        try:
            shutil.rmtree(aside)
        except OSError as exc:
            raise ConfigError(
                f"space {inventory.space}'s secret files are out of place in {aside} but it could not be"
                f" deleted ({exc.strerror or exc}) - fix that and run the reset again: it deletes the folder"
            ) from None
    _fsync_dir(inventory.segment)
    return DeletedSecrets(space=inventory.space, segment=inventory.segment, keys=keys, files=files,
                          aside=inventory.aside)


def _put_back(folder: Path, moved: list[Path]) -> None:
    """Undo the moves of a failed reset, last first, then drop the empty ``folder``.

    Raises:
        ConfigError: a file could not be moved back (names the folder holding it).
    """
    for path in reversed(moved):
        try:
            os.rename(folder / path.name, path)
        except OSError as exc:
            raise ConfigError(
                f"moving {path.name} back from {folder} failed ({exc.strerror or exc}) - move the files there"
                f" back into {path.parent} by hand, or run the reset again to delete them"
            ) from None
    folder.rmdir()
    _fsync_dir(folder.parent)


def _aside_folders(segment: Path) -> tuple[Path, ...]:
    """The ``.deprovision-*`` folders of an interrupted reset in ``segment`` (real folders only)."""
    try:
        entries = sorted(segment.iterdir())
    except FileNotFoundError:
        return ()
    return tuple(e for e in entries if e.name.startswith(ASIDE_PREFIX) and e.is_dir() and not e.is_symlink())


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

