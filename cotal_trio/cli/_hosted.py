"""The hosted spaces a read-only command shows, a refused ``spaces.json`` included (issue 18 item 4).

``cotal status``, ``cotal space list`` and ``cotal watch`` read the root's manifest only to know
which spaces are hosted. While it cannot be read or is refused (a typo), the host keeps serving
the lanes of the last manifest it applied and records them, with the refusal, in
``<manifest>.applied`` (DESIGN.md 9; service/host.py). :func:`read_hosted` reads both, so each
command shows the lanes ``.applied`` lists plus one line with the refusal
(:meth:`Hosted.line`, the host's sentence, which names the fix) instead of stopping at the
broken file.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

from ..broker.spaces import hosted_entries
from ..core.errors import ConfigError
from ..core.manifest import LaneStatus
from ..state import RootPaths
from ..state.applied import AppliedFile, applied_path, read_applied, refusal_line

__all__ = ["Hosted", "read_hosted"]

_NO_LANES: Mapping[str, LaneStatus] = MappingProxyType({})


@dataclass(frozen=True, slots=True, kw_only=True)
class Hosted:
    """What the root's ``spaces.json`` and its host's ``.applied`` say is hosted.

    Attributes:
        manifest: the root's ``spaces.json``.
        listed: the spaces ``spaces.json`` lists; None when it cannot be read or is refused.
        problem: why it cannot be read or is refused (one sentence naming the file and the
            fix, :func:`~cotal_trio.broker.spaces.hosted_entries`'s), or None.
        applied: the host's ``.applied`` with its writer checked; None when there is none or
            it cannot be read (``applied_error`` then says why).
        applied_error: the error reading ``.applied``, or None.
    """

    manifest: Path
    listed: frozenset[str] | None
    problem: str | None
    applied: AppliedFile | None
    applied_error: ConfigError | None = None

    @property
    def lanes(self) -> Mapping[str, LaneStatus]:
        """The lanes ``.applied`` lists while its writer runs (or names none); none otherwise."""
        if self.applied is None or self.applied.alive is False:
            return _NO_LANES
        return self.applied.report.spaces

    @property
    def spaces(self) -> frozenset[str] | None:
        """The hosted spaces: those ``spaces.json`` lists, or while it is refused those
        ``.applied`` lists; None when it is refused and no lane serves (nothing to show)."""
        if self.listed is not None:
            return self.listed
        return frozenset(self.lanes) or None

    @property
    def refused(self) -> str | None:
        """The refusal's sentence: the running host's (``.applied``), else this reading's;
        None while the manifest is accepted."""
        host = None if self.applied is None else self.applied.refused
        return host or self.problem

    def line(self) -> str | None:
        """The one line saying the manifest is refused, or None while it is accepted.

        The host's refusal reads as the host logs it (``manifest <path> refused, the current
        lanes keep serving: <sentence>``); a file no running host has refused yet (it rereads
        within a second) reads as :attr:`problem`.
        """
        host = None if self.applied is None else self.applied.refused
        if host is not None:
            return refusal_line(self.manifest, host, serving=bool(self.lanes))
        return self.problem


def read_hosted(paths: RootPaths) -> Hosted:
    """The root's hosted spaces as :class:`Hosted` (blocking: two small files). Never raises
    for a broken ``spaces.json`` or ``.applied``: each is recorded as its sentence."""
    manifest = paths.spaces_manifest
    try:
        listed, problem = frozenset(entry.space for entry in hosted_entries(paths)), None
    except ConfigError as exc:
        listed, problem = None, str(exc)
    try:
        applied, applied_error = read_applied(applied_path(manifest)), None
    except ConfigError as exc:
        applied, applied_error = None, exc
    return Hosted(manifest=manifest, listed=listed, problem=problem, applied=applied, applied_error=applied_error)
