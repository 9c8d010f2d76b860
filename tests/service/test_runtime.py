"""service/runtime.py: the interpreter settings of a serving process (issue 4 benchmark)."""

from __future__ import annotations

import subprocess
import sys


def test_tune_for_serving_freezes_start_up_and_shortens_the_switch_interval():
    # In a child: the settings are process-wide and the test process must keep its own.
    code = (
        "import gc, sys\n"
        "from cotal_trio.service.runtime import SWITCH_INTERVAL_S, tune_for_serving\n"
        "assert gc.get_freeze_count() == 0\n"
        "tune_for_serving()\n"
        "print(gc.get_freeze_count() > 1000, sys.getswitchinterval() == SWITCH_INTERVAL_S == 0.0005)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.split() == ["True", "True"]
