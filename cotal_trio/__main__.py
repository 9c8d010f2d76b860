"""``python -m cotal_trio`` and the ``cotal`` console script: the command line, imported inside
a Ctrl-C guard.

Importing :mod:`cotal_trio.cli` takes tens of milliseconds (dataclasses, enum, the errors); a
Ctrl-C during it used to end in a traceback through ``cotal_trio/cli/__init__.py``, before
:func:`cotal_trio.cli.main`'s own guard existed. Here it is exit 130 with nothing printed, as a
Ctrl-C anywhere else before a command starts (issue 15 item 9).
"""

import signal
import sys

# 128 + SIGINT: cotal_trio.cli.exits.ExitCode.INTERRUPTED, which is not imported yet here.
INTERRUPTED = 130


def main() -> int:
    """The ``cotal`` command line's exit code (:func:`cotal_trio.cli.main`), or 130 when a Ctrl-C
    lands while the command line is being imported."""
    # A shell starts a background job (`cotal up &`) with SIGINT ignored, and a serving command
    # honours SIGINT once it listens for it (cli/common.serve_until_signal): without this, a
    # Ctrl-C or `kill -INT` in the first tenths of a second was lost and the service came up.
    # The interpreter's own start (site, about 0.1 s, before any line of ours) still ignores it.
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        from cotal_trio.cli import main as cli_main
    except KeyboardInterrupt:
        return INTERRUPTED
    except RuntimeError as exc:  # a Ctrl-C in a class body's __set_name__ (a dataclass importing)
        if isinstance(exc.__cause__, KeyboardInterrupt) or isinstance(exc.__context__, KeyboardInterrupt):
            return INTERRUPTED
        raise
    return cli_main()


if __name__ == "__main__":
    sys.exit(main())
