"""Interpreter settings for a process that serves lanes (``cotal up``, ``cotal auth-service``).

Two settings, each measured with ``python bench/callout.py --load`` (docs/benchmarks.md, "The
callout under load"):

* ``gc.freeze()`` once start-up is done. CPython's full (generation 2) collection walks every
  tracked object, and most of them are the modules, classes and functions of the import. In
  the benchmark those pauses took 30-50 ms each, several times a minute under load, and each
  one stalled every lane's callout (the slowest answers of a step came in such clusters).
  Frozen objects are never walked again; what the lanes allocate afterwards is collected as
  usual. (Objects made before the freeze that later become cyclic garbage are not collected:
  start-up makes no such objects that die.)
* ``sys.setswitchinterval(SWITCH_INTERVAL_S)``. A lane reads its ledger in worker threads. While
  trio's thread is busy, a worker waits for the GIL until the switch interval passes (5 ms by
  default), once to run the read and the read's answer waits again, so each read could add up to
  a few milliseconds to a connect. At 0.5 ms the benchmark's callout rate rose by about a tenth.

Sync; call :func:`tune_for_serving` once, from the command, before the lanes start.
"""

from __future__ import annotations

import gc
import sys

__all__ = ["SWITCH_INTERVAL_S", "tune_for_serving"]

# How long a thread runs before another that wants the GIL gets it (seconds; CPython: 0.005).
SWITCH_INTERVAL_S = 0.0005


def tune_for_serving() -> None:
    """Collect the garbage of start-up, freeze what is left, and shorten the GIL switch interval."""
    gc.collect()
    gc.freeze()
    sys.setswitchinterval(SWITCH_INTERVAL_S)
