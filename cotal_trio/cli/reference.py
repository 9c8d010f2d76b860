"""The CLI reference, generated from the cyclopts app (issue 7 item 5).

``python -m cotal_trio.cli.reference > docs/cli.md`` rewrites ``docs/cli.md``; the test
``tests/test_docs.py`` fails, naming that command, when the file and the app differ. The text is
cyclopts' own Markdown rendering of :data:`cotal_trio.cli.app` (every command, its help and its
parameters), under one line saying where it comes from, then the exit-status table every command
shares, rendered from :data:`cotal_trio.cli.exits.EXIT_TABLE` (issue 18 item 7).
"""

from __future__ import annotations

import sys

__all__ = ["REGENERATE", "exit_table", "render"]

REGENERATE = "python -m cotal_trio.cli.reference > docs/cli.md"
_HEADER = f"<!-- Generated from the cyclopts app by `{REGENERATE}`; do not edit by hand. -->\n\n"


def render() -> str:
    """The reference as Markdown (str): deterministic for one version of the app, whatever the
    terminal width."""
    from . import app  # the whole app, every lazily registered group included

    # cyclopts names a sub-app without a usage of its own after the running program (sys.argv[0],
    # or "python -m <module>"); the reference shows the console script's name whoever renders it.
    program, sys.argv[0] = sys.argv[0], "cotal"
    try:
        text = app.generate_docs(output_format="markdown", usage_name="cotal")
    finally:
        sys.argv[0] = program
    return _HEADER + text.rstrip("\n") + "\n\n" + exit_table()


def exit_table() -> str:
    """The ``## Exit status`` section: one Markdown row per :class:`~cotal_trio.cli.exits.ExitCode`."""
    from .exits import EXIT_TABLE

    rows = [
        "## Exit status",
        "",
        "Every command ends with one of these statuses (`cotal_trio/cli/exits.py`). A usage error (64)"
        " is never the retry-later 2, so a script can tell a wrong command line from a wait.",
        "",
        "| status | name | commands | meaning |",
        "|---|---|---|---|",
    ]
    for row in EXIT_TABLE:
        who = ", ".join(f"`{command}`" for command in row.commands) or "every command"
        rows.append(f"| {int(row.code)} | `{row.code.name}` | {who} | {row.meaning} |")
    return "\n".join(rows) + "\n"


if __name__ == "__main__":
    sys.stdout.write(render())
