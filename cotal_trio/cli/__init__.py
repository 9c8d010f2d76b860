"""The ``cotal`` command line: a thin cyclopts skin (STYLE.md practice 25).

Each command group lives in its own module and is registered lazily, so ``cotal actor list``
never imports the HTTP stack. Commands parse flags, build a config and call the library; every
:class:`~cotal_trio.core.errors.ConfigError` or
:class:`~cotal_trio.core.errors.Unavailable` becomes one sentence on stderr and exit 1. The exit
statuses are :class:`~cotal_trio.cli.exits.ExitCode` (docs/cli.md renders their table): a usage
error is 64, and a closed stdout (``| head -1``) ends any command quietly with 141.
"""

from __future__ import annotations

import contextlib
import functools
import os
import select
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from .. import __version__
from ..core.errors import ConfigError, Refused, Unavailable, leaves
from .exits import ExitCode

if TYPE_CHECKING:
    import cyclopts

__all__ = ["INTERRUPTED", "app", "main"]

# The exit code of a Ctrl-C that ended a command (128 + SIGINT, as a shell reports it).
INTERRUPTED = ExitCode.INTERRUPTED

# (import path, command name or None for the function's own, help): registered lazily.
_COMMANDS: tuple[tuple[str, str | None, str], ...] = (
    ("cotal_trio.cli.up:up", None, "Run the root's broker and the space's auth service (the embedded default)."),
    ("cotal_trio.cli.actor:actor_app", "actor", "Grant, revoke and list actors in the space's ledger."),
    ("cotal_trio.cli.devidp:dev_idp_app", "dev-idp", "The development IdP: mint a token (development only)."),
    ("cotal_trio.cli.login:login", None, "Log in as a person at the space's pinned IdP (device code) and keep the session."),
    ("cotal_trio.cli.login:logout", None, "Revoke your login session for the space at its IdP and delete it."),
    ("cotal_trio.cli.client:exchange", None, "Exchange an IdP token (or your login session's) for a bearer."),
    ("cotal_trio.cli.client:agent_bearer", "agent-bearer", "Exchange a managed agent's actor token for a bearer."),
    ("cotal_trio.cli.client:connect_info", "connect-info", "What a client needs to connect: server, sentinel creds, IdP pin."),
    ("cotal_trio.cli.auth_service:auth_service", "auth-service", "Deprecated entry, kept for existing units and scripts (new setups: `cotal service install auth-service|callout-replica`): serve one space (--space) or a manifest of spaces (--spaces) against a running broker."),
    ("cotal_trio.cli.space:space_app", "space", "Add, remove and list the spaces of a root (live on its broker)."),
    ("cotal_trio.cli.manager:manager_app", "manager", "Register, list and retire the manager instances of a space."),
    ("cotal_trio.cli.check:check", None, "Run the whole path against the running root and name any failing step."),
    ("cotal_trio.cli.status:status", None, "One line per space of the running root: state, pid, exchange URL, callout counts."),
    ("cotal_trio.cli.watch:watch", None, "Live view of the root's spaces from their event streams (--json: the raw events)."),
    ("cotal_trio.cli.auth:auth_app", "auth", "Mint and revoke the credentials of a static space."),
    ("cotal_trio.cli.doctor:doctor_app", "doctor", "Check the root and name the next command to run."),
    ("cotal_trio.cli.broker:broker_app", "broker", "Render a cluster node's nats-server config from the root's trust."),
    ("cotal_trio.cli.service:service_app", "service", "The service presets auth-service and callout-replica: write their systemd units, or run them."),
)


@functools.cache
def _app() -> cyclopts.App:
    """The cyclopts app, built at first use: cyclopts is imported inside :func:`main`, where a
    Ctrl-C during its import is caught (issue 15 item 9)."""
    import cyclopts

    cli = cyclopts.App(
        name="cotal",
        help="Auth service for NATS agent meshes: the auth callout, the token exchange, and the root.",
        version=__version__,
        backend="trio",
    )
    for path, name, help_ in _COMMANDS:
        cli.command(path, help=help_, **({"name": name} if name else {}))
    return cli


def __getattr__(name: str) -> Any:
    """PEP 562: :data:`app`, the cyclopts app (for the reference page and the docs test)."""
    if name == "app":
        return _app()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def configure_logging() -> None:
    """Log lines go to stderr one line each (the callout line carries its own ``level=``): a
    message's unprintable characters, a client's newline among them, are written as escapes
    (cli/log_lines.py), so no client writes a line into the operator's log through a message
    (a traceback's exception text is written as Python formats it).

    The callout logs one line per connect, so the record attributes no line uses (caller,
    thread, process) are not collected: the logging documentation's "Optimization" switches.
    """
    import logging  # here, not at the top: inside main's Ctrl-C guard (issue 15 item 9)

    from cotal_trio.cli.log_lines import OneLineFormatter

    logging._srcfile = None  # type: ignore[attr-defined]  # documented: skip findCaller
    logging.logThreads = False
    logging.logProcesses = False
    logging.logMultiprocessing = False
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(OneLineFormatter("%(message)s"))
    root = logging.getLogger("cotal")
    root.handlers[:] = [handler]
    root.setLevel(logging.INFO)


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``cotal`` console script; returns the process exit code (cli/exits.py).

    A :class:`ConfigError`, :class:`Unavailable`, :class:`Refused` or ``OSError`` is one
    ``cotal: <sentence>`` line on stderr and exit 1; a usage error is 64 (cyclopts printed its
    panel); a closed stdout ends quietly with 141; a Ctrl-C that reaches here (before a serving
    command has its own signal handling, :func:`~cotal_trio.cli.common.serve_until_signal`) is
    exit 130 with nothing printed.
    """
    try:
        configure_logging()
        from cyclopts.exceptions import CycloptsError  # inside the Ctrl-C guard, as the app is

        try:
            with _interrupts_noted() as interrupted:
                bare = _bare_group(_app(), argv)  # imports the command's module: most of the start
            if interrupted():
                return ExitCode.INTERRUPTED
            if bare:
                _app().help_print(argv, console=_app().error_console)
                return ExitCode.USAGE
            result = _app()(argv, result_action="return_value", exit_on_error=False, console=_pipe_console())
            sys.stdout.flush()  # a reader that left shows here, not in the interpreter's last flush
        except CycloptsError:  # cyclopts printed its panel naming the bad flag or command
            return ExitCode.USAGE
    except KeyboardInterrupt:
        # Ctrl-C before a serving command holds its signals (the imports, the flag parsing):
        # nothing has started, so end quietly as a shell expects (issue 15 item 9).
        return ExitCode.INTERRUPTED
    except RuntimeError as exc:
        # Python wraps a Ctrl-C that lands inside a class body's __set_name__ (a dataclass being
        # imported) in "Error calling __set_name__": still a Ctrl-C (the fresh-user check hit it).
        if _interrupted(exc):
            return ExitCode.INTERRUPTED
        raise
    except _EXPECTED as exc:
        if _reader_gone(exc):
            return _end_quietly()
        print(f"cotal: {_sentence(exc)}", file=sys.stderr)
        return 1
    except BaseExceptionGroup as group:
        if group.subgroup(KeyboardInterrupt) is not None:
            return INTERRUPTED
        if _reader_gone(group):
            return _end_quietly()
        ours, rest = group.split(_EXPECTED)
        if ours is None or rest is not None:
            raise
        for sentence in dict.fromkeys(_sentence(exc) for exc in leaves(ours)):
            print(f"cotal: {sentence}", file=sys.stderr)
        return 1
    return result if isinstance(result, int) else 0


@contextlib.contextmanager
def _interrupts_noted() -> Iterator[Callable[[], bool]]:
    """Inside: a SIGINT is noted, not raised; yields whether one came (for the command's imports).

    A KeyboardInterrupt raised inside the import system can land in one of its weakref callbacks
    (``_get_module_lock``), where Python prints "Exception ignored" and drops it: the Ctrl-C is
    lost and ``cotal up`` goes on to serve (seen under load, tests/cli/test_up_interrupt.py). So
    while the command's module is imported the signal only sets a flag, and the caller ends with
    130 once the imports are done. The previous handler is back on the way out, so trio installs
    its own as it starts and a serving command's signal receiver takes over from there.
    """
    seen: list[int] = []
    if threading.current_thread() is not threading.main_thread():  # only it may set handlers (a test's thread)
        yield lambda: False
        return
    previous = signal.signal(signal.SIGINT, lambda signum, _frame: seen.append(signum))
    try:
        yield lambda: bool(seen)
    finally:
        signal.signal(signal.SIGINT, previous)


def _bare_group(cli: Any, argv: list[str] | None) -> bool:
    """Whether ``argv`` names a command group and stops there (``cotal doctor``, ``cotal service
    run``): a usage error, its usage on stderr and exit 64, where cyclopts would print the help on
    stdout and exit 0, which a script reads as "checked, all well". ``cotal`` alone (no group
    named) keeps its help and 0; an extra token (a flag, an unknown name) is cyclopts' to refuse.
    """
    chain, apps, unused = cli.parse_commands(argv)
    return bool(chain) and not unused and apps[-1].default_command is None


# Errors that are the operator's or a dependency's to fix: one sentence, exit 1, no traceback.
_EXPECTED = (ConfigError, Unavailable, Refused, OSError)


def _interrupted(exc: BaseException) -> bool:
    """Whether a KeyboardInterrupt caused ``exc`` (its ``__cause__``/``__context__`` chain)."""
    seen: set[int] = set()
    link: BaseException | None = exc
    while link is not None and id(link) not in seen:
        if isinstance(link, KeyboardInterrupt):
            return True
        seen.add(id(link))
        link = link.__cause__ or link.__context__
    return False


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


def _pipe_console() -> Any:
    """cyclopts' help and version console; a closed pipe ends it as it ends every command (rich's
    own answer to one is ``SystemExit(1)``). Built at first use: rich comes with cyclopts, inside
    :func:`main`'s Ctrl-C guard."""
    import rich.console

    class PipeConsole(rich.console.Console):
        def on_broken_pipe(self) -> None:
            raise BrokenPipeError("stdout's reader went away")

    return PipeConsole()


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
    from ..state.files import FULL_DISK_ERRNOS  # here, not at the top: main's imports stay lean

    if isinstance(exc, OSError) and not isinstance(exc, ConnectionError):
        where = f" ({exc.filename})" if exc.filename else ""
        if exc.errno in FULL_DISK_ERRNOS:  # the fix is space, not permissions
            return f"{exc.strerror or exc}{where} - free space on that file system, then try again"
        return f"{exc.strerror or exc}{where} - check that path and its permissions"
    return str(exc)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
