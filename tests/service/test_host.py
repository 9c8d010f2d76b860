"""The lane host on fake lanes and real files (DESIGN.md 5 and 9; issue 3 items 3, 4 and 7).

Fake lanes are startables that record ``("start", space)`` and ``("stop", space)`` in a list; a
lane can be told to fail at start or to fail later. The manifest and ``.applied`` are real files
under ``tmp_path``, and file events need real time, so every test is bounded by ``fail_after``
and waits for ``.applied`` through :meth:`Host.wait_written`, never by sleeping and hoping.
Tests of the watcher disable the backstop (a long ``backstop_s``) so only a file event can have
applied the change; the SIGHUP and backstop tests disable the watcher.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import signal
from pathlib import Path

import pytest
import trio
import trio.lowlevel

from cotal_trio.core.errors import ConfigError, Unavailable
from cotal_trio.core.manifest import LANE_STATES, LaneStatus, SpaceEntry
from cotal_trio.service import host as host_module
from cotal_trio.service.host import DEFAULT_SETTLE_S, HostConfig, LaneInput, LaneState
from cotal_trio.core.manifest import LaneStatus, SpaceEntry
from cotal_trio.service.host import DEFAULT_SETTLE_S, HostConfig
from tests.support.host import (
    FakeLanes,
    NEVER_S,
    applied_of,
    applied_when,
    config,
    manifest_bytes,
    move_over,
    serving,
    start_host,
    states,
)

CEILING_S = 15
QUIET_S = 0.6  # how long a test waits to see that nothing more happens

pytestmark = pytest.mark.filterwarnings("error::ResourceWarning")


def write_in_place(path: Path, data: bytes) -> None:
    with open(path, "r+b" if path.exists() else "wb") as handle:
        handle.truncate(0)
        handle.write(data)


def symlink_swap(path: Path, target: Path, data: bytes) -> None:
    target.write_bytes(data)
    link = path.with_name(path.name + ".link")
    os.symlink(os.path.relpath(target, path.parent), link)
    os.replace(link, path)


@pytest.fixture
def manifest(tmp_path: Path) -> Path:
    path = tmp_path / "conf" / "spaces.json"
    path.parent.mkdir()
    path.write_bytes(manifest_bytes("a", "b", "c"))
    return path


# --- start, remove, add ---------------------------------------------------------------------------


async def test_three_spaces_serve_and_applied_lists_them(nursery, manifest):
    lanes = FakeLanes()
    with trio.fail_after(CEILING_S):
        host = await start_host(nursery, config(manifest, lanes))
        doc = await applied_when(host, manifest, serving("a", "b", "c"))
    assert doc == {
        "version": 1,
        "manifestSha256": hashlib.sha256(manifest.read_bytes()).hexdigest(),
        "appliedAt": "2027-01-15T08:00:00Z",
        "pid": os.getpid(),  # the writer, so a reader can tell a killed host's file (issue 15 item 11)
        "spaces": {"a": {"state": "serving"}, "b": {"state": "serving"}, "c": {"state": "serving"}},
        "refused": None,
    }
    assert sorted(lanes.events) == [("start", "a"), ("start", "b"), ("start", "c")]
    assert host.current_states() == {s: LaneStatus(state="serving") for s in "abc"}
    assert oct(applied_of(manifest).stat().st_mode & 0o777) == "0o644"


async def test_started_after_first_reconcile_is_written(nursery, manifest):
    with trio.fail_after(CEILING_S):
        host = await start_host(nursery, config(manifest, FakeLanes()))
        doc = json.loads(applied_of(manifest).read_bytes())
    assert set(doc["spaces"]) == {"a", "b", "c"}
    assert host.statistics().reconciles == 1


async def test_removed_lane_stops_fully_before_applied_drops_it_then_comes_back(nursery, manifest):
    lanes = FakeLanes(cleanup_s=0.2)
    with trio.fail_after(CEILING_S):
        host = await start_host(nursery, config(manifest, lanes))
        await applied_when(host, manifest, serving("a", "b", "c"))
        move_over(manifest, manifest_bytes("a", "c"))
        seen_stopping = await applied_when(host, manifest, lambda d: d["spaces"].get("b") == {"state": "stopping"})
        assert ("stop", "b") not in lanes.events
        await applied_when(host, manifest, lambda d: "b" not in d["spaces"])
        assert ("stop", "b") in lanes.events
        assert states(seen_stopping) == {"a": "serving", "b": "stopping", "c": "serving"}

        move_over(manifest, manifest_bytes("a", "b", "c"))
        await applied_when(host, manifest, serving("a", "b", "c"))
    assert lanes.starts("b") == 2
    assert lanes.starts("a") == lanes.starts("c") == 1
    assert ("stop", "a") not in lanes.events and ("stop", "c") not in lanes.events


# --- the four ways a manifest changes ---------------------------------------------------------


@pytest.mark.parametrize("replace", [write_in_place, move_over], ids=["in-place", "mv-over"])
async def test_file_change_applies_once(nursery, manifest, replace):
    lanes = FakeLanes()
    with trio.fail_after(CEILING_S):
        host = await start_host(nursery, config(manifest, lanes))
        await applied_when(host, manifest, serving("a", "b", "c"))
        replace(manifest, manifest_bytes("a", "b", "c", "d"))
        await applied_when(host, manifest, serving("a", "b", "c", "d"))
        await trio.sleep(QUIET_S)
    assert host.statistics().reconciles == 2
    assert [lanes.starts(s) for s in "abcd"] == [1, 1, 1, 1]


async def test_symlink_swap_and_edit_of_the_target_apply_once_each(nursery, tmp_path):
    folder = tmp_path / "conf"
    folder.mkdir()
    manifest = folder / "spaces.json"
    symlink_swap(manifest, folder / "v1.json", manifest_bytes("a"))
    lanes = FakeLanes()
    with trio.fail_after(CEILING_S):
        host = await start_host(nursery, config(manifest, lanes))
        await applied_when(host, manifest, serving("a"))
        symlink_swap(manifest, folder / "v2.json", manifest_bytes("a", "b"))
        await applied_when(host, manifest, serving("a", "b"))
        await trio.sleep(QUIET_S)
        assert host.statistics().reconciles == 2
        write_in_place(folder / "v2.json", manifest_bytes("a", "b", "c"))
        await applied_when(host, manifest, serving("a", "b", "c"))
        await trio.sleep(QUIET_S)
    assert host.statistics().reconciles == 3
    assert [lanes.starts(s) for s in "abc"] == [1, 1, 1]
    assert applied_of(manifest).is_file() and not applied_of(manifest).is_symlink()


async def test_symlink_target_in_another_folder_is_watched(nursery, tmp_path):
    (tmp_path / "conf").mkdir()
    (tmp_path / "data").mkdir()
    manifest = tmp_path / "conf" / "spaces.json"
    symlink_swap(manifest, tmp_path / "data" / "v1.json", manifest_bytes("a"))
    lanes = FakeLanes()
    with trio.fail_after(CEILING_S):
        host = await start_host(nursery, config(manifest, lanes))
        await applied_when(host, manifest, serving("a"))
        write_in_place(tmp_path / "data" / "v1.json", manifest_bytes("a", "b"))
        await applied_when(host, manifest, serving("a", "b"))


@pytest.mark.parametrize("gap_s", [0.03, 0.045])
async def test_twenty_edits_within_a_second_apply_once(nursery, manifest, gap_s):
    """With the shipped ``settle_s`` (a bug: 0.1 s split a burst 30-45 ms apart into three)."""
    lanes = FakeLanes()
    with trio.fail_after(CEILING_S):
        host = await start_host(nursery, config(manifest, lanes, settle_s=DEFAULT_SETTLE_S))
        await applied_when(host, manifest, serving("a", "b", "c"))
        for i in range(20):
            write_in_place(manifest, manifest_bytes("a", {"space": "b", "exchangePublicPort": 7400 + i}, "c"))
            await trio.sleep(gap_s)
        final = hashlib.sha256(manifest.read_bytes()).hexdigest()
        await applied_when(host, manifest, lambda d: d["manifestSha256"] == final and serving("a", "b", "c")(d))
        await trio.sleep(QUIET_S)
    assert host.statistics().reconciles == 2
    assert [lanes.starts(s) for s in "abc"] == [1, 2, 1]


async def test_unrelated_files_in_the_folder_are_not_rereads(nursery, manifest):
    with trio.fail_after(CEILING_S):
        host = await start_host(nursery, config(manifest, FakeLanes()))
        await applied_when(host, manifest, serving("a", "b", "c"))
        await trio.sleep(QUIET_S)  # the watcher may still report the first `.applied` writes
        before = host.statistics().rereads
        (manifest.parent / "notes.txt").write_text("not the manifest")
        move_over(manifest.parent / "other.json", b"{}")
        await trio.sleep(QUIET_S)
    assert host.statistics().rereads == before


async def test_sighup_rereads(nursery, manifest):
    lanes = FakeLanes()
    with trio.fail_after(CEILING_S):
        host = await start_host(nursery, config(manifest, lanes, watch=False))
        await applied_when(host, manifest, serving("a", "b", "c"))
        move_over(manifest, manifest_bytes("a"))
        await trio.sleep(QUIET_S)
        assert set(host.current_states()) == {"a", "b", "c"}  # nothing but SIGHUP can see it
        os.kill(os.getpid(), signal.SIGHUP)
        await applied_when(host, manifest, serving("a"))


async def test_backstop_rereads_what_the_watcher_missed(nursery, manifest):
    lanes = FakeLanes()
    with trio.fail_after(CEILING_S):
        host = await start_host(nursery, config(manifest, lanes, watch=False, backstop_s=0.3))
        await applied_when(host, manifest, serving("a", "b", "c"))
        write_in_place(manifest, manifest_bytes("c"))
        await applied_when(host, manifest, serving("c"))
        await trio.sleep(QUIET_S)  # several more backstop rereads: the bytes are unchanged
    stats = host.statistics()
    assert stats.reconciles == 2 and stats.rereads >= 3


# --- refusals -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b'{"version": 2, "spaces": [{"space": "a"}, {"space": "a"}]}', 'space "a" is listed 2 times'),
        (b'{"version": 2, "spaces": [{"space": "a", "colour": 1}]}', 'unknown key "colour"'),
        (b"{not json", "the manifest is not valid JSON"),
        (b"", "the manifest is empty"),
    ],
    ids=["duplicate", "unknown-key", "not-json", "empty"],
)
async def test_invalid_manifest_keeps_the_lanes_and_records_refused(nursery, manifest, data, reason):
    lanes = FakeLanes()
    good = hashlib.sha256(manifest.read_bytes()).hexdigest()
    with trio.fail_after(CEILING_S):
        host = await start_host(nursery, config(manifest, lanes))
        await applied_when(host, manifest, serving("a", "b", "c"))
        move_over(manifest, data)
        doc = await applied_when(host, manifest, lambda d: d["refused"] is not None)
        assert reason in doc["refused"]
        assert doc["manifestSha256"] == good and serving("a", "b", "c")(doc)

        move_over(manifest, manifest_bytes("a", "b", "c"))  # the same bytes as before
        doc = await applied_when(host, manifest, lambda d: d["refused"] is None)
    assert serving("a", "b", "c")(doc) and doc["manifestSha256"] == good
    assert ("stop", "a") not in lanes.events and len(lanes.events) == 3


async def test_missing_manifest_at_start_serves_nothing_until_written(nursery, tmp_path):
    manifest = tmp_path / "spaces.json"
    lanes = FakeLanes()
    with trio.fail_after(CEILING_S):
        host = await start_host(nursery, config(manifest, lanes))
        doc = json.loads(applied_of(manifest).read_bytes())
        assert doc["spaces"] == {} and doc["manifestSha256"] is None
        assert doc["refused"].startswith(f"{manifest} does not exist - write it")
        move_over(manifest, manifest_bytes("a"))
        doc = await applied_when(host, manifest, serving("a"))
    assert doc["refused"] is None


async def test_invalid_manifest_at_start_serves_nothing(nursery, manifest):
    manifest.write_bytes(b'{"version": 1, "spaces": []}')
    with trio.fail_after(CEILING_S):
        host = await start_host(nursery, config(manifest, FakeLanes()))
    doc = json.loads(applied_of(manifest).read_bytes())
    assert doc["spaces"] == {} and "the manifest version is 1, not 2" in doc["refused"]
    assert host.statistics().manifest_sha256 is None


async def test_callout_only_host_reads_only_space(nursery, manifest):
    manifest.write_bytes(manifest_bytes({"space": "a", "exchangePublicPort": "not a port"}))
    with trio.fail_after(CEILING_S):
        host = await start_host(nursery, config(manifest, FakeLanes(), callout_only=True))
        await applied_when(host, manifest, serving("a"))


# --- lane failures ------------------------------------------------------------------------------


async def test_lane_failing_at_start_retries_while_others_serve(nursery, manifest, caplog):
    lanes = FakeLanes()
    lanes.fail_start["b"] = ConfigError("space b: keys.json is corrupt - restore it\nsecond line")
    with trio.fail_after(CEILING_S), caplog.at_level(logging.WARNING, logger="cotal.host"):
        host = await start_host(nursery, config(manifest, lanes))
        retrying = {"state": "retrying", "reason": "space b: keys.json is corrupt - restore it"}
        doc = await applied_when(host, manifest, lambda d: d["spaces"].get("b") == retrying)
        await applied_when(host, manifest, lambda d: lanes.starts("b") >= 3)
        del lanes.fail_start["b"]
        await applied_when(host, manifest, serving("a", "b", "c"))
    assert doc["spaces"]["a"]["state"] in ("starting", "serving")
    assert lanes.starts("a") == lanes.starts("c") == 1
    assert ("stop", "a") not in lanes.events
    failures = [r for r in caplog.records if r.name == "cotal.host" and "lane failed" in r.getMessage()]
    assert failures and all("space b" in r.getMessage() for r in failures)
    assert all(r.exc_info is None for r in failures)  # our own errors need no traceback


async def test_lane_failing_later_is_retried_and_a_bug_is_logged_with_traceback(nursery, manifest, caplog):
    lanes = FakeLanes()
    with trio.fail_after(CEILING_S), caplog.at_level(logging.WARNING, logger="cotal.host"):
        host = await start_host(nursery, config(manifest, lanes, retry_s=0.3))
        await applied_when(host, manifest, serving("a", "b", "c"))
        lanes.crash("c")
        doc = await applied_when(host, manifest, lambda d: d["spaces"]["c"]["state"] == "retrying")
        assert doc["spaces"]["c"]["reason"] == "space c: the broker closed the callout connection"
        assert states(doc) == {"a": "serving", "b": "serving", "c": "retrying"}
        await applied_when(host, manifest, serving("a", "b", "c"))

        lanes.fail_start["a"] = RuntimeError("boom")
        lanes.crash("a")
        doc = await applied_when(host, manifest, lambda d: d["spaces"]["a"].get("reason") == "RuntimeError: boom")
        bugs = [r for r in caplog.records if r.exc_info is not None]
        assert bugs and "space a" in bugs[0].getMessage()
    assert lanes.starts("b") == 1 and lanes.starts("c") == 2


async def test_lane_ending_without_an_error_is_retried(nursery, manifest):
    ended = {"n": 0}

    async def short_lived(entry: SpaceEntry, *, task_status: trio.TaskStatus[None]) -> None:
        ended["n"] += 1
        task_status.started()

    ended_alone = {"state": "retrying", "reason": "the lane ended without an error"}
    with trio.fail_after(CEILING_S):
        host = await start_host(nursery, config(manifest, lambda e: functools.partial(short_lived, e)))
        await applied_when(host, manifest, lambda d: d["spaces"]["a"] == ended_alone)
        await applied_when(host, manifest, lambda d: ended["n"] >= 6)  # each space retried


async def test_changed_entry_restarts_that_lane_alone(nursery, manifest):
    lanes = FakeLanes()
    with trio.fail_after(CEILING_S):
        host = await start_host(nursery, config(manifest, lanes))
        await applied_when(host, manifest, serving("a", "b", "c"))
        move_over(manifest, manifest_bytes("a", {"space": "b", "serviceEndpoints": True}, "c"))
        await applied_when(host, manifest, lambda d: host.statistics().reconciles == 2 and serving("a", "b", "c")(d))
    assert lanes.events[3:] == [("stop", "b"), ("start", "b")]


# --- cancellation ---------------------------------------------------------------------------------


async def test_cancelling_the_host_stops_every_lane(manifest):
    lanes = FakeLanes(cleanup_s=0.1)
    with trio.fail_after(CEILING_S):
        async with trio.open_nursery() as nursery:
            host = await start_host(nursery, config(manifest, lanes))
            await applied_when(host, manifest, serving("a", "b", "c"))
            lanes.fail_start["c"] = Unavailable("space c: no broker")
            lanes.crash("c")
            await applied_when(host, manifest, lambda d: d["spaces"]["c"]["state"] == "retrying")
            nursery.cancel_scope.cancel()
    assert sorted(e for e in lanes.events if e[0] == "stop") == [("stop", "a"), ("stop", "b"), ("stop", "c")]
    assert manifest.exists() and applied_of(manifest).exists()


async def test_cancelling_the_host_while_a_lane_is_starting(manifest):
    started = trio.Event()

    async def slow(entry: SpaceEntry, *, task_status: trio.TaskStatus[None]) -> None:
        started.set()
        await trio.sleep_forever()

    with trio.fail_after(CEILING_S):
        async with trio.open_nursery() as nursery:
            host = await start_host(nursery, config(manifest, lambda e: functools.partial(slow, e)))
            await started.wait()
            assert set(host.current_states().values()) == {LaneStatus(state="starting")}
            nursery.cancel_scope.cancel()


def test_lane_states_are_an_enum_of_the_applied_names_and_the_table_is_keyed_by_it():
    """Issue 16: the states are :class:`LaneState` (their values the ``.applied`` names, so the
    file and the events are unchanged) and ``_NEXT`` maps (state, input) to a state."""
    assert [state.value for state in LaneState] == list(LANE_STATES)
    assert all(isinstance(s, LaneState) and isinstance(i, LaneInput) for s, i in host_module._NEXT)
    assert all(isinstance(to, LaneState) for to in host_module._NEXT.values())
    assert host_module._NEXT[(LaneState.STARTING, LaneInput.STARTED)] is LaneState.SERVING
    assert {to for (state, _), to in host_module._NEXT.items() if state is LaneState.STOPPING} == {LaneState.STOPPING}
    assert json.dumps({"state": LaneStatus(state=LaneState.RETRYING, reason="r").state}) == '{"state": "retrying"}'


def test_config_refuses_non_positive_durations(tmp_path):
    with pytest.raises(ConfigError, match="retry_s must be a positive number"):
        HostConfig(manifest=tmp_path / "m.json", start_lane=FakeLanes(), retry_s=0)
    with pytest.raises(ConfigError, match="settle_s"):
        HostConfig(manifest=tmp_path / "m.json", start_lane=FakeLanes(), settle_s=float("nan"))


# --- waiting for one lane (cotal up waits for its own space) ---------------------------------------


async def test_next_outcome_reports_each_start_with_its_failure(nursery, manifest):
    lanes = FakeLanes()
    broken = ConfigError("space b: callout.json is corrupt - restore it")
    lanes.fail_start["b"] = broken
    with trio.fail_after(CEILING_S):
        host = await start_host(nursery, config(manifest, lanes))
        a = await host.next_outcome("a")
        first = await host.next_outcome("b")
        second = await host.next_outcome("b", first.count)  # the host's retry, 0.2 s later
        del lanes.fail_start["b"]
        third = await host.next_outcome("b", second.count)
    assert (a.count, a.status, a.failure) == (1, LaneStatus(state="serving"), None)
    assert first.count == 1 and first.status == LaneStatus(state="retrying", reason=str(broken))
    assert [type(e) for e in first.failure.exceptions] == [ConfigError]  # the group the lane raised
    assert first.failure.exceptions[0] is broken
    assert second.count == 2 and second.status.state == "retrying"
    assert (third.count, third.status, third.failure) == (3, LaneStatus(state="serving"), None)


async def test_next_outcome_of_a_space_the_manifest_drops_is_a_key_error(nursery, manifest):
    lanes = FakeLanes()
    lanes.fail_start["c"] = Unavailable("space c: the broker is down")
    with trio.fail_after(CEILING_S):
        host = await start_host(nursery, config(manifest, lanes, retry_s=NEVER_S))
        seen = (await host.next_outcome("c")).count
        with pytest.raises(KeyError):
            await host.next_outcome("nope")
        async with trio.open_nursery() as waiters:
            async def wait_c() -> None:
                with pytest.raises(KeyError):
                    await host.next_outcome("c", seen)
            waiters.start_soon(wait_c)
            await trio.sleep(0)
            move_over(manifest, manifest_bytes("a", "b"))
            # wait_c wakes when the lane is told to stop: it will never have another outcome


# --- a stopped host claims nothing (issue 15 item 11) ---------------------------------------------


async def test_a_stopped_host_leaves_applied_naming_no_lane(manifest):
    """A clean stop (SIGTERM cancels the host) must not leave ``.applied`` saying ``serving``:
    while the lanes drain it says ``stopping``, and once they have exited it lists none."""
    lanes = FakeLanes(cleanup_s=0.2)
    seen: list[dict[str, str]] = []
    with trio.fail_after(CEILING_S):
        async with trio.open_nursery() as nursery:
            host = await start_host(nursery, config(manifest, lanes))
            await applied_when(host, manifest, serving("a", "b", "c"))
            nursery.cancel_scope.cancel()
        seen.append(states(json.loads(applied_of(manifest).read_bytes())))
    assert lanes.events.count(("stop", "a")) == 1
    assert seen == [{}]
    doc = json.loads(applied_of(manifest).read_bytes())
    assert doc["manifestSha256"] == hashlib.sha256(manifest.read_bytes()).hexdigest()


# --- one host per manifest ------------------------------------------------------------------------


async def test_a_second_host_on_the_same_manifest_is_refused_naming_the_first(manifest):
    """Two hosts on one manifest both rewrote its ``.applied`` after their own reconciles, so
    the file flipped between two hosts' views (one serving a space, the other retrying it for a
    refused plane claim) and claimed what neither alone was: the second is refused at start,
    naming the first's pid and the fix, and the first's ``.applied`` is left as it wrote it.
    Once the first has stopped, a host starts on the manifest again."""
    lanes = FakeLanes()
    with trio.fail_after(CEILING_S):
        async with trio.open_nursery() as nursery:
            first = await start_host(nursery, config(manifest, lanes))
            await applied_when(first, manifest, serving("a", "b", "c"))
            written = applied_of(manifest).read_bytes()
            with pytest.raises(ConfigError) as refused:
                await start_host(nursery, config(manifest, FakeLanes()))
            assert str(refused.value) == (
                f"manifest {manifest} is already hosted by pid {os.getpid()}, which writes {applied_of(manifest)}"
                " - run one host per manifest: stop that one, or give this host a manifest of its own"
                " (a callout replica host lists the same spaces in its own file)"
            )
            assert applied_of(manifest).read_bytes() == written
            nursery.cancel_scope.cancel()
        async with trio.open_nursery() as nursery:
            again = await start_host(nursery, config(manifest, FakeLanes()))
            await applied_when(again, manifest, serving("a", "b", "c"))
            nursery.cancel_scope.cancel()


async def test_two_links_to_one_manifest_are_two_hosts_with_two_status_files(nursery, tmp_path):
    """``.applied`` is written beside the path a host was given, so two hosts given two links to
    one file write two files and do not collide."""
    target = tmp_path / "spaces.json"
    target.write_bytes(manifest_bytes("a"))
    links = [tmp_path / "one.json", tmp_path / "two.json"]
    for link in links:
        link.symlink_to(target.name)
    with trio.fail_after(CEILING_S):
        hosts = [await start_host(nursery, config(link, FakeLanes())) for link in links]
        for host, link in zip(hosts, links, strict=True):
            await applied_when(host, link, serving("a"))
    nursery.cancel_scope.cancel()
