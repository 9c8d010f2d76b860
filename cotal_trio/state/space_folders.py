"""Is a space in the root, and the rename of the earlier ``space.<hex>`` folders (issue 18 item 3).

A space's folder is ``<root>/spaces/<name>`` (:mod:`cotal_trio.state.layout`). Roots written
before carry ``<root>/spaces/space.<hex of the UTF-8 name>``; :func:`rename_space_folders` renames
each to its name at the next start of ``cotal up`` (inside the root lock it holds) or of ``cotal
auth-service`` (:func:`migrate_space_folders`, which takes the lock for the rename only).

The rename, per folder, is one ``os.rename`` in ``<root>/spaces/`` (atomic: the folder is under
one name or the other, never half of each), and it leaves the relative symlink ``space.<hex> ->
<name>`` behind, so every path handed out before keeps working (the ``sentinelCreds`` path of
``connect-info`` and the README; the ledger rows a callout replica of an earlier version reads per
connect). No listing sees the link: :func:`_legacy_folders` skips symlinks and ``cotal space list``
skips dotted names. It is idempotent (a root with nothing to rename is left as it is, without
taking the lock) and safe if interrupted half-way (the folders renamed so far stay renamed; a crash
between a folder's rename and its symlink is mended at the next start, which renames the rest).
It runs only while no service uses the root:

* ``cotal up`` of any version holds ``<root>/up.lock`` while it runs, so another start refuses
  before anything is renamed (the sentence names its pid);
* an auth service (``cotal auth-service``, which takes no lock) of an earlier version that serves a
  space from its old folder has its readiness file ``auth-service.json`` there with a live pid:
  the rename refuses, naming the pid, and renames nothing. Stop it (or, when the pid was reused
  by another process, remove the file), then start again;
* a callout replica of an earlier version (it writes no readiness file) reads through the symlink:
  its ledger rows are where they were.

A name that has both folders (an earlier-version service recreated the old one after the rename)
is refused with both paths: which one holds the live keys is the operator's to decide.

Every command that works on one space finds it with :func:`require_space`, so an unknown space
reads ``space S is not in the root R - see `cotal space list``` from every command (and an old
folder not renamed yet says to start the root once). Blocking file I/O.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from cotal_trio.core.errors import ConfigError
from cotal_trio.core.identity import is_space

from .files import read_json
from .layout import RootPaths, SpacePaths
from .lock import LOCK_NAME, lock_file

__all__ = [
    "LEGACY_PREFIX",
    "ROOT_MARKER",
    "legacy_dir_name",
    "migrate_space_folders",
    "no_root",
    "not_in_root",
    "rename_note",
    "rename_space_folders",
    "require_root",
    "require_space",
    "space_of_legacy_name",
    "unrenamed_note",
    "unrenamed_spaces",
]

LEGACY_PREFIX = "space."
# The dotted symlink a rename makes first and moves over the old name last (rename_space_folders).
PENDING_SUFFIX = ".renaming"
# A folder holding it is a root: it is written first, by the first provisioning of the root.
ROOT_MARKER = "broker.json"


def legacy_dir_name(space: str) -> str:
    """The folder segment earlier versions gave ``space``: ``space.<hex of its UTF-8 bytes>``."""
    return LEGACY_PREFIX + space.encode("utf-8").hex()


def space_of_legacy_name(folder_name: str) -> str | None:
    """The space an earlier-version folder name stands for, or None when it is not one."""
    if not folder_name.startswith(LEGACY_PREFIX):
        return None
    try:
        name = bytes.fromhex(folder_name.removeprefix(LEGACY_PREFIX)).decode("utf-8")
    except (ValueError, UnicodeDecodeError):
        return None
    return name if is_space(name) else None


def no_root(root: Path) -> ConfigError:
    """The ConfigError for a ``--root`` that holds no root (a typo, most often)."""
    return ConfigError(f"there is no root at {root} - pass the --root of one (`cotal up` makes one)")


def not_in_root(root: Path, space: str) -> ConfigError:
    """The ConfigError for a ``--space`` the root does not hold (the one sentence every command uses)."""
    return ConfigError(f"space {space} is not in the root {root} - see `cotal space list`")


def require_root(paths: RootPaths) -> None:
    """Refuse a root folder that was never provisioned.

    Raises:
        ConfigError: ``<root>/broker.json`` does not exist (:func:`no_root`).
    """
    if not (paths.root / ROOT_MARKER).exists():
        raise no_root(paths.root)


def require_space(paths: RootPaths, space: str) -> SpacePaths:
    """The paths of ``space`` (an already valid name) once the root holds it, as ``cotal space
    list`` lists it: its folder has ``callout.json`` (written first by provisioning).

    Raises:
        ConfigError: no root at ``paths.root`` (:func:`no_root`); the space's folder still has
            its earlier name (names the start that renames it); or the root does not hold the
            space (:func:`not_in_root`).
    """
    require_root(paths)
    sp = paths.space(space)
    if sp.callout_json.exists():
        return sp
    legacy = paths.spaces_dir / legacy_dir_name(space)
    if (legacy / "callout.json").exists():
        raise ConfigError(
            f"space {space} is in the root {paths.root} under its earlier folder name {legacy.name} - "
            "start `cotal up` (or `cotal auth-service`) on the root once: it renames the folder"
        )
    raise not_in_root(paths.root, space)


def _legacy_folders(paths: RootPaths) -> list[tuple[Path, str]]:
    try:
        entries = sorted(paths.spaces_dir.iterdir())
    except FileNotFoundError:
        return []
    found = []
    for entry in entries:
        name = space_of_legacy_name(entry.name)
        if name is not None and entry.is_dir() and not entry.is_symlink():
            found.append((entry, name))
    return found


def unrenamed_spaces(paths: RootPaths) -> list[str]:
    """The spaces whose folder still has its earlier ``space.<hex>`` name (a real folder holding
    ``callout.json``; the symlink a rename leaves is not one), sorted: listings show them with
    :func:`unrenamed_note` until a start renames them."""
    return sorted(name for folder, name in _legacy_folders(paths) if (folder / "callout.json").exists())


def unrenamed_note(space: str) -> str:
    """The one line a listing shows for a space whose folder is not renamed yet."""
    return f"space {space}: folder not renamed yet - start `cotal up` or `cotal auth-service` once"


def _live_service_pid(folder: Path) -> int | None:
    """The pid in ``folder/auth-service.json`` when that process still runs."""
    path = folder / "auth-service.json"
    if not path.exists():
        return None
    try:
        pid = int(read_json(path).get("pid", 0))
    except (ConfigError, TypeError, ValueError):
        return None
    if pid <= 0 or pid == os.getpid():
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        return pid
    return pid


def _pending_link(paths: RootPaths, legacy_name: str) -> Path:
    """The symlink made before a folder's rename, moved to the old name after it (dotted: no
    listing sees it)."""
    return paths.spaces_dir / f".{legacy_name}{PENDING_SUFFIX}"


def _pending_links(paths: RootPaths) -> list[tuple[Path, Path, str]]:
    """``(pending link, old folder path, space)`` for each link a crash left half-way."""
    try:
        entries = sorted(paths.spaces_dir.iterdir())
    except FileNotFoundError:
        return []
    found = []
    for entry in entries:
        if not (entry.name.startswith(".") and entry.name.endswith(PENDING_SUFFIX) and entry.is_symlink()):
            continue
        legacy_name = entry.name[1:].removesuffix(PENDING_SUFFIX)
        name = space_of_legacy_name(legacy_name)
        if name is not None:
            found.append((entry, paths.spaces_dir / legacy_name, name))
    return found


def _mend_pending(paths: RootPaths) -> list[str]:
    """Finish the renames a crash interrupted between the folder's rename and its link's; drop
    the links of renames that never began (their old folder is still there and is renamed next)."""
    mended = []
    for pending, legacy, name in _pending_links(paths):
        if legacy.is_dir() and not legacy.is_symlink():
            os.unlink(pending)  # the rename did not happen yet: the loop makes a fresh link
        elif not os.path.lexists(legacy) and (paths.spaces_dir / name).is_dir():
            os.rename(pending, legacy)
            mended.append(name)
        else:
            os.unlink(pending)  # the old name is already a link: nothing left to do
    return mended


def rename_space_folders(paths: RootPaths) -> list[str]:
    """Rename every ``<root>/spaces/space.<hex>`` folder to its space's name, leaving the relative
    symlink ``space.<hex> -> <name>`` behind (module docstring).

    The symlink keeps every path handed out before the rename working: ``connect-info`` and the
    README gave clients ``<root>/spaces/space.<hex>/sentinel.creds``, and a callout replica of an
    earlier version still reads its ledger rows per connect under ``space.<hex>/``. Per folder:
    the link is made under a dotted name first (``.space.<hex>.renaming``), the folder renamed, then
    the link renamed over the old name; each step is one atomic call, and a crash between any two
    is finished (or undone) at the next start (:func:`_mend_pending`). The caller holds the root
    lock (``cotal up`` does; see :func:`migrate_space_folders`).

    Returns:
        The spaces whose folder was renamed (or whose interrupted rename was finished), sorted;
        empty when there was nothing to rename.

    Raises:
        ConfigError: an auth service of an earlier version serves from an old folder (names its
            pid and its readiness file; nothing is renamed), or a space has both folders (names
            both), or a rename is not permitted.
    """
    try:
        renamed = _mend_pending(paths)
    except OSError as exc:
        raise ConfigError(
            f"cannot finish an interrupted rename in {paths.spaces_dir} ({exc.strerror}) - check its permissions"
        ) from exc
    legacy = _legacy_folders(paths)
    for folder, name in legacy:
        pid = _live_service_pid(folder)
        if pid is not None:
            raise ConfigError(
                f"space {name} is served from {folder} by pid {pid}, an auth service of an earlier version - "
                f"stop it, or remove {folder / 'auth-service.json'} if pid {pid} is not cotal, then start again "
                "(the start renames the space folders to their names)"
            )
        target = paths.spaces_dir / name
        if target.exists() or target.is_symlink():
            raise ConfigError(
                f"space {name} has two folders, {folder} and {target} - keep the one holding the space's "
                "keys (its callout.json), move the other out of the root, and start again"
            )
    for folder, name in legacy:
        pending = _pending_link(paths, folder.name)
        try:
            if os.path.lexists(pending):
                os.unlink(pending)
            os.symlink(name, pending)  # relative: the root may be moved or mounted elsewhere
            os.rename(folder, paths.spaces_dir / name)
            os.rename(pending, folder)
        except OSError as exc:
            raise ConfigError(
                f"cannot rename {folder} to {name} ({exc.strerror}) - check the permissions of {paths.spaces_dir}"
            ) from exc
        renamed.append(name)
    if renamed:
        fd = os.open(paths.spaces_dir, os.O_RDONLY)
        try:
            os.fsync(fd)  # the renames survive a power loss
        finally:
            os.close(fd)
    return sorted(renamed)


def rename_note(paths: RootPaths, renamed: list[str]) -> str:
    """The log line of a start that renamed ``renamed`` (non-empty): each space's new
    ``sentinelCreds`` path, and that the old one still resolves (through the symlink)."""
    where = "; ".join(f"{name}: sentinelCreds {paths.space(name).sentinel_creds}" for name in renamed)
    return f"space folders renamed to their names in {paths.spaces_dir} ({where}; the old space.<hex> paths still resolve)"


def migrate_space_folders(paths: RootPaths) -> list[str]:
    """:func:`rename_space_folders` under the root lock, taken for the rename only (for a start
    that does not hold the lock for its life: ``cotal auth-service``).

    Nothing to rename: returns ``[]`` without touching the lock (a new-version ``cotal up`` may
    hold it, and has renamed everything at its own start).

    Raises:
        ConfigError: as :func:`rename_space_folders`; or a process (pid named) holds the root
            lock while old folders remain (an earlier-version ``cotal up``).
    """
    if not _legacy_folders(paths) and not _pending_links(paths):
        return []
    lock = paths.root / LOCK_NAME
    with lock_file(lock) as fd:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "another process"
            raise ConfigError(
                f"the space folders of {paths.root} still have their earlier names and pid {holder} holds "
                f"the root ({lock}) - stop it, then start again (the start renames them)"
            ) from None
        return rename_space_folders(paths)

