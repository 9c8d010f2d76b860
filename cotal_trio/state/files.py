"""Files in the root: atomic writes, private folders, strict JSON reads.

Every write goes to a temporary file in the destination's own folder, is fsynced, and is renamed
over the destination with :func:`os.replace`, so a reader sees the old file or the new one, never
a half-written one; the folder is fsynced after the rename so the rename survives a power loss.
Secrets are written 0600 and folders created 0700 (DESIGN.md section 4).

A root file that cannot be read back is the operator's problem to fix, never ours to overwrite:
:func:`read_json` raises :class:`ConfigError` with a sentence naming the file and the fix, and
leaves the file untouched.

Blocking file I/O: call these from synchronous code or through ``trio.to_thread.run_sync``.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import stat
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

from cotal_trio.core.errors import ConfigError
from cotal_trio.core.identity import is_space

__all__ = [
    "FULL_DISK_ERRNOS",
    "Fields",
    "atomic_create",
    "atomic_write",
    "corrupt",
    "ensure_dir",
    "missing",
    "naming",
    "open_to_others",
    "read_fields",
    "read_json",
    "remove_quietly",
    "render_json",
    "save_json",
    "write_json",
]

# Every root JSON file carries {"ver": 1}; another version is refused, never guessed at.
VERSION = 1
SECRET_MODE = 0o600
FOLDER_MODE = 0o700
# The permission bits that let group or others in: a secret (SECRET_MODE) has none of them.
SHARED_BITS = 0o077
# Temporary files are hidden and carry this suffix; folder scans skip them.
TEMP_SUFFIX = ".tmp"
# A write refused for want of space: the file system is full, or the writer's quota is.
FULL_DISK_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})


def corrupt(path: Path | str, why: str) -> ConfigError:
    """The ConfigError for a root file that exists but cannot be used (the file stays as is)."""
    return ConfigError(
        f"{path} is corrupt ({why}) - restore it from a backup or move the root aside "
        "and run `cotal up` again"
    )


def missing(path: Path | str) -> ConfigError:
    """The ConfigError for a root file that should exist but does not.

    A space's own file (``<root>/spaces/<space>/...``) names ``cotal space add``, which
    provisions that space again; restarting ``cotal up`` makes only its own space's files, so
    for any other space it would not bring the file back. Any other file names ``cotal up``.
    """
    path = Path(path)
    folder = path.parent
    if folder.parent.name == "spaces" and is_space(folder.name):
        root = folder.parent.parent
        return ConfigError(f"{path} is missing - run `cotal space add {folder.name} --root {root}` to provision the space again")
    return ConfigError(f"{path} is missing - run `cotal up` (or add the space again) to provision the root")


def ensure_dir(path: Path | str, mode: int = FOLDER_MODE) -> Path:
    """Create ``path`` and any missing parents; every folder created here gets ``mode``.

    Folders that already exist keep their mode (the root may sit inside a folder the operator
    owns, like the working directory). Returns ``path`` as a :class:`Path`.

    Raises:
        ConfigError: a component exists and is not a folder, or creation is not permitted.
    """
    path = Path(path)
    missing_parts = []
    for candidate in (path, *path.parents):
        if candidate.is_dir():
            break
        missing_parts.append(candidate)
    for folder in reversed(missing_parts):
        try:
            folder.mkdir(mode=mode)
        except FileExistsError:
            if not folder.is_dir():
                raise ConfigError(f"{folder} exists and is not a folder - move it aside") from None
            continue
        except OSError as exc:
            raise ConfigError(f"cannot create {folder} ({exc.strerror}) - check its permissions") from exc
        os.chmod(folder, mode)  # mkdir's mode is masked by the umask
    return path


def open_to_others(path: Path | str) -> int | None:
    """The permission bits of the secret file ``path`` (``stat.S_IMODE``) when they let group or
    others in (any of ``SHARED_BITS``), else None: the file is private, or there is none.

    The caller warns with the fix, ``chmod 600 <path>``; the file is read as it is (a secret
    another user could read is exposed already, and refusing it would not take that back).
    """
    try:
        mode = stat.S_IMODE(os.stat(path).st_mode)
    except FileNotFoundError:
        return None
    return mode if mode & SHARED_BITS else None


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_temp(path: Path, data: bytes, mode: int) -> Path:
    """Write ``data`` to a fresh temporary file beside ``path``, fsynced, with ``mode``."""
    fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=TEMP_SUFFIX)
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
    except BaseException:
        remove_quietly(name)
        raise
    return Path(name)


@contextlib.contextmanager
def naming(path: Path | str) -> Iterator[None]:
    """Give an ``OSError`` raised inside the block the file name ``path`` when it has none.

    A write that fails on a full disk (``write``, ``flush`` or ``fsync``: ``ENOSPC``, ``EDQUOT``)
    or a failing one (``EIO``) says only "No space left on device"; the operator needs the file
    it could not write (issue 15 item 11). The error keeps its errno, so its type is kept too
    (``OSError(errno.ENOENT, ...)`` is a FileNotFoundError).
    """
    try:
        yield
    except OSError as exc:
        if exc.filename is not None or exc.errno is None:
            raise
        raise OSError(exc.errno, exc.strerror or os.strerror(exc.errno), str(path)) from exc


def atomic_write(path: Path | str, data: bytes, *, mode: int = SECRET_MODE) -> None:
    """Replace ``path`` with ``data`` atomically (temp file, fsync, ``os.replace``).

    The parent folder is created (0700) when missing. On any failure the temporary file is
    removed and ``path`` is unchanged.

    Raises:
        ConfigError: the folder cannot be created (:func:`ensure_dir`).
        OSError: the write failed; it names ``path`` (:func:`naming`), e.g. ``[Errno 28] No
            space left on device: '<path>'``.
    """
    path = Path(path)
    ensure_dir(path.parent)
    with naming(path):
        temp = _write_temp(path, data, mode)
        try:
            os.replace(temp, path)
        except BaseException:
            remove_quietly(temp)
            raise
        _fsync_dir(path.parent)


def atomic_create(path: Path | str, data: bytes, *, mode: int = SECRET_MODE) -> bool:
    """Create ``path`` with ``data`` only if it does not exist yet, atomically.

    The content is complete before the name appears (a hard link of a fsynced temp file), so two
    provisioners racing on first run cannot both win, and a key once written is never replaced.

    Returns:
        True when this call created the file; False when it already existed (nothing written).
    """
    path = Path(path)
    ensure_dir(path.parent)
    with naming(path):
        temp = _write_temp(path, data, mode)
        try:
            _link_or_rename(temp, path)
        except FileExistsError:
            return False
        finally:
            remove_quietly(temp)
        _fsync_dir(path.parent)
    return True


def _link_or_rename(temp: Path, path: Path) -> None:
    """Publish ``temp`` as ``path`` unless it exists (FileExistsError).

    A hard link never replaces; on a filesystem without hard links, fall back to an existence
    check plus ``os.replace`` (still never half-written, but two racing creators may both win).
    """
    try:
        os.link(temp, path)
    except FileExistsError:
        raise
    except OSError as exc:
        if exc.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EMLINK):
            raise
        if path.exists():
            raise FileExistsError(path) from None
        os.replace(temp, path)


def render_json(obj: Any) -> bytes:
    """The root's JSON form: sorted keys, 2-space indent, trailing newline, UTF-8."""
    return (json.dumps(obj, sort_keys=True, indent=2, ensure_ascii=False) + "\n").encode()


def write_json(path: Path | str, obj: Any, *, mode: int = SECRET_MODE) -> None:
    """Atomically write ``obj`` as JSON (see :func:`render_json` and :func:`atomic_write`)."""
    atomic_write(path, render_json(obj), mode=mode)


def read_json(path: Path | str) -> dict[str, Any]:
    """Read a root JSON file that must hold an object.

    Raises:
        ConfigError: the file is missing (:func:`missing`), unreadable, not UTF-8 JSON, or not
            a JSON object (:func:`corrupt`). The file is never modified.
    """
    path = Path(path)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise missing(path) from None
    except OSError as exc:
        raise corrupt(path, f"unreadable: {exc.strerror}") from exc
    try:
        value = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise corrupt(path, f"not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise corrupt(path, "not a JSON object")
    return value


def remove_quietly(path: Path | str) -> bool:
    """Remove a file; True when it existed, False when it was already gone."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
        return True
    return False


T = TypeVar("T")


class Fields:
    """Typed access to a JSON object read from ``path``; every failure names the file.

    ``get("a.b.0.c", str)`` walks objects by key and arrays by index and checks the leaf's type
    (``bool`` never passes for ``int``). Failures raise :func:`corrupt` for ``path``.
    """

    __slots__ = ("path", "obj")

    def __init__(self, path: Path | str, obj: dict[str, Any]) -> None:
        self.path = Path(path)
        self.obj = obj

    def bad(self, why: str) -> ConfigError:
        """The :func:`corrupt` error for this file."""
        return corrupt(self.path, why)

    def build(self, factory: Callable[..., T], **fields: Any) -> T:
        """``factory(**fields)``; its ConfigError (a rule the values break) names this file."""
        try:
            return factory(**fields)
        except ConfigError as exc:
            raise self.bad(str(exc)) from None

    def get(self, dotted: str, kind: type[T] | tuple[type, ...]) -> T:
        """The value at ``dotted``, which must be an instance of ``kind``."""
        value: Any = self.obj
        for part in dotted.split("."):
            if isinstance(value, dict) and part in value:
                value = value[part]
            elif isinstance(value, list) and part.isdigit() and int(part) < len(value):
                value = value[int(part)]
            else:
                raise self.bad(f"{dotted} is missing")
        wrong_bool = isinstance(value, bool) and bool not in _kinds(kind)
        if wrong_bool or not isinstance(value, kind):
            raise self.bad(f"{dotted} has the wrong type")
        return value


def _kinds(kind: type | tuple[type, ...]) -> tuple[type, ...]:
    return kind if isinstance(kind, tuple) else (kind,)


def read_fields(path: Path | str) -> Fields:
    """:func:`read_json` plus the ``ver`` check, as :class:`Fields`.

    Raises:
        ConfigError: as :func:`read_json`, or ``ver`` is not 1.
    """
    fields = Fields(path, read_json(path))
    if fields.get("ver", int) != VERSION:
        raise fields.bad(f"ver must be {VERSION}")
    return fields


def save_json(path: Path | str, obj: Any, *, exclusive: bool = False) -> bool:
    """Write ``obj`` 0600; with ``exclusive`` only create (see :func:`atomic_create`).

    Returns:
        True when written; False when ``exclusive`` and the file already existed.
    """
    if exclusive:
        return atomic_create(path, render_json(obj))
    write_json(path, obj)
    return True
