"""The actor ledger as files (upstream-notes 1.3): one row per principal, the folder is the kind.

```
<space dir>/actors/<owner>.<actor>.json           interactive rows
<space dir>/managed-actors/<owner>.<actor>.json   managed rows
```

Reads are fresh every call, so a grant or a revoke bites on the next exchange or connect:
:func:`read_principal` reads the files; :class:`LedgerReader` (the callout's reader) checks
them on every call and re-reads a row whose file changed (every write replaces the file, so a
grant or a revoke always changes its inode), keeping only the parse of unchanged rows.

Rows are written atomically 0600 in folders 0700. A principal may hold one kind of row only:
writing the other kind is refused until the first is revoked (a principal found in both
folders is a broken ledger, which :func:`cotal_trio.core.ledger.authorize_connect` denies).

Blocking file I/O: call from synchronous code or through ``trio.to_thread.run_sync``.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

from cotal_trio.core.errors import CodecError, ConfigError
from cotal_trio.core.identity import check_actor, check_owner, is_actor, is_owner
from cotal_trio.core.ledger import LedgerKind, LedgerRow, ReadRows, RowLookup, parse_row, render_row

from .files import TEMP_SUFFIX, atomic_write, ensure_dir, remove_quietly
from .layout import SpacePaths

__all__ = [
    "LedgerReader",
    "kind_dir",
    "list_rows",
    "read_principal",
    "remove_row",
    "row_lookup",
    "row_path",
    "write_row",
]

ROW_SUFFIX = ".json"


def kind_dir(space_paths: SpacePaths, kind: LedgerKind) -> Path:
    """The folder holding rows of ``kind``."""
    return space_paths.actors_dir if kind is LedgerKind.INTERACTIVE else space_paths.managed_dir


def row_path(space_paths: SpacePaths, kind: LedgerKind, owner: str, actor: str) -> Path:
    """``<kind dir>/<owner>.<actor>.json``.

    Raises:
        Refused: BAD_REQUEST when ``owner`` is not a derived owner or ``actor`` not an actor
            name (so no name can escape the folder).
    """
    check_owner(owner)
    check_actor(actor)
    return kind_dir(space_paths, kind) / f"{owner}.{actor}{ROW_SUFFIX}"


def _read(space_paths: SpacePaths, kind: LedgerKind, owner: str, actor: str) -> LedgerRow | None:
    try:
        data = row_path(space_paths, kind, owner, actor).read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise CodecError(f"ledger row {owner}.{actor} is unreadable ({exc.strerror})") from exc
    return parse_row(data, kind=kind, owner=owner, actor=actor)


def read_principal(
    space_paths: SpacePaths, owner: str, actor: str
) -> tuple[LedgerRow | None, LedgerRow | None]:
    """Read the principal's rows fresh: ``(interactive row or None, managed row or None)``.

    Raises:
        CodecError: a row exists but is unreadable or corrupt (the sentence names the row and
            the fix); never skipped.
        Refused: BAD_REQUEST for a malformed owner or actor.
    """
    return (
        _read(space_paths, LedgerKind.INTERACTIVE, owner, actor),
        _read(space_paths, LedgerKind.MANAGED, owner, actor),
    )


def row_lookup(read_rows: ReadRows) -> RowLookup:
    """The envelope walk's lookup over ``read_rows``: the managed row if any, else the interactive.

    Args:
        read_rows: ``(owner, actor) -> (interactive row, managed row)``, e.g.
            ``functools.partial(read_principal, space_paths)`` or a :class:`LedgerReader`.

    Returns:
        ``lookup(owner, actor) -> LedgerRow | None``, reading through ``read_rows`` on every
        call (same errors as ``read_rows``).
    """

    def lookup(owner: str, actor: str) -> LedgerRow | None:
        interactive, managed = read_rows(owner, actor)
        return managed if managed is not None else interactive

    return lookup


class LedgerReader:
    """The principal's rows, checked against the files on every call (the callout's reader).

    Each call runs ``stat`` on both row files. A file that is gone is no row; a file whose
    device, inode, change time, modification time or size changed is read and parsed again; an unchanged file returns the
    row parsed before. Writes go through a rename (:func:`write_row`), so every grant, re-grant
    or revoke is seen on the very next call. At most ``capacity`` parsed rows are kept.

    Blocking (a ``stat`` per row kind; a read on change): microseconds on a local disk. Safe to
    call from several threads at once (the callout reads in worker threads): the memo is
    guarded by a lock, the files are read outside it.

    It also remembers what the last call for each principal returned (:meth:`recall`, no I/O),
    for a caller that can check that answer again with a real read before relying on it.
    """

    def __init__(self, space_paths: SpacePaths, *, capacity: int = 4096) -> None:
        self._space_paths = space_paths
        self._capacity = capacity
        # Keyed by the path's string: the callout stats both row files on every connect, and a
        # memoized str with os.stat skips row_path's name checks and pathlib's hashing each time.
        self._rows: dict[str, tuple[tuple[int, ...], LedgerRow]] = {}
        self._paths: dict[tuple[LedgerKind, str, str], str] = {}
        self._last: dict[tuple[str, str], tuple[LedgerRow | None, LedgerRow | None]] = {}
        self._lock = threading.Lock()

    def __call__(self, owner: str, actor: str) -> tuple[LedgerRow | None, LedgerRow | None]:
        """As :func:`read_principal`; same errors."""
        principal = (owner, actor)
        try:
            rows = (self._row(LedgerKind.INTERACTIVE, owner, actor), self._row(LedgerKind.MANAGED, owner, actor))
        except BaseException:
            with self._lock:
                self._last.pop(principal, None)  # nothing to recall but what a read can confirm
            raise
        with self._lock:
            if principal not in self._last and len(self._last) >= self._capacity:
                self._last.pop(next(iter(self._last)))
            self._last[principal] = rows
        return rows

    def unchanged(self, owner: str, actor: str) -> tuple[LedgerRow | None, LedgerRow | None] | None:
        """What a call would return, when that needs no read: each row file is gone, or unchanged
        since it was parsed (the ``stat`` check of a call). None when a file must be read (new
        or changed: a call reads it). Blocking only for the two ``stat`` calls, never a read, so
        the callout runs it on its own thread and reads in a worker thread only when it says
        None (issue 14 item 4); a FIFO or a file being replaced is never opened here.
        """
        rows = []
        for kind in (LedgerKind.INTERACTIVE, LedgerKind.MANAGED):
            path = self._path(kind, owner, actor)
            try:
                st = os.stat(path)
            except FileNotFoundError:
                rows.append(None)
                continue
            except OSError:
                return None  # a call raises the CodecError naming it
            cached = self._rows.get(path)
            if cached is None or cached[0] != (st.st_dev, st.st_ino, st.st_ctime_ns, st.st_mtime_ns, st.st_size):
                return None
            rows.append(cached[1])
        found = (rows[0], rows[1])
        with self._lock:
            if (owner, actor) in self._last:
                self._last[(owner, actor)] = found
        return found

    def recall(self, owner: str, actor: str) -> tuple[LedgerRow | None, LedgerRow | None] | None:
        """Sync, no I/O: what the last call for ``(owner, actor)`` returned, or None if there was
        none (or it was forgotten: at most ``capacity`` principals are remembered).

        It may be stale by any amount: a grant, re-grant or revoke since is not seen. The
        callout uses it only to skip its first read, and decides on a real read after the
        issuance row (:class:`~cotal_trio.lane.callout.responder.CalloutResponder`).
        """
        return self._last.get((owner, actor))

    def _path(self, kind: LedgerKind, owner: str, actor: str) -> str:
        """:func:`row_path` as a string, memoized (at most ``2 * capacity``); same Refused."""
        key = (kind, owner, actor)
        path = self._paths.get(key)
        if path is None:
            path = os.fspath(row_path(self._space_paths, kind, owner, actor))
            with self._lock:
                if len(self._paths) >= 2 * self._capacity:
                    self._paths.pop(next(iter(self._paths)), None)
                self._paths[key] = path
        return path

    def _row(self, kind: LedgerKind, owner: str, actor: str) -> LedgerRow | None:
        path = self._path(kind, owner, actor)
        try:
            st = os.stat(path)
        except FileNotFoundError:
            with self._lock:
                self._rows.pop(path, None)
            return None
        except OSError as exc:
            raise CodecError(f"ledger row {owner}.{actor} is unreadable ({exc.strerror})") from exc
        # ctime cannot be set back by utime (a restore with `cp -p` or `touch -r`), and changes
        # on every write and rename: with the inode, a changed row never matches.
        stamp = (st.st_dev, st.st_ino, st.st_ctime_ns, st.st_mtime_ns, st.st_size)
        cached = self._rows.get(path)
        if cached is not None and cached[0] == stamp:
            return cached[1]
        row = _read(self._space_paths, kind, owner, actor)
        if row is not None:
            with self._lock:
                if path not in self._rows and len(self._rows) >= self._capacity:
                    self._rows.pop(next(iter(self._rows)))
                self._rows[path] = (stamp, row)
        return row


def _other(kind: LedgerKind) -> LedgerKind:
    return LedgerKind.MANAGED if kind is LedgerKind.INTERACTIVE else LedgerKind.INTERACTIVE


def write_row(space_paths: SpacePaths, row: LedgerRow) -> Path:
    """Write ``row`` atomically (0600) into its kind's folder; replaces a row of the same kind.

    Returns:
        The row's path.

    Raises:
        ConfigError: the principal already holds a row of the other kind (revoke it first).
    """
    other = row_path(space_paths, _other(row.kind), row.owner, row.actor)
    if other.exists():
        raise ConfigError(
            f"principal {row.principal} is already granted as {_other(row.kind).value} "
            "- revoke it first"
        )
    path = row_path(space_paths, row.kind, row.owner, row.actor)
    ensure_dir(path.parent)
    atomic_write(path, render_row(row))
    return path


def remove_row(space_paths: SpacePaths, owner: str, actor: str) -> bool:
    """Remove the principal's rows of both kinds; True when at least one existed."""
    removed = [
        remove_quietly(row_path(space_paths, kind, owner, actor)) for kind in LedgerKind
    ]
    return any(removed)


def _principal_of(name: str) -> tuple[str, str] | None:
    """``(owner, actor)`` from a row file name, or None when the name is not a row's."""
    stem = name.removesuffix(ROW_SUFFIX)
    owner, _, actor = stem.partition(".")
    return (owner, actor) if is_owner(owner) and is_actor(actor) else None


def _scan(folder: Path, kind: LedgerKind) -> tuple[list[LedgerRow], list[tuple[Path, str]]]:
    rows: list[LedgerRow] = []
    bad: list[tuple[Path, str]] = []
    try:
        entries = sorted(folder.iterdir())
    except FileNotFoundError:
        return rows, bad
    for path in entries:
        if path.name.startswith(".") and path.name.endswith(TEMP_SUFFIX):
            continue  # another writer's file in flight (files.atomic_write)
        principal = _principal_of(path.name) if path.name.endswith(ROW_SUFFIX) else None
        if principal is None:
            bad.append((path, "the file name is not <owner>.<actor>.json"))
            continue
        try:
            rows.append(parse_row(path.read_bytes(), kind=kind, owner=principal[0], actor=principal[1]))
        except CodecError as exc:
            bad.append((path, str(exc)))
        except OSError as exc:
            bad.append((path, f"unreadable ({exc.strerror})"))
    return rows, bad


def list_rows(space_paths: SpacePaths) -> tuple[list[LedgerRow], list[tuple[Path, str]]]:
    """Every row of the space, and every file that is not a valid row.

    Returns:
        ``(rows, corrupt)``: rows sorted by (kind: interactive first, owner, actor); corrupt
        as ``(path, reason)`` sorted by path. A principal present in both folders appears
        twice in ``rows`` (the caller reports the broken ledger).
    """
    rows: list[LedgerRow] = []
    bad: list[tuple[Path, str]] = []
    for kind in (LedgerKind.INTERACTIVE, LedgerKind.MANAGED):
        found, broken = _scan(kind_dir(space_paths, kind), kind)
        rows.extend(found)
        bad.extend(broken)
    order = {LedgerKind.INTERACTIVE: 0, LedgerKind.MANAGED: 1}
    rows.sort(key=lambda row: (order[row.kind], row.owner, row.actor))
    bad.sort(key=lambda item: item[0])
    return rows, bad
