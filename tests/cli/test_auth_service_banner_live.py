"""``cotal auth-service --spaces``: the start banner says what serves and what retries.

The banner once read ``✓ auth-service up - 1 spaces`` while that one space had failed its start
and was being retried every 5 s (DESIGN.md 5): a line that claims what is not true. It now waits
for every lane's first outcome (serving, or retrying with its reason, as ``.applied`` shows) and
counts the spaces that serve, naming those that retry. Here the root's broker knows space a's
accounts but not c's, so c's callout connect is refused and its lane retries.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest
import trio

from cotal_trio.cli.auth_service import hosted_summary
from cotal_trio.core.manifest import LaneStatus

from tests.support.service import AUTH_TIMEOUT_S, start_mesh, write_manifest

pytestmark = [pytest.mark.broker, pytest.mark.filterwarnings("error::ResourceWarning")]


async def _first_line(manifest: Path, mesh) -> str:
    """The first stdout line of a ``--spaces manifest`` host on the mesh's broker; then SIGTERM."""
    proc = await trio.lowlevel.open_process(
        [sys.executable, "-m", "cotal_trio", "auth-service", "--spaces", str(manifest), "--server", mesh.server_url,
         "--root", str(mesh.paths.root), "--auth-timeout", str(AUTH_TIMEOUT_S)],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
    )
    try:
        out = b""
        assert proc.stdout is not None
        with trio.fail_after(60):
            while b"\n" not in out and (chunk := await proc.stdout.receive_some()):
                out += chunk
        proc.send_signal(signal.SIGTERM)
        with trio.fail_after(30):
            await proc.wait()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    return out.decode().split("\n", 1)[0]


async def test_the_banner_counts_the_serving_spaces_and_names_the_retrying_one(
    nursery: trio.Nursery, tmp_path: Path, nats_server_bin: str
):
    mesh, _ = await start_mesh(nursery, tmp_path, nats_server_bin, spaces=("a",))  # c's accounts: not pushed
    manifest = tmp_path / "spaces.json"
    write_manifest(manifest, "a", "c")
    assert await _first_line(manifest, mesh) == (
        f"✓ auth-service up - serving 1 space, retrying 1: c (see .applied for why) - "
        f"from {manifest}, .applied at {manifest}.applied"
    )


def test_the_summary_says_space_for_one_and_names_every_retrying_space():
    serving, retrying = LaneStatus(state="serving"), LaneStatus(state="retrying", reason="refused")
    assert hosted_summary({"a": serving}) == "serving 1 space"
    assert hosted_summary({"a": serving, "b": serving}) == "serving 2 spaces"
    assert hosted_summary({"b": retrying, "c": retrying}) == (
        "serving 0 spaces, retrying 2: b, c (see .applied for why)"
    )
