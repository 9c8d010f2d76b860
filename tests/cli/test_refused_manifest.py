"""Issue 18 item 4 without a broker: what ``cotal status``, ``cotal space list`` and ``cotal watch``
show of a refused ``spaces.json``, from the files a host writes.

``.applied`` is written as a running host writes it (its pid ours, so its writer is alive;
a reaped child's pid for a host that is gone). The end-to-end version, with a real ``cotal
auth-service --spaces`` host, is ``tests/cli/test_refused_manifest_live.py``.
"""

from __future__ import annotations

import json
import os
import subprocess

from cotal_trio.cli._hosted import read_hosted
from cotal_trio.cli.watch import Refusals, _Refused, _refused_now, render_view
from cotal_trio.core.events import SpaceView
from cotal_trio.core.manifest import LaneStatus, ManifestRefused, parse_manifest, render_applied
from cotal_trio.state import atomic_write

from tests.support.cli_root import SPACE, Root

TYPO = b'{"version": 2, "spaces": [{"spcae": "default"}]}\n'  # a mistyped key
GOOD = json.dumps({"version": 2, "spaces": [{"space": SPACE}]}).encode()


def _sentence() -> str:
    try:
        parse_manifest(TYPO)
    except ManifestRefused as exc:
        return str(exc)
    raise AssertionError("the typo parses")


def _gone_pid() -> int:
    child = subprocess.Popen(["true"])
    child.wait()
    return child.pid


def _applied(root: Root, *, refused: str | None, pid: int | None = None, **lanes: LaneStatus) -> None:
    data = render_applied(
        manifest_sha256="0" * 64, applied_at="2026-12-02T01:00:00Z", spaces=lanes, refused=refused,
        pid=os.getpid() if pid is None else pid,
    )
    atomic_write(root.paths.spaces_manifest.with_name("spaces.json.applied"), data, mode=0o644)


def _line(root: Root, sentence: str) -> str:
    return f"manifest {root.paths.spaces_manifest} refused, the current lanes keep serving: {sentence}"


def _refused_by_a_running_host(root: Root) -> str:
    """spaces.json with a typo, and the running host's ``.applied`` still serving ``default``."""
    atomic_write(root.paths.spaces_manifest, TYPO)
    _applied(root, refused=_sentence(), default=LaneStatus(state="serving"))
    return _line(root, _sentence())


def test_space_list_shows_what_the_host_serves_and_the_refusal(root, capsys):
    line = _refused_by_a_running_host(root)
    assert root.run(capsys, "space", "list") == (0, f"{SPACE}\tuser-auth\thosted\n{line}\n", "")
    code, out, err = root.run(capsys, "space", "list", "--json")
    assert (code, json.loads(out), err) == (0, [{"space": SPACE, "mode": "user-auth", "hosted": True}], line + "\n")


def test_status_shows_the_lanes_and_the_refusal_and_exits_0(root, capsys):
    line = _refused_by_a_running_host(root)
    assert root.run(capsys, "status") == (0, f"{SPACE}  serving\n{line}\n", "")
    code, out, err = root.run(capsys, "status", "--json")
    report = json.loads(out)
    assert (code, err, report["refused"], report["running"]) == (0, line + "\n", _sentence(), True)
    assert [(s["space"], s["state"]) for s in report["spaces"]] == [(SPACE, "serving")]


def test_status_json_has_no_refused_key_while_the_manifest_is_accepted(root, capsys):
    atomic_write(root.paths.spaces_manifest, GOOD)
    _applied(root, refused=None, default=LaneStatus(state="serving"))
    code, out, err = root.run(capsys, "status", "--json")
    assert (code, err) == (0, "")
    assert "refused" not in json.loads(out)


def test_nothing_serves_keeps_todays_exit_codes(root, capsys):
    """No host runs (its last ``.applied`` names a gone pid): list exits 1 with the sentence
    naming the broken file, as before; status exits 1 and says both the refusal and that no
    auth service runs."""
    atomic_write(root.paths.spaces_manifest, TYPO)
    _applied(root, refused=_sentence(), pid=_gone_pid())
    code, out, err = root.run(capsys, "space", "list")
    assert (code, out) == (1, "")
    problem = f"{root.paths.spaces_manifest} is refused ({_sentence()}) - fix it by hand first"
    assert err == f"cotal: {problem}\n"
    code, out, err = root.run(capsys, "status")
    assert (code, out) == (1, problem + "\n")
    assert "no auth service is running" in err


def test_a_fixed_manifest_the_host_has_not_reread_yet_still_shows_the_refusal(root, capsys):
    """Until the host rereads it, its ``.applied`` refusal stands beside the hosted column
    spaces.json gives."""
    atomic_write(root.paths.spaces_manifest, GOOD)
    _applied(root, refused=_sentence(), default=LaneStatus(state="serving"))
    assert root.run(capsys, "space", "list") == (0, f"{SPACE}\tuser-auth\thosted\n{_line(root, _sentence())}\n", "")


def test_a_gone_hosts_refusal_is_not_shown(root, capsys):
    atomic_write(root.paths.spaces_manifest, GOOD)
    _applied(root, refused=_sentence(), pid=_gone_pid())
    assert root.run(capsys, "space", "list") == (0, f"{SPACE}\tuser-auth\thosted\n", "")


def test_a_refused_manifest_with_no_lane_says_nothing_serves(root, capsys):
    """A host started on the broken file serves nothing; its line says so, and list exits 1."""
    atomic_write(root.paths.spaces_manifest, TYPO)
    _applied(root, refused=_sentence())
    hosted = read_hosted(root.paths)
    assert hosted.spaces is None
    assert hosted.line() == f"manifest {root.paths.spaces_manifest} refused, nothing serves: {_sentence()}"
    assert root.run(capsys, "space", "list")[0] == 1


def test_watch_keys_the_root_files_refusal_by_its_host(root):
    line = _refused_by_a_running_host(root)
    assert _refused_now(read_hosted(root.paths)) == _Refused(
        os.getpid(), line, pid=os.getpid(), manifest=str(root.paths.spaces_manifest))
    _applied(root, refused=None, default=LaneStatus(state="serving"))  # no host refused it yet
    problem = f"{root.paths.spaces_manifest} is refused ({_sentence()}) - fix it by hand first"
    assert _refused_now(read_hosted(root.paths)) == _Refused(
        "root", problem, pid=os.getpid(), manifest=str(root.paths.spaces_manifest))
    atomic_write(root.paths.spaces_manifest, GOOD)
    assert _refused_now(read_hosted(root.paths)) == _Refused(
        None, None, pid=os.getpid(), manifest=str(root.paths.spaces_manifest))


def test_refusals_follow_the_events_and_the_root_files():
    refusals = Refusals()
    refused = {"type": "manifest", "space": None, "outcome": "refused", "reason": "spaces[0]: bad - fix it"}
    # An event before the host's manifest is known names the host by its pid.
    assert refusals.event(7, refused) == "manifest of host pid 7 refused, the current lanes keep serving: spaces[0]: bad - fix it"
    assert refusals.event(7, refused) is None  # said once
    refusals.event(7, {"type": "manifest", "outcome": "applied", "sha256": "0" * 64})
    assert refusals.lines() == []
    refusals.applied(_Refused(None, None, pid=7, manifest="/r/spaces.json"))
    assert refusals.event(7, refused) == "manifest /r/spaces.json refused, the current lanes keep serving: spaces[0]: bad - fix it"
    # The root file's line for the same host is one line, not two.
    assert refusals.applied(_Refused(7, refusals.lines()[0], pid=7, manifest="/r/spaces.json")) is None
    assert refusals.applied(_Refused("root", "/r/spaces.json is refused (x) - fix it by hand first")) is not None
    assert len(refusals.lines()) == 2
    refusals.applied(_Refused("root", None))
    refusals.applied(_Refused(7, None))
    assert refusals.lines() == []


def test_render_view_puts_each_refusal_first():
    view = SpaceView(space="a", connected=True, state="serving", reason=None,
                     rates={"minted": 0.0, "denied": 0.0, "timeout": 0.0, "shed": 0.0}, p50_ms=None, p99_ms=None,
                     limit_denials=0, denials=())
    assert render_view([view], refusals=["manifest /r/spaces.json refused, the current lanes keep serving: x"]) == (
        "manifest /r/spaces.json refused, the current lanes keep serving: x\n"
        "a  serving\n"
        "  connects/s (10 s)  minted 0.0  denied 0.0  timeout 0.0  shed 0.0\n"
        "  callout (60 s)     -\n"
        "  limit denials      0"
    )
    assert render_view([], refusals=["r"]) == "r\nno space serves a face yet - start `cotal up`, or pass --space"
