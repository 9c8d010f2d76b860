"""state.files: atomic writes, modes, strict reads that never touch a corrupt file."""

from __future__ import annotations

import errno
import os
import stat

import pytest

from cotal_trio.core.errors import ConfigError
from cotal_trio.state import files


def _mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_atomic_write_leaves_no_temp_and_sets_modes(tmp_path):
    target = tmp_path / "a" / "b" / "secret.json"
    files.atomic_write(target, b"one")
    files.atomic_write(target, b"two")
    assert target.read_bytes() == b"two"
    assert _mode(target) == 0o600
    assert _mode(tmp_path / "a") == 0o700
    assert _mode(tmp_path / "a" / "b") == 0o700
    assert sorted(os.listdir(target.parent)) == ["secret.json"]


def test_atomic_write_mode_argument(tmp_path):
    target = tmp_path / "public.txt"
    files.atomic_write(target, b"x", mode=0o644)
    assert _mode(target) == 0o644


def test_ensure_dir_keeps_existing_modes(tmp_path):
    os.chmod(tmp_path, 0o755)
    files.ensure_dir(tmp_path / "new")
    assert _mode(tmp_path) == 0o755
    assert _mode(tmp_path / "new") == 0o700


def test_ensure_dir_refuses_a_file_in_the_way(tmp_path):
    (tmp_path / "f").write_text("x")
    with pytest.raises(ConfigError, match="not a folder"):
        files.ensure_dir(tmp_path / "f" / "sub")


def test_atomic_create_never_replaces(tmp_path):
    target = tmp_path / "key.json"
    assert files.atomic_create(target, b"first") is True
    assert files.atomic_create(target, b"second") is False
    assert target.read_bytes() == b"first"
    assert _mode(target) == 0o600
    assert os.listdir(tmp_path) == ["key.json"]


def test_write_json_shape(tmp_path):
    target = tmp_path / "x.json"
    files.write_json(target, {"b": 1, "a": {"d": [1], "c": None}})
    expected = '{\n  "a": {\n    "c": null,\n    "d": [\n      1\n    ]\n  },\n  "b": 1\n}\n'
    assert target.read_text() == expected
    assert files.read_json(target) == {"b": 1, "a": {"d": [1], "c": None}}


@pytest.mark.parametrize(
    ("content", "why"),
    [(b"{not json", "not JSON"), (b"[1, 2]", "not a JSON object"), (b"\xff\xfe", "not JSON")],
)
def test_corrupt_json_names_file_and_fix_and_is_untouched(tmp_path, content, why):
    target = tmp_path / "broker.json"
    target.write_bytes(content)
    with pytest.raises(ConfigError) as info:
        files.read_json(target)
    message = str(info.value)
    assert message.startswith(f"{target} is corrupt ({why}")
    assert message.endswith("- restore it from a backup or move the root aside and run `cotal up` again")
    assert target.read_bytes() == content


def test_missing_json_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="is missing"):
        files.read_json(tmp_path / "nope.json")


def test_read_fields_checks_version_and_types(tmp_path):
    target = tmp_path / "v.json"
    files.write_json(target, {"ver": 2})
    with pytest.raises(ConfigError, match=r"corrupt \(ver must be 1\)"):
        files.read_fields(target)
    files.write_json(target, {"ver": 1, "n": True, "items": [{"k": "v"}]})
    fields = files.read_fields(target)
    assert fields.get("items.0.k", str) == "v"
    with pytest.raises(ConfigError, match="n has the wrong type"):
        fields.get("n", int)
    with pytest.raises(ConfigError, match="items.1.k is missing"):
        fields.get("items.1.k", str)


def test_save_json_exclusive(tmp_path):
    target = tmp_path / "s.json"
    assert files.save_json(target, {"v": 1}, exclusive=True)
    assert not files.save_json(target, {"v": 2}, exclusive=True)
    assert files.read_json(target) == {"v": 1}
    assert files.save_json(target, {"v": 3})
    assert files.read_json(target) == {"v": 3}


def test_remove_quietly(tmp_path):
    target = tmp_path / "gone"
    target.write_text("x")
    assert files.remove_quietly(target) is True
    assert files.remove_quietly(target) is False


# --- a full disk names the file it could not write (issue 15 item 11) ----------------------------


def _full_disk_error() -> OSError:
    """The error a write into a full file system raises: /dev/full answers every write ENOSPC."""
    with open("/dev/full", "wb", buffering=0) as full:
        try:
            full.write(b"x")
        except OSError as exc:
            return exc
    raise AssertionError("/dev/full took a write")


def test_a_full_disk_error_gets_the_path_it_could_not_write(tmp_path):
    raw = _full_disk_error()
    assert raw.errno == errno.ENOSPC and raw.filename is None  # what the write alone says
    target = tmp_path / "actors" / "row.json"
    with pytest.raises(OSError) as named, files.naming(target):
        raise raw
    assert named.value.errno == errno.ENOSPC
    assert named.value.filename == str(target)
    assert str(named.value) == f"[Errno 28] No space left on device: '{target}'"


def test_an_error_that_names_its_file_already_is_left_alone(tmp_path):
    with pytest.raises(FileNotFoundError) as kept, files.naming(tmp_path / "other"):
        (tmp_path / "gone").read_bytes()
    assert kept.value.filename == str(tmp_path / "gone")


def test_atomic_write_on_a_full_disk_names_the_file_and_keeps_the_old_one(tmp_path, monkeypatch):
    """A full disk surfaces at fsync (delayed allocation): the error names the destination, the
    old file is intact and no temporary file is left behind."""
    target = tmp_path / "auth-service.json"
    target.write_bytes(b"old")

    def full(fd: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(files.os, "fsync", full)
    with pytest.raises(OSError) as failed:
        files.atomic_write(target, b"new")
    assert failed.value.errno == errno.ENOSPC and failed.value.filename == str(target)
    assert target.read_bytes() == b"old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["auth-service.json"]


def test_the_cli_says_which_file_a_full_disk_refused_and_the_fix():
    from cotal_trio.cli import _sentence

    sentence = _sentence(OSError(errno.ENOSPC, "No space left on device", "/r/.cotal/spaces.json.applied"))
    assert sentence == (
        "No space left on device (/r/.cotal/spaces.json.applied) - free space on that file system, then try again"
    )


@pytest.mark.parametrize(
    ("mode", "loose"),
    [(0o600, None), (0o400, None), (0o700, None), (0o644, 0o644), (0o640, 0o640), (0o604, 0o604), (0o666, 0o666)],
    ids=lambda value: f"{value:04o}" if isinstance(value, int) else str(value),
)
def test_open_to_others_names_the_mode_of_a_secret_group_or_others_may_read(tmp_path, mode, loose):
    path = tmp_path / "secret.json"
    files.atomic_write(path, b"{}")
    os.chmod(path, mode)
    assert files.open_to_others(path) == loose


def test_open_to_others_of_no_file_is_none(tmp_path):
    assert files.open_to_others(tmp_path / "absent.json") is None


def test_a_missing_file_of_a_space_names_cotal_space_add_and_one_of_the_root_cotal_up(tmp_path):
    # A restarted `cotal up` provisions only its own space, so "run `cotal up`" never brought back
    # another space's issuer.json (a new user found it): a space's file names `cotal space add`.
    root = tmp_path / "root"
    assert str(files.missing(root / "spaces" / "beta" / "issuer.json")) == (
        f"{root}/spaces/beta/issuer.json is missing - run `cotal space add beta --root {root}` to provision the space again"
    )
    assert str(files.missing(root / "broker.json")) == (
        f"{root}/broker.json is missing - run `cotal up` (or add the space again) to provision the root"
    )
    legacy = root / "spaces" / "space.62657461" / "issuer.json"  # an earlier version's folder name
    assert str(files.missing(legacy)).endswith("is missing - run `cotal up` (or add the space again) to provision the root")
