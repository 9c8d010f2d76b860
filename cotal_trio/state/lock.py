"""One ``cotal up`` per root: an advisory lock held for the life of the process.

A second ``cotal up`` on a running root would rewrite its policy and broker config, start a
second nats-server on the same resolver and JetStream folders, and remove the first one's
readiness file on exit. The lock file ``<root>/up.lock`` (0600) holds the holder's pid; the
kernel drops the lock when the process ends, however it ends, so a crash never leaves it stale.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from cotal_trio.core.errors import ConfigError

from .files import ensure_dir

__all__ = ["hold_root", "lock_file"]

LOCK_NAME = "up.lock"


@contextmanager
def lock_file(path: Path) -> Iterator[int]:
    """Open (or create, 0600) the lock file ``path`` and yield its descriptor; closed at the end
    (which drops any ``flock`` taken on it). The caller takes the lock it needs.

    Raises:
        ConfigError: the file cannot be created (the sentence names it).
    """
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    except OSError as exc:
        raise ConfigError(f"cannot create {path} ({exc.strerror}) - check the root's permissions") from exc
    try:
        yield fd
    finally:
        os.close(fd)


@contextmanager
def hold_root(root: Path) -> Iterator[None]:
    """Hold ``<root>/up.lock`` exclusively until the block ends (blocking file I/O, instant).

    Raises:
        ConfigError: another process holds the root (the sentence names its pid), or the lock
            file cannot be created.
    """
    ensure_dir(root)
    with lock_file(root / LOCK_NAME) as fd:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "another process"
            raise ConfigError(
                f"root {root} is already served by `cotal up` (pid {holder}) - stop it first, "
                "or pass another --root"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
