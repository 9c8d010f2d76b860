"""Reading a lane host's ``<manifest>.applied`` back, with its writer checked (issue 15 item 11).

The host rewrites ``.applied`` on every change and lists no lane once it stops cleanly
(service/host.py), but a host killed by SIGKILL leaves its last file behind, still saying
``serving``. The file records its writer's pid (core/manifest.py): :func:`read_applied` checks
that process is alive and started before the file was written (its mtime,
:func:`~cotal_trio.state.liveness.pid_alive`), so every reader (``cotal status``, ``cotal space
remove``'s wait) tells a live host's file from a dead one's the same way.

While the host refuses its manifest (a typo in ``spaces.json``), its lanes keep serving and the
file names the refusal beside them (DESIGN.md 9): :attr:`AppliedFile.refused` is that sentence
while its writer runs, and :func:`refusal_line` the one line every read-only command prints for
it (issue 18 item 4).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..core.errors import ConfigError
from ..core.manifest import AppliedReport, host_gone, parse_applied
from .liveness import pid_alive

__all__ = ["AppliedFile", "applied_path", "read_applied", "refusal_line"]


@dataclass(frozen=True, slots=True, kw_only=True)
class AppliedFile:
    """A ``.applied`` file and whether the host that wrote it still runs.

    Attributes:
        report: the file's content.
        alive: True while the writing host runs, False once it is gone; None for a file that
            names no writer (written before hosts recorded their pid): unknown.
    """

    report: AppliedReport
    alive: bool | None

    @property
    def gone(self) -> str | None:
        """``"no host running (the last host, pid N, is gone)"`` once the writer is gone, else None."""
        return host_gone(self.report.pid) if self.alive is False and self.report.pid is not None else None

    @property
    def refused(self) -> str | None:
        """The host's refusal of its manifest (one sentence per problem, each naming its fix)
        while the writer runs or names none; None once a manifest was applied after it, or
        when the writer is gone (nothing follows the manifest then)."""
        return self.report.refused if self.alive is not False else None


def refusal_line(manifest: Path | str, sentence: str, *, serving: bool = True) -> str:
    """``manifest <manifest> refused, the current lanes keep serving: <sentence>``, the host's
    own log line (service/host.py); with ``serving`` False (no lane serves) ``..., nothing
    serves: <sentence>``. ``manifest`` is its path, or words naming it when the path is unknown."""
    keeps = "the current lanes keep serving" if serving else "nothing serves"
    return f"manifest {manifest} refused, {keeps}: {sentence}"


def applied_path(manifest: Path) -> Path:
    """``<manifest>.applied``, beside the manifest's path as given."""
    return manifest.with_name(manifest.name + ".applied")


def read_applied(path: Path) -> AppliedFile | None:
    """The ``.applied`` file at ``path`` with its writer checked; None when there is none (blocking).

    Raises:
        ConfigError: the file cannot be read or is not the ``.applied`` shape (names the file
            and the fix).
    """
    try:
        data, written = path.read_bytes(), path.stat().st_mtime
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise ConfigError(f"{path} cannot be read ({exc.strerror or exc}) - check that it is a readable file") from None
    report = parse_applied(data, path=str(path))
    alive = None if report.pid is None else pid_alive(report.pid, since=written)
    return AppliedFile(report=report, alive=alive)
