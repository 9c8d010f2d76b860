"""One ``cotal up`` per root, one lane host per manifest: advisory locks held for the life of the process.

A second ``cotal up`` on a running root would rewrite its policy and broker config, start a
second nats-server on the same resolver and JetStream folders, and remove the first one's
readiness file on exit. The lock file ``<root>/up.lock`` (0600) holds the holder's pid; the
kernel drops the lock when the process ends, however it ends, so a crash never leaves it stale.

Likewise a lane host holds ``<manifest>.applied.lock`` (:func:`hold_manifest`): two hosts on one
manifest would each rewrite its ``.applied`` with their own lanes' states.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from cotal_trio.core.errors import ConfigError

from .applied import applied_path
from .files import ensure_dir

__all__ = ["hold_manifest", "hold_root", "lock_file", "manifest_lock"]

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
    refusal = "root {root} is already served by `cotal up` (pid {holder}) - stop it first, or pass another --root"
    with _hold(root / LOCK_NAME, lambda holder: refusal.format(root=root, holder=holder)):
        yield


def manifest_lock(manifest: Path) -> Path:
    """``<manifest>.applied.lock``: beside the ``.applied`` a host writes for ``manifest`` (the
    path it was given, a link or not; DESIGN.md 9)."""
    applied = applied_path(manifest)
    return applied.with_name(applied.name + ".lock")


@contextmanager
def hold_manifest(manifest: Path) -> Iterator[None]:
    """Hold :func:`manifest_lock` exclusively until the block ends: one lane host per manifest,
    as ``.applied`` is one host's account of it (blocking file I/O, instant; the kernel drops the
    lock when the process ends).

    Raises:
        ConfigError: another host holds it (the sentence names its pid and the fix), or the lock
            file cannot be created.
    """
    applied = applied_path(manifest)
    refusal = (
        "manifest {manifest} is already hosted by pid {holder}, which writes {applied} - run one host per"
        " manifest: stop that one, or give this host a manifest of its own (a callout replica host lists"
        " the same spaces in its own file)"
    )
    with _hold(manifest_lock(manifest), lambda holder: refusal.format(manifest=manifest, holder=holder, applied=applied)):
        yield


@contextmanager
def _hold(path: Path, refusal: Callable[[str], str]) -> Iterator[None]:
    """Hold ``path`` exclusively (``flock``) with this process's pid in it; ConfigError with
    ``refusal(<the holder's pid>)`` when another open of it holds it."""
    with lock_file(path) as fd:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "another process"
            raise ConfigError(refusal(holder)) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
