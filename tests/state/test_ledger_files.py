"""state.ledger_files: rows as files, fresh reads, one kind per principal, corrupt rows reported."""

from __future__ import annotations

import os
import stat

import pytest

from cotal_trio.core.errors import CodecError, ConfigError, Refused
from cotal_trio.core.ledger import LedgerKind, render_row
from cotal_trio.state import LedgerReader, RootPaths, list_rows, read_principal, remove_row, row_path, write_row
from tests.support.ledger_files import OWNER, row

OTHER = "u_" + "b" * 26


@pytest.fixture
def space(tmp_path):
    return RootPaths(tmp_path).space("demo")


def test_rows_round_trip_per_kind(space):
    interactive = row(LedgerKind.INTERACTIVE, label="laptop")
    managed = row(LedgerKind.MANAGED, actor="worker", parent=f"{OWNER}.cli")
    path_i = write_row(space, interactive)
    path_m = write_row(space, managed)
    assert path_i == space.actors_dir / f"{OWNER}.cli.json"
    assert path_m == space.managed_dir / f"{OWNER}.worker.json"
    assert read_principal(space, OWNER, "cli") == (interactive, None)
    assert read_principal(space, OWNER, "worker") == (None, managed)
    assert read_principal(space, OTHER, "cli") == (None, None)
    assert stat.S_IMODE(os.stat(path_i).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(space.actors_dir).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(space.managed_dir).st_mode) == 0o700


def test_reads_are_fresh(space):
    write_row(space, row(LedgerKind.INTERACTIVE))
    assert read_principal(space, OWNER, "cli")[0].scope == ("spawn", "role:default")
    write_row(space, row(LedgerKind.INTERACTIVE, scope=("run",)))
    assert read_principal(space, OWNER, "cli")[0].scope == ("run",)
    assert remove_row(space, OWNER, "cli") is True
    assert read_principal(space, OWNER, "cli") == (None, None)
    assert remove_row(space, OWNER, "cli") is False


@pytest.mark.parametrize(
    ("first", "second", "held"),
    [(LedgerKind.INTERACTIVE, LedgerKind.MANAGED, "interactive"),
     (LedgerKind.MANAGED, LedgerKind.INTERACTIVE, "managed")],
)
def test_other_kind_is_refused(space, first, second, held):
    write_row(space, row(first))
    with pytest.raises(ConfigError, match=f"already granted as {held} - revoke it first"):
        write_row(space, row(second))
    assert not row_path(space, second, OWNER, "cli").exists()
    assert remove_row(space, OWNER, "cli")
    write_row(space, row(second))


def test_corrupt_row_raises_on_read(space):
    path = write_row(space, row(LedgerKind.INTERACTIVE))
    path.write_text('{"ver": 1, "owner": "x"}')
    with pytest.raises(CodecError, match=f"ledger row {OWNER}.cli is corrupt"):
        read_principal(space, OWNER, "cli")
    assert path.read_text() == '{"ver": 1, "owner": "x"}'


def test_list_rows_sorted_and_corrupt_reported(space):
    rows = [
        row(LedgerKind.MANAGED, actor="zed"),
        row(LedgerKind.INTERACTIVE, owner=OTHER),
        row(LedgerKind.INTERACTIVE),
        row(LedgerKind.MANAGED, actor="alpha"),
    ]
    for r in rows:
        write_row(space, r)
    bad_json = space.actors_dir / f"{OWNER}.broken.json"
    bad_json.write_text("{")
    bad_name = space.managed_dir / "not-a-row.json"
    bad_name.write_text("{}")
    other_principal = space.actors_dir / f"{OTHER}.mismatch.json"
    other_principal.write_bytes((space.actors_dir / f"{OTHER}.cli.json").read_bytes())
    (space.actors_dir / f".{OWNER}.x.json.abc.tmp").write_text("in flight")

    found, corrupt = list_rows(space)
    assert [(r.kind, r.owner, r.actor) for r in found] == [
        (LedgerKind.INTERACTIVE, OWNER, "cli"),
        (LedgerKind.INTERACTIVE, OTHER, "cli"),
        (LedgerKind.MANAGED, OWNER, "alpha"),
        (LedgerKind.MANAGED, OWNER, "zed"),
    ]
    assert [path for path, _ in corrupt] == sorted([bad_json, bad_name, other_principal])
    reasons = dict(corrupt)
    assert "is corrupt" in reasons[bad_json]
    assert "another principal" in reasons[other_principal]
    assert "not <owner>.<actor>.json" in reasons[bad_name]


def test_list_rows_of_an_empty_space(space):
    assert list_rows(space) == ([], [])


@pytest.mark.parametrize(("owner", "actor"), [("../x", "cli"), (OWNER, "a.b"), (OWNER, "../../etc")])
def test_names_cannot_escape_the_folder(space, owner, actor):
    with pytest.raises(Refused):
        read_principal(space, owner, actor)
    with pytest.raises(Refused):
        remove_row(space, owner, actor)
    reader = LedgerReader(space)
    for _ in range(2):  # its path memo keeps only checked names: the second call refuses too
        with pytest.raises(Refused):
            reader(owner, actor)
        with pytest.raises(Refused):
            reader.unchanged(owner, actor)


def test_layout_matches_the_kinds(space):
    assert space.actors_dir.name == LedgerKind.INTERACTIVE.directory
    assert space.managed_dir.name == LedgerKind.MANAGED.directory


def test_ledger_reader_sees_every_write_at_once(space):
    reader = LedgerReader(space)
    assert reader(OWNER, "cli") == (None, None)
    first = row(LedgerKind.INTERACTIVE)
    write_row(space, first)
    assert reader(OWNER, "cli") == (first, None)
    regrant = row(LedgerKind.INTERACTIVE, lifecycle_uid="1" * 26)  # same size, new content
    write_row(space, regrant)
    assert reader(OWNER, "cli") == (regrant, None)
    remove_row(space, OWNER, "cli")
    assert reader(OWNER, "cli") == (None, None)
    managed = row(LedgerKind.MANAGED)
    write_row(space, managed)
    assert reader(OWNER, "cli") == (None, managed)


def test_ledger_reader_keeps_the_parse_of_an_unchanged_row(space):
    reader = LedgerReader(space)
    write_row(space, row(LedgerKind.INTERACTIVE))
    assert reader(OWNER, "cli")[0] is reader(OWNER, "cli")[0]


def test_ledger_reader_reports_a_corrupt_row_and_stays_bounded(space):
    reader = LedgerReader(space, capacity=2)
    for actor in ("a1", "a2", "a3"):
        write_row(space, row(LedgerKind.INTERACTIVE, actor=actor))
        assert reader(OWNER, actor)[0].actor == actor
    assert len(reader._rows) == 2
    path = row_path(space, LedgerKind.INTERACTIVE, OWNER, "a3")
    path.write_text("{broken")
    with pytest.raises(CodecError, match=f"ledger row {OWNER}.a3"):
        reader(OWNER, "a3")


def test_ledger_reader_sees_a_restore_that_keeps_size_and_mtime(space):
    # `cp -p` / `touch -r` put the old mtime back; only ctime tells the file changed.
    reader = LedgerReader(space)
    first = row(LedgerKind.INTERACTIVE)
    path = write_row(space, first)
    stamp = os.stat(path)
    assert reader(OWNER, "cli") == (first, None)
    regrant = row(LedgerKind.INTERACTIVE, lifecycle_uid="1" * 26)
    data = render_row(regrant)
    assert len(data) == stamp.st_size
    with open(path, "r+b") as f:  # in place: same inode, same size
        f.write(data)
    os.utime(path, ns=(stamp.st_atime_ns, stamp.st_mtime_ns))
    assert reader(OWNER, "cli") == (regrant, None)


def test_ledger_reader_recalls_the_last_read_of_each_principal_without_io(space):
    reader = LedgerReader(space, capacity=2)
    assert reader.recall(OWNER, "cli") is None  # never read
    first = row(LedgerKind.INTERACTIVE)
    write_row(space, first)
    assert reader.recall(OWNER, "cli") is None  # a write alone is not a read
    assert reader(OWNER, "cli") == (first, None)
    assert reader.recall(OWNER, "cli") == (first, None)
    remove_row(space, OWNER, "cli")
    assert reader.recall(OWNER, "cli") == (first, None)  # stale until the next read: by design
    assert reader(OWNER, "cli") == (None, None)
    assert reader.recall(OWNER, "cli") == (None, None)
    for actor in ("a1", "a2"):  # bounded: the oldest principal is forgotten
        reader(OWNER, actor)
    assert reader.recall(OWNER, "cli") is None
    assert reader.recall(OWNER, "a2") == (None, None)


def test_ledger_reader_forgets_a_principal_whose_read_fails(space):
    # A review finding: a corrupt row kept the earlier, granting rows recallable, so every
    # connect wrote an issuance row before the fresh read failed.
    reader = LedgerReader(space)
    path = write_row(space, row(LedgerKind.INTERACTIVE))
    assert reader(OWNER, "cli")[0] is not None
    path.write_text("{broken")
    with pytest.raises(CodecError):
        reader(OWNER, "cli")
    assert reader.recall(OWNER, "cli") is None
