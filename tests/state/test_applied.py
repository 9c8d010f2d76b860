"""Reading ``.applied`` back with its writer checked (state/applied.py; issue 15 item 11)."""

from __future__ import annotations

import os
import subprocess
import time

import pytest

from cotal_trio.core.errors import ConfigError
from cotal_trio.core.manifest import LaneStatus, render_applied
from cotal_trio.state.applied import applied_path, read_applied


def _write(path, *, pid: int) -> None:
    path.write_bytes(render_applied(
        manifest_sha256=None, applied_at="2026-11-29T10:00:00Z", spaces={"a": LaneStatus(state="serving")},
        refused=None, pid=pid,
    ))


def test_a_live_writer_is_alive(tmp_path):
    path = applied_path(tmp_path / "spaces.json")
    _write(path, pid=os.getpid())
    got = read_applied(path)
    assert got is not None and (got.alive, got.gone, got.report.pid) == (True, None, os.getpid())
    assert got.report.spaces == {"a": LaneStatus(state="serving")}


def test_an_exited_writer_is_gone(tmp_path):
    child = subprocess.Popen(["true"])
    child.wait()
    path = tmp_path / "m.applied"
    _write(path, pid=child.pid)
    got = read_applied(path)
    assert got is not None and (got.alive, got.gone) == (False, f"no host running (the last host, pid {child.pid}, is gone)")


def test_a_pid_that_started_after_the_file_was_written_is_not_its_writer(tmp_path):
    path = tmp_path / "m.applied"
    _write(path, pid=os.getpid())
    os.utime(path, (time.time() - 3600 * 24 * 365 * 30,) * 2)  # written long before we started
    got = read_applied(path)
    assert got is not None and got.alive is False and got.gone is not None


def test_no_file_is_none_and_a_file_naming_no_writer_is_unknown(tmp_path):
    path = tmp_path / "m.applied"
    assert read_applied(path) is None
    path.write_text('{"version": 1, "spaces": {}, "refused": null}')
    got = read_applied(path)
    assert got is not None and (got.alive, got.gone) == (None, None)


def test_a_file_of_another_shape_is_one_sentence(tmp_path):
    path = tmp_path / "m.applied"
    path.write_text('{"spaces": ["a"]}')
    with pytest.raises(ConfigError, match=r"is not a lane host's \.applied file - delete it; the host rewrites it$"):
        read_applied(path)
