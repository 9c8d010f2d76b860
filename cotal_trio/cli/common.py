"""Options every command that works on a root shares: ``--root`` and ``--space``."""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Annotated

import trio
from cyclopts import Parameter

from ..core.admission import DEADLINE_MARGIN_S
from ..core.errors import ConfigError, Refused
from ..core.identity import check_space
from ..state import RootPaths, SpacePaths, resolve_root
from ..state.records import MAX_AUTH_TIMEOUT_S
from . import INTERRUPTED
from ..state.space_folders import require_space

__all__ = ["DEFAULT_SPACE", "PortRange", "PublicFaceFlags", "Where", "check_auth_timeout", "serve_until_signal", "stop_on_signal"]

DEFAULT_SPACE = "default"
_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


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

    def provisioned(self) -> SpacePaths:
        """The space's paths once the root holds it: every command working on an existing space
        finds it here, so a mistyped --root or --space reads the same from each (issue 18 item 3).

        Raises:
            ConfigError: a bad space name; no root at --root; or ``space S is not in the root R
                - see `cotal space list``` (:func:`cotal_trio.state.space_folders.require_space`).
        """
        self.space_paths()  # the name first: a bad name is named as such
        return require_space(self.paths(), self.space)


@dataclass(frozen=True, slots=True)
class PortRange:
    """The cyclopts validator of a port flag: 1 to 65535, and 0 too where ``free`` (0 makes the
    listener pick any free port). A value outside is a malformed value, so a usage error (exit
    64, cli/exits.py) before the command runs: cyclopts' panel names the flag and the value, the
    ``ValueError`` this raises the range and the fix.

    Attributes:
        free: whether 0 ("any free port") is accepted.
    """

    free: bool = False

    def __call__(self, _type: object, value: int | None) -> None:
        """Return for None (not given) or a port; ``ValueError`` for anything else."""
        if value is None or 1 <= value <= 65535 or (self.free and value == 0):
            return
        raise ValueError("A port is 1 to 65535 - pass one in that range" + (", or 0 for any free one." if self.free else "."))


@Parameter(name="*")
@dataclass(frozen=True, kw_only=True)
class PublicFaceFlags:
    """The public-face flags, declared once for ``cotal up``, ``cotal auth-service`` and ``cotal
    service install|render auth-service`` (issue 5 item 1; issue 16).

    Each is the :class:`~cotal_trio.core.manifest.SpaceEntry` field of the same name (its
    manifest key in :data:`cotal_trio.service.hosting.PUBLIC_FLAGS`), so
    :func:`cotal_trio.service.hosting.public_fields` reads them off this group as off the
    configs; the manifest's own rules check them (:func:`~cotal_trio.service.hosting.check_public_flags`).

    Attributes:
        exchange_public_port: the public listener's port on 127.0.0.1, or None for no public face.
        exchange_public_url: the ``https://`` address clients reach it by, or None.
        exchange_trusted_proxy: attribute peers by the last ``X-Forwarded-For`` hop.
        advertised_server: the broker URL the public face advertises (nats/tls/ws/wss), or None.
    """

    exchange_public_port: Annotated[int | None, Parameter(validator=PortRange(), help=(
        "Serve the space's public exchange face on 127.0.0.1:N too (put a TLS reverse proxy in front). cotal up "
        "records it in the space's spaces.json entry; cotal auth-service takes it with --space only (a manifest "
        "entry sets exchangePublicPort)."))] = None
    exchange_public_url: Annotated[str | None, Parameter(help=(
        "The https:// address clients reach the public face by (needs --exchange-public-port)."))] = None
    exchange_trusted_proxy: Annotated[bool, Parameter(help=(
        "Attribute public-face peers by the last X-Forwarded-For hop (needs --exchange-public-port)."))] = False
    advertised_server: Annotated[str | None, Parameter(help=(
        "The broker URL the public face advertises, nats/tls/ws/wss (needs --exchange-public-port; default: the "
        "first URL of --server, the broker the service connects to)."))] = None


def check_auth_timeout(seconds: float | None) -> float | None:
    """``--auth-timeout`` as given, or ConfigError when out of range (0.25 s, 600 s]."""
    if seconds is not None and not (DEADLINE_MARGIN_S < seconds <= MAX_AUTH_TIMEOUT_S):
        raise ConfigError(
            f"--auth-timeout {seconds} is out of range - pass seconds above {DEADLINE_MARGIN_S} "
            f"and at most {MAX_AUTH_TIMEOUT_S:g} (the broker's default is 2)"
        )
    return seconds


async def stop_on_signal(scope: trio.CancelScope, command: str) -> None:
    """Cancel ``scope`` at the first SIGINT or SIGTERM (start it before anything slow)."""
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async for signum in signals:
            print(f"{command}: {signal.Signals(signum).name} - stopping", file=sys.stderr, flush=True)
            scope.cancel()
            return


@asynccontextmanager
async def serve_until_signal(command: str) -> AsyncIterator[trio.Nursery]:
    """Trio: a nursery for a serving command, cancelled at the first SIGINT or SIGTERM.

    Enter it first thing in the command, before anything slow: the signal handlers are in place
    from that moment, so a Ctrl-C at any point of the start-up stops it in order (the lanes, then
    the broker) and never becomes a KeyboardInterrupt inside the start (issue 15 item 9). The
    handlers stay in place while the command stops: a second SIGINT or SIGTERM ends the process
    at once with exit code ``INTERRUPTED`` (130), and a broker ``cotal up`` started goes with it
    (its ``PR_SET_PDEATHSIG``, broker/process.py).

    Yields:
        The nursery; the command's work runs in it, and its scope is what the signal cancels.
    """
    with trio.open_signal_receiver(*_STOP_SIGNALS) as signals:
        async with trio.open_nursery() as outer:
            work = trio.CancelScope()
            outer.start_soon(_watch_signals, signals, work, command)
            with work:
                async with trio.open_nursery() as nursery:
                    yield nursery
            outer.cancel_scope.cancel()


async def _watch_signals(signals: AsyncIterator[int], work: trio.CancelScope, command: str) -> None:
    """Cancel ``work`` at the first signal; end the process at the second (it asked twice)."""
    async for signum in signals:
        name = signal.Signals(signum).name
        if not work.cancel_called:
            print(f"{command}: {name} - stopping", file=sys.stderr, flush=True)
            work.cancel()
            continue
        print(f"{command}: second {name} - exiting now", file=sys.stderr, flush=True)
        os._exit(INTERRUPTED)
