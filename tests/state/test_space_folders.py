"""The rename of earlier ``space.<hex>`` folders to the space's name (state/space_folders.py; issue 18 item 3)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from cotal_trio.core.errors import ConfigError
from cotal_trio.state import RootPaths
from cotal_trio.state.space_folders import (
    legacy_dir_name,
    migrate_space_folders,
    rename_space_folders,
    require_space,
)


def _old_root(tmp_path, *spaces: str) -> RootPaths:
    """A root as an earlier version left it: ``spaces/space.<hex>/callout.json`` per space."""
    paths = RootPaths(tmp_path / "root")
    (paths.root / "broker.json").parent.mkdir(parents=True)
    (paths.root / "broker.json").write_text("{}")
    for space in spaces:
        folder = paths.spaces_dir / legacy_dir_name(space)
        folder.mkdir(parents=True)
        (folder / "callout.json").write_text(json.dumps({"space": space}))
    return paths


def _listing(paths: RootPaths) -> list[str]:
    return sorted(p.name for p in paths.spaces_dir.iterdir())


def test_legacy_name_is_the_hex_of_the_name():
    assert legacy_dir_name("default") == "space.64656661756c74"


def test_every_old_folder_gets_its_name_with_its_files(tmp_path):
    paths = _old_root(tmp_path, "alpha", "b-2")
    (paths.spaces_dir / "notes.txt").write_text("operator's own file")  # not a space folder: left alone
    assert rename_space_folders(paths) == ["alpha", "b-2"]
    assert _listing(paths) == ["alpha", "b-2", "notes.txt", legacy_dir_name("alpha"), legacy_dir_name("b-2")]
    assert json.loads(paths.space("alpha").callout_json.read_text()) == {"space": "alpha"}
    assert require_space(paths, "b-2") == paths.space("b-2")


def test_the_rename_is_idempotent_and_finishes_an_interrupted_one(tmp_path):
    paths = _old_root(tmp_path, "alpha", "beta")
    # Interrupted half-way: alpha was renamed, beta not yet.
    os.rename(paths.spaces_dir / legacy_dir_name("alpha"), paths.spaces_dir / "alpha")
    assert rename_space_folders(paths) == ["beta"]
    assert rename_space_folders(paths) == []
    assert migrate_space_folders(paths) == []
    assert _listing(paths) == ["alpha", "beta", legacy_dir_name("beta")]  # alpha's crash left no link: no promise


def test_an_old_folder_not_renamed_yet_names_the_start_that_renames_it(tmp_path):
    paths = _old_root(tmp_path, "alpha")
    with pytest.raises(ConfigError) as info:
        require_space(paths, "alpha")
    assert str(info.value) == (
        f"space alpha is in the root {paths.root} under its earlier folder name space.616c706861 - start "
        "`cotal up` (or `cotal auth-service`) on the root once: it renames the folder"
    )
    with pytest.raises(ConfigError, match=r"^space gamma is not in the root .* - see `cotal space list`$"):
        require_space(paths, "gamma")


def test_two_folders_for_one_space_are_refused_and_nothing_moves(tmp_path):
    paths = _old_root(tmp_path, "alpha", "beta")
    (paths.spaces_dir / "beta").mkdir()  # an earlier service recreated it, or a copy
    before = _listing(paths)
    with pytest.raises(ConfigError) as info:
        rename_space_folders(paths)
    old, new = paths.spaces_dir / legacy_dir_name("beta"), paths.spaces_dir / "beta"
    assert str(info.value) == (
        f"space beta has two folders, {old} and {new} - keep the one holding the space's keys "
        "(its callout.json), move the other out of the root, and start again"
    )
    assert _listing(paths) == before  # checked before the first rename: alpha did not move either


def test_an_earlier_auth_service_still_serving_from_an_old_folder_is_refused(tmp_path):
    paths = _old_root(tmp_path, "alpha")
    with subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]) as other:
        try:
            readiness = paths.spaces_dir / legacy_dir_name("alpha") / "auth-service.json"
            readiness.write_text(json.dumps({"ver": 1, "url": "http://127.0.0.1:1", "pid": other.pid, "cap": "c"}))
            with pytest.raises(ConfigError) as info:
                rename_space_folders(paths)
            assert str(info.value) == (
                f"space alpha is served from {readiness.parent} by pid {other.pid}, an auth service of an "
                f"earlier version - stop it, or remove {readiness} if pid {other.pid} is not cotal, then start "
                "again (the start renames the space folders to their names)"
            )
            assert _listing(paths) == [legacy_dir_name("alpha")]
        finally:
            other.kill()
    other.wait()
    assert rename_space_folders(paths) == ["alpha"]  # its readiness file names a process that is gone


def test_a_process_holding_the_root_lock_blocks_the_rename(tmp_path):
    paths = _old_root(tmp_path, "alpha")
    with subprocess.Popen(
        [sys.executable, "-c",
         "import sys, time; from pathlib import Path; from cotal_trio.state import hold_root\n"
         "with hold_root(Path(sys.argv[1])):\n    print('held', flush=True); time.sleep(60)", str(paths.root)],
        stdout=subprocess.PIPE, text=True,
    ) as holder:
        try:
            assert holder.stdout.readline() == "held\n"
            with pytest.raises(ConfigError) as info:
                migrate_space_folders(paths)
            assert str(info.value) == (
                f"the space folders of {paths.root} still have their earlier names and pid {holder.pid} holds the "
                f"root ({paths.root / 'up.lock'}) - stop it, then start again (the start renames them)"
            )
            assert _listing(paths) == [legacy_dir_name("alpha")]
        finally:
            holder.kill()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:  # the kernel drops the lock with the process
        try:
            assert migrate_space_folders(paths) == ["alpha"]
            break
        except ConfigError:
            time.sleep(0.05)
    assert _listing(paths) == ["alpha", legacy_dir_name("alpha")]


def test_the_old_paths_handed_out_still_resolve_after_the_rename(tmp_path):
    """connect-info and the README gave clients spaces/space.<hex>/sentinel.creds, and an earlier
    callout replica reads its ledger rows per connect under space.<hex>/ (issue 18 item 3 review)."""
    paths = _old_root(tmp_path, "alpha")
    old = paths.spaces_dir / legacy_dir_name("alpha")
    (old / "sentinel.creds").write_text("creds")
    (old / "actors").mkdir()
    (old / "actors" / "alice.cli.json").write_text('{"actor": "cli"}')
    assert rename_space_folders(paths) == ["alpha"]
    assert os.readlink(old) == "alpha"  # relative: the root may move
    assert os.path.samefile(old / "sentinel.creds", paths.space("alpha").sentinel_creds)
    assert (old / "actors" / "alice.cli.json").read_text() == '{"actor": "cli"}'  # the old-path ledger read
    assert rename_space_folders(paths) == [] and migrate_space_folders(paths) == []  # the link is not renamed again
    assert _listing(paths) == ["alpha", legacy_dir_name("alpha")]
    from cotal_trio.broker.spaces import list_spaces

    assert [row["space"] for row in list_spaces(paths)] == ["alpha"]


def test_a_crash_between_the_rename_and_the_link_is_mended_at_the_next_start(tmp_path):
    paths = _old_root(tmp_path, "alpha", "beta")
    old_alpha = paths.spaces_dir / legacy_dir_name("alpha")
    # What a crash after alpha's folder rename, before its link moved over the old name, leaves.
    os.symlink("alpha", paths.spaces_dir / f".{old_alpha.name}.renaming")
    os.rename(old_alpha, paths.spaces_dir / "alpha")
    # And one before beta's folder rename: its pending link exists, its folder has its old name.
    os.symlink("beta", paths.spaces_dir / f".{legacy_dir_name('beta')}.renaming")
    assert migrate_space_folders(paths) == ["alpha", "beta"]
    assert _listing(paths) == ["alpha", "beta", legacy_dir_name("alpha"), legacy_dir_name("beta")]
    for name in ("alpha", "beta"):
        assert os.readlink(paths.spaces_dir / legacy_dir_name(name)) == name
    assert migrate_space_folders(paths) == []


def test_the_log_line_names_the_new_sentinel_path(tmp_path):
    from cotal_trio.state.space_folders import rename_note

    paths = _old_root(tmp_path)
    assert rename_note(paths, ["alpha"]) == (
        f"space folders renamed to their names in {paths.spaces_dir} (alpha: sentinelCreds "
        f"{paths.spaces_dir / 'alpha' / 'sentinel.creds'}; the old space.<hex> paths still resolve)"
    )
