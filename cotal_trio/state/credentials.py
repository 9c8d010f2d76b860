"""The root's records of the static credentials it minted, one file per label (docs/static-credentials.md).

Layout (besides :mod:`cotal_trio.state.layout`)::

    <root>/spaces/<space>/credentials/          0700
        <label>.json                            0600, a LabelRecord (core/credentials.py)
        .lock                                   flock: one mint or revocation at a time
    <root>/auth/creds/<space>/<label>.creds     the default place of the minted file (0600)

A root written by an earlier version keeps minting into its ``auth/creds/space.<hex>/`` folder:
the files there were handed to agents by that path and each record holds it, so that folder is
never renamed (the space folders are: state/space_folders.py).

A record holds no secret (public keys, times, the file's path); the seed lives only in the
``.creds`` file. Writes are atomic (:func:`cotal_trio.state.files.atomic_write`). Blocking file
I/O: call from synchronous code or through ``trio.to_thread.run_sync``.
"""

from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from cotal_trio.core.credentials import LabelRecord
from cotal_trio.core.errors import CodecError, ConfigError
from cotal_trio.core.identity import is_actor

from .files import TEMP_SUFFIX, atomic_write, corrupt, ensure_dir, render_json
from .layout import RootPaths, SpacePaths, space_dir_name
from .lock import lock_file
from .space_folders import legacy_dir_name

__all__ = [
    "creds_dir",
    "default_creds_path",
    "hold_credentials",
    "list_records",
    "load_record",
    "record_path",
    "records_dir",
    "save_record",
    "write_creds",
]

RECORDS_DIR = "credentials"
LOCK_NAME = ".lock"


def records_dir(sp: SpacePaths) -> Path:
    """``<space folder>/credentials``."""
    return sp.dir / RECORDS_DIR


def record_path(sp: SpacePaths, label: str) -> Path:
    """``<space folder>/credentials/<label>.json`` (``label`` already checked)."""
    return records_dir(sp) / f"{label}.json"


def creds_dir(paths: RootPaths, space: str) -> Path:
    """``<root>/auth/creds/<space>``: where minted files go without ``--out`` (an earlier
    version's ``auth/creds/space.<hex>`` when it exists: module docstring)."""
    top = paths.root / "auth" / "creds"
    earlier = top / legacy_dir_name(space)
    return earlier if earlier.is_dir() else top / space_dir_name(space)


def default_creds_path(paths: RootPaths, space: str, label: str) -> Path:
    """``<creds_dir>/<label>.creds``."""
    return creds_dir(paths, space) / f"{label}.creds"


def _decode(path: Path, raw: bytes) -> LabelRecord:
    try:
        record = LabelRecord.from_json(json.loads(raw.decode("utf-8")))
    except (UnicodeDecodeError, ValueError) as exc:  # CodecError is a ValueError
        raise corrupt(path, str(exc)) from None
    if record.label != path.name.removesuffix(".json"):
        raise corrupt(path, f"it records label {record.label}")
    return record


def load_record(sp: SpacePaths, label: str) -> LabelRecord | None:
    """The label's record, or None when it has none.

    Raises:
        ConfigError: the file is unreadable or corrupt (it is left as it is).
    """
    path = record_path(sp, label)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise corrupt(path, f"unreadable: {exc.strerror}") from exc
    return _decode(path, raw)


def save_record(sp: SpacePaths, record: LabelRecord) -> Path:
    """Write the label's record atomically, 0600 (the folder 0700); returns its path."""
    if record.current.space != sp.space:
        raise ConfigError(f"a record of space {record.current.space} cannot be saved in space {sp.space}")
    path = record_path(sp, record.label)
    atomic_write(path, render_json(record.to_json()))
    return path


def list_records(sp: SpacePaths) -> tuple[list[LabelRecord], list[tuple[Path, str]]]:
    """Every record of the space, sorted by label, and the files that could not be read.

    Returns:
        ``(records, bad)``; ``bad`` holds ``(path, sentence)`` for each unreadable or corrupt file.
    """
    try:
        names = sorted(os.listdir(records_dir(sp)))
    except FileNotFoundError:
        return [], []
    records: list[LabelRecord] = []
    bad: list[tuple[Path, str]] = []
    for name in names:
        label = name.removesuffix(".json")
        if name.startswith(".") or name.endswith(TEMP_SUFFIX) or not name.endswith(".json"):
            continue
        path = records_dir(sp) / name
        try:
            if not is_actor(label):
                raise corrupt(path, "its name is not a label")
            record = load_record(sp, label)
        except (ConfigError, CodecError) as exc:
            bad.append((path, str(exc)))
            continue
        if record is not None:
            records.append(record)
    return records, bad


@contextmanager
def hold_credentials(sp: SpacePaths) -> Iterator[None]:
    """Hold the space's credential lock until the block ends (blocking: waits for another mint).

    Two mints of one label, or a mint and a revocation, then never interleave their read and
    write of the record and the account JWT.

    Raises:
        ConfigError: the lock file cannot be created.
    """
    with lock_file(ensure_dir(records_dir(sp)) / LOCK_NAME) as fd:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield


def write_creds(path: Path, text: str) -> None:
    """Write a ``.creds`` file atomically, 0600 (a missing parent folder is created 0700)."""
    atomic_write(path, text.encode())
