"""Options every command that works on a root shares: ``--root`` and ``--space``."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Annotated

from cyclopts import Parameter

from ..core.identity import check_space
from ..core.errors import ConfigError, Refused
from ..state import RootPaths, SpacePaths, resolve_root

__all__ = ["DEFAULT_SPACE", "Where"]

DEFAULT_SPACE = "default"


@Parameter(name="*")
@dataclass(frozen=True, kw_only=True)
class Where:
    """Which root and which space a command works on.

    Attributes:
        root: the state folder (default ``$COTAL_ROOT``, else ``./.cotal``).
        space: the space name.
    """

    root: Annotated[str | None, Parameter(help="State folder (default $COTAL_ROOT, else ./.cotal).")] = None
    space: Annotated[str, Parameter(help="Space name.")] = DEFAULT_SPACE

    def paths(self) -> RootPaths:
        """The root's paths (not created); ConfigError for an empty ``--root``."""
        if self.root is not None and not self.root.strip():
            raise ConfigError("--root is empty - pass a folder, or leave it out for ./.cotal")
        return RootPaths(resolve_root(self.root, os.environ))

    def space_paths(self) -> SpacePaths:
        """The space's paths; ConfigError for a bad space name."""
        try:
            check_space(self.space)
        except Refused as exc:
            raise ConfigError(f"--space: {exc.detail}") from None
        return self.paths().space(self.space)
