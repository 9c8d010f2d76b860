"""What both benchmarks read about the machine they run on: CPU counters and versions.

Imported by ``bench/callout.py`` and ``bench/lanes.py`` as a sibling module (a script's own
folder is first on ``sys.path``). Linux ``/proc`` only; times are CPU seconds.
"""

from __future__ import annotations

import math
import os
import subprocess
from pathlib import Path

import cotal_trio
from cotal_trio.broker.process import find_nats_server

CLK_TCK = os.sysconf("SC_CLK_TCK")


def proc_cpu_s(pid: int | None, *, gone: float = math.nan) -> float:
    """utime + stime of ``pid`` in seconds (all its threads, live and exited); ``gone`` when
    there is no such process (or ``pid`` is None)."""
    if pid is None:
        return gone
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return gone
    fields = stat[stat.rindex(")") + 2 :].split()  # fields from 3 (state) on
    return (int(fields[11]) + int(fields[12])) / CLK_TCK  # fields 14 and 15


def machine_busy_s() -> float:
    """CPU seconds all processes spent busy so far (``/proc/stat``: user nice system irq softirq steal)."""
    fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in fields[:8])
    return (user + nice + system + irq + softirq + steal) / CLK_TCK


def nats_server_version() -> str:
    """``nats-server --version`` of the one ``cotal up`` would run, or a note that there is none."""
    exe = find_nats_server()
    if exe is None:
        return "nats-server neither beside this Python nor on PATH"
    out = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=10)
    return (out.stdout or out.stderr).strip()


def code_version() -> str:
    """``git describe`` of the imported cotal_trio's checkout, or a note that it has none."""
    where = Path(cotal_trio.__file__).parent
    try:
        out = subprocess.run(
            ["git", "-C", str(where), "describe", "--always", "--dirty"], capture_output=True, text=True, timeout=10
        )
    except OSError:
        return "git not available"
    return f"git {out.stdout.strip()}" if out.returncode == 0 else "not a git checkout"
