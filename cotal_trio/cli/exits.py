"""Every exit status of the ``cotal`` command line, one constant each (issue 18 item 7).

A script tells outcomes apart by the status alone: a usage error (fix the command line) is 64,
never 2, which means "a dependency says wait, run it again later" (spec "Connect limits": the
exchange's 429 ``RATE_LIMITED``). The entry point (:func:`cotal_trio.cli.main`) and the commands
return these constants, and ``docs/cli.md`` renders its exit-status table from
:data:`EXIT_TABLE` (:mod:`cotal_trio.cli.reference`), so the table is the code's own list.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum

__all__ = ["EXIT_TABLE", "ExitCode", "ExitMeaning"]


class ExitCode(IntEnum):
    """The exit statuses (ints 0-255) every ``cotal`` command may end with."""

    OK = 0
    FAILED = 1
    DEPENDENCY_UNAVAILABLE = 2
    USAGE = 64  # EX_USAGE of sysexits.h: the command line itself is wrong
    INTERRUPTED = 130  # 128 + SIGINT, what a shell reports for Ctrl-C
    CLOSED_PIPE = 141  # 128 + SIGPIPE, what a shell reports for a reader that went away


@dataclass(frozen=True, slots=True)
class ExitMeaning:
    """One row of the exit-status table.

    Attributes:
        code: the status.
        meaning: what it tells a script, and what to do about it.
        commands: the commands that end with it (``cotal exchange`` ...), or ``()`` for every
            command.
    """

    code: ExitCode
    meaning: str
    commands: tuple[str, ...] = ()


EXIT_TABLE: tuple[ExitMeaning, ...] = (
    ExitMeaning(ExitCode.OK, "Done: the command did what it says."),
    ExitMeaning(
        ExitCode.FAILED,
        "Refused or failed: one `cotal:` sentence on stderr names the cause and the fix (with --json, "
        "the error object on stdout). `cotal check`: a step failed; `cotal doctor auth`: a finding; "
        "`cotal status`: a space does not serve. An unexpected error (a traceback, a bug to report) is 1 too.",
    ),
    ExitMeaning(
        ExitCode.DEPENDENCY_UNAVAILABLE,
        "Retry later: the auth service answered 429 RATE_LIMITED (spec \"Connect limits\"); run it "
        "again after the seconds it names (`retry-after <n>`, or error.cause.retryAfterSeconds with --json).",
        ("cotal exchange", "cotal agent-bearer"),
    ),
    ExitMeaning(
        ExitCode.USAGE,
        "Usage error: an unknown command or flag, a missing or malformed value (a port outside 1-65535 too), a command group without its "
        "subcommand (`cotal doctor` alone prints its subcommands); the error panel on "
        "stderr names it; fix the command line, see --help.",
    ),
    ExitMeaning(ExitCode.INTERRUPTED, "Interrupted by Ctrl-C (SIGINT) before it finished."),
    ExitMeaning(
        ExitCode.CLOSED_PIPE,
        "Its output's reader went away (a pipe into `head -1` that closed): it stops writing and ends quietly, "
        "as a shell reports a command ended by SIGPIPE.",
    ),
)
