"""The ``cotal`` command line: a thin cyclopts skin (STYLE.md practice 25).

Each command group lives in its own module and is registered lazily, so ``cotal actor list``
never imports the HTTP stack. Commands parse flags, build a config and call the library; every
:class:`~cotal_trio.core.errors.ConfigError` or
:class:`~cotal_trio.core.errors.Unavailable` becomes one sentence on stderr and exit 1. The exit
statuses are :class:`~cotal_trio.cli.exits.ExitCode` (docs/cli.md renders their table): a usage
error is 64, and a closed stdout (``| head -1``) ends any command quietly with 141.
"""

from __future__ import annotations

import logging
import os
import select
import sys

import cyclopts
import rich.console
from cyclopts.exceptions import CycloptsError

from .. import __version__
from ..core.errors import ConfigError, Refused, Unavailable, leaves
from .exits import ExitCode

__all__ = ["app", "main"]

app = cyclopts.App(
    name="cotal",
    help="Auth service for NATS agent meshes: the auth callout, the token exchange, and the root.",
    version=__version__,
    backend="trio",
)
app.command("cotal_trio.cli.up:up", help="Run the root's broker and the space's auth service (the embedded default).")
app.command("cotal_trio.cli.actor:actor_app", name="actor", help="Grant, revoke and list actors in the space's ledger.")
app.command("cotal_trio.cli.devidp:dev_idp_app", name="dev-idp", help="The development IdP: mint a token (development only).")
app.command("cotal_trio.cli.client:exchange", help="Exchange an IdP token for a bearer.")
app.command("cotal_trio.cli.client:agent_bearer", name="agent-bearer", help="Exchange a managed agent's actor token for a bearer.")
app.command("cotal_trio.cli.client:connect_info", name="connect-info", help="What a client needs to connect: server, sentinel creds, IdP pin.")
app.command("cotal_trio.cli.auth_service:auth_service", name="auth-service", help="Serve one space (--space) or a manifest of spaces (--spaces) against a running broker.")
app.command("cotal_trio.cli.space:space_app", name="space", help="Add, remove and list the spaces of a root (live on its broker).")
app.command("cotal_trio.cli.manager:manager_app", name="manager", help="Register, list and retire the manager instances of a space.")
app.command("cotal_trio.cli.check:check", help="Run the whole path against the running root and name any failing step.")
app.command("cotal_trio.cli.status:status", help="One line per space of the running root: state, pid, exchange URL, callout counts.")
app.command("cotal_trio.cli.watch:watch", help="Live view of the root's spaces from their event streams (--json: the raw events).")
app.command("cotal_trio.cli.auth:auth_app", name="auth", help="Mint and revoke the credentials of a static space.")
app.command("cotal_trio.cli.doctor:doctor_app", name="doctor", help="Check the root and name the next command to run.")
app.command("cotal_trio.cli.broker:broker_app", name="broker", help="Render a cluster node's nats-server config from the root's trust.")
app.command("cotal_trio.cli.service:service_app", name="service", help="Write systemd units for `cotal auth-service` and its callout replicas.")


def configure_logging() -> None:
    """Log lines go to stderr as written (the callout line carries its own ``level=``).

    The callout logs one line per connect, so the record attributes no line uses (caller,
    thread, process) are not collected: the logging documentation's "Optimization" switches.
    """
    logging._srcfile = None  # type: ignore[attr-defined]  # documented: skip findCaller
    logging.logThreads = False
    logging.logProcesses = False
    logging.logMultiprocessing = False
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(message)s"))
    root = logging.getLogger("cotal")
    root.handlers[:] = [handler]
    root.setLevel(logging.INFO)


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``cotal`` console script; returns the process exit code (cli/exits.py)."""
    configure_logging()
    try:
        result = app(argv, result_action="return_value", exit_on_error=False, console=_PipeConsole())
        sys.stdout.flush()  # a reader that left shows here, not in the interpreter's last flush
    except CycloptsError:  # cyclopts printed its panel naming the bad flag or command
        return ExitCode.USAGE
    except _EXPECTED as exc:
        if _reader_gone(exc):
            return _end_quietly()
        print(f"cotal: {_sentence(exc)}", file=sys.stderr)
        return 1
    except BaseExceptionGroup as group:
        if _reader_gone(group):
            return _end_quietly()
        ours, rest = group.split(_EXPECTED)
        if ours is None or rest is not None:
            raise
        for sentence in dict.fromkeys(_sentence(exc) for exc in leaves(ours)):
            print(f"cotal: {sentence}", file=sys.stderr)
        return 1
    return result if isinstance(result, int) else 0


# Errors that are the operator's or a dependency's to fix: one sentence, exit 1, no traceback.
_EXPECTED = (ConfigError, Unavailable, Refused, OSError)


def _reader_gone(exc: BaseException) -> bool:
    """Whether ``exc`` is (or, in a group, holds) a BrokenPipeError and stdout's reader is gone.

    A broken socket (the auth service went away mid-request) raises the same error; only a
    stdout pipe that polls as broken (POLLERR: its read end is closed) ends quietly.
    """
    if not any(isinstance(leaf, BrokenPipeError) for leaf in leaves(exc)):
        return False
    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
    except (OSError, ValueError):  # a stdout without a descriptor (captured in-process)
        return False
    return any(events & select.POLLERR for _, events in poller.poll(0))


class _PipeConsole(rich.console.Console):
    """cyclopts' help and version console; a closed pipe ends it as it ends every command (rich's
    own answer to one is ``SystemExit(1)``)."""

    def on_broken_pipe(self) -> None:
        raise BrokenPipeError("stdout's reader went away")


def _end_quietly() -> int:
    """End as ``| head -1`` expects: no traceback, no "Exception ignored" at exit, status 141.

    The unwritten output still sits in stdout's buffer; pointing the descriptor at /dev/null
    lets the interpreter's last flush succeed (Python's documented SIGPIPE recipe).
    """
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return ExitCode.CLOSED_PIPE


def _sentence(exc: BaseException) -> str:
    if isinstance(exc, OSError) and not isinstance(exc, ConnectionError):
        where = f" ({exc.filename})" if exc.filename else ""
        return f"{exc.strerror or exc}{where} - check that path and its permissions"
    return str(exc)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
