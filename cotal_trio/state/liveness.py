"""Whether the process a root file names is still the one that wrote it (issue 15 item 11).

A readiness file (``auth-service.json``), ``up.lock`` and a host's ``.applied`` name their
writer's pid, and each outlives a writer killed by SIGKILL; after a reboot or in a container
(pid 1) the pid may belong to another process by then. :func:`pid_alive` checks both: that the
pid exists, and that it started no later than the file naming it was written.
"""

from __future__ import annotations

import os

__all__ = ["pid_alive"]

# /proc gives the boot time to the second and a start time in clock ticks: allow for both.
_START_SLACK_S = 2.0


def pid_alive(pid: int, *, since: float | None = None) -> bool:
    """True when a process ``pid`` exists (signal 0; another user's process counts as alive).

    With ``since`` (unix seconds: when the record naming ``pid`` was written, its mtime), a
    process that started after it is not the one that wrote it: after a SIGKILL the record stays
    and its pid may be reused (a reboot, pid 1 in a container; issue 15 item 11). The start time
    is read from ``/proc`` to the second; where it cannot be read, only existence counts.
    """
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    if since is None:
        return True
    started = _process_start(pid)
    return started is None or started <= since + _START_SLACK_S


def _process_start(pid: int) -> float | None:
    """When process ``pid`` started, unix seconds, from Linux's /proc; None where unknown."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            fields = stat.read().rsplit(b")", 1)[1].split()  # the name may hold spaces and ")"
        with open("/proc/stat", "rb") as boot:
            btime = next(int(line.split()[1]) for line in boot if line.startswith(b"btime "))
        return btime + int(fields[19]) / os.sysconf("SC_CLK_TCK")  # field 22, starttime
    except (OSError, ValueError, IndexError, StopIteration):
        return None
