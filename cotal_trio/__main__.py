"""``python -m cotal_trio`` and the ``cotal`` console script: the command line, imported inside
a Ctrl-C guard.

Importing :mod:`cotal_trio.cli` takes tens of milliseconds (dataclasses, enum, the errors); a
Ctrl-C during it used to end in a traceback through ``cotal_trio/cli/__init__.py``, before
:func:`cotal_trio.cli.main`'s own guard existed. Here it is exit 130 with nothing printed, as a
Ctrl-C anywhere else before a command starts (issue 15 item 9).
"""

import sys

# 128 + SIGINT: cotal_trio.cli.exits.ExitCode.INTERRUPTED, which is not imported yet here.
INTERRUPTED = 130


def main() -> int:
    """The ``cotal`` command line's exit code (:func:`cotal_trio.cli.main`), or 130 when a Ctrl-C
    lands while the command line is being imported."""
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
