"""A Ctrl-C while the command line is being imported is exit 130 with nothing printed.

``cotal`` and ``python -m cotal_trio`` enter through :func:`cotal_trio.__main__.main`, which
imports :mod:`cotal_trio.cli` inside its guard: the import takes tens of milliseconds, and a
SIGINT landing in it used to print a traceback through ``cotal_trio/cli/__init__.py``
(tests/cli/test_up_interrupt.py hit it now and then at its 0.1 s delays). Here the Ctrl-C is made
to land there every time: an import hook raises KeyboardInterrupt when ``cotal_trio.cli.exits``
is imported, in a real interpreter.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent.parent

_INTERRUPTED_IMPORT = textwrap.dedent("""
    import sys

    class Interrupt:
        def find_spec(self, name, path=None, target=None):
            if name == {module!r}:
                raise {error}
            return None

    sys.meta_path.insert(0, Interrupt())
    from cotal_trio.__main__ import main
    sys.exit(main())
""")


@pytest.mark.parametrize(
    ("module", "error"),
    [
        ("cotal_trio.cli.exits", "KeyboardInterrupt"),
        ("cotal_trio.core.errors", "KeyboardInterrupt"),
        # Python wraps a Ctrl-C in a class body's __set_name__ this way (a dataclass importing)
        ("cotal_trio.cli.exits", "RuntimeError('Error calling __set_name__') from KeyboardInterrupt()"),
    ],
)
def test_a_ctrl_c_during_the_import_ends_with_130_and_prints_nothing(module, error):
    code = _INTERRUPTED_IMPORT.format(module=module, error=error)
    proc = subprocess.run([sys.executable, "-c", code, "--version"], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert (proc.returncode, proc.stdout, proc.stderr) == (130, "", "")


def test_another_error_during_the_import_is_not_taken_for_a_ctrl_c():
    code = _INTERRUPTED_IMPORT.format(module="cotal_trio.cli.exits", error="RuntimeError('broken')")
    proc = subprocess.run([sys.executable, "-c", code, "--version"], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert proc.returncode == 1 and "RuntimeError: broken" in proc.stderr


def test_the_console_script_enters_through_the_guard():
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts == {"cotal": "cotal_trio.__main__:main"}
    proc = subprocess.run([sys.executable, "-m", "cotal_trio", "--version"], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert (proc.returncode, proc.stdout.strip()) == (0, "0.1.0")


def test_a_sigint_a_shell_had_ignored_is_honoured_from_the_start():
    """A background job of a shell (`cotal up &`) starts with SIGINT ignored; the serving
    command honours SIGINT once it listens for it, so a Ctrl-C or ``kill -INT`` in the first
    tenths of a second was lost and the service came up anyway (a new user's run). The entry
    restores Python's KeyboardInterrupt before anything else, so the whole start honours it."""
    code = textwrap.dedent("""
        import signal, sys
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # as the shell left it
        sys.argv = ["cotal", "--version"]
        from cotal_trio.__main__ import main
        code = main()
        print(signal.getsignal(signal.SIGINT) is signal.default_int_handler, code)
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert (proc.returncode, proc.stdout.split()[-2:]) == (0, ["True", "0"]), proc.stderr
