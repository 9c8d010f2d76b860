"""state.inventory: a space's offline secret inventory (spec "Offline secret inventory").

The root is provisioned with the code ``cotal up`` uses; expected public keys come from loading
the secrets here, in the test, which the inventory itself must never do.
"""

from __future__ import annotations

import builtins
import io
import os
import pathlib
import secrets
from pathlib import Path

import pytest

from cotal_trio.broker import provision
from cotal_trio.core.errors import ConfigError
from cotal_trio.state import (
    RootPaths,
    SecretInventory,
    SecretKey,
    SpaceMaterial,
    deprovision_secret_keys,
    load_space,
    read_json,
    write_json,
)
from cotal_trio.state.inventory import delete_secret_keys, shared_secret_locations, space_secret_locations

IAT = 1_800_000_000
SPACE = "alpha"
SEGMENT = "spaces/alpha"  # the space folder is its name


@pytest.fixture
def paths(tmp_path: Path) -> RootPaths:
    paths = RootPaths(tmp_path / "root")
    broker = provision.ensure_root(paths, iat=IAT)
    for space in (SPACE, "beta"):
        provision.ensure_space(paths, broker, space, iat=IAT)
    return paths


@pytest.fixture
def material(paths: RootPaths) -> SpaceMaterial:
    return load_space(paths.space(SPACE).callout_json, SPACE)


def _rows(paths: RootPaths, keys: tuple[SecretKey, ...]) -> list[tuple]:
    return [(k.kind, str(k.path.relative_to(paths.root)), k.field, k.exists, k.mode, k.public_key) for k in keys]


def _snapshot(root: Path) -> dict[str, tuple[bytes, int, int]]:
    """Every file under ``root``: (content, mode, mtime_ns)."""
    return {
        str(p.relative_to(root)): (p.read_bytes(), p.stat().st_mode, p.stat().st_mtime_ns)
        for p in sorted(root.rglob("*")) if p.is_file()
    }


def test_lists_exactly_the_space_keys_with_their_public_keys(paths, material):
    inventory = deprovision_secret_keys(paths, SPACE)
    assert inventory.space == SPACE
    assert inventory.segment == paths.root / SEGMENT
    assert _rows(paths, inventory.keys) == [
        ("auth-account-signing-key", f"{SEGMENT}/callout.json", "auth.signingSeed", True, 0o600,
         material.auth_signing.public_key),
        ("data-account-callout-signing-key", f"{SEGMENT}/callout.json", "data.calloutSigningSeed", True, 0o600,
         material.data_callout_signing.public_key),
        ("data-account-service-signing-key", f"{SEGMENT}/callout.json", "data.serviceSigningSeed", True, 0o600,
         material.data_service_signing.public_key),
        ("xkey", f"{SEGMENT}/callout.json", "xkeySeed", True, 0o600, material.xkey.public_key),
        ("callout-user", f"{SEGMENT}/callout.json", "calloutCreds", True, 0o600, material.callout_user),
        ("bearer-issuer-keys", f"{SEGMENT}/issuer.json", "keys.*.privateJwk", True, 0o600, None),
        ("owner-secret", f"{SEGMENT}/owner-secret.json", "secretB64", True, 0o600, None),
        ("capability", f"{SEGMENT}/auth-service.json", "cap", False, None, None),
    ]


def test_root_level_keys_are_listed_as_shared_not_as_the_space_s(paths):
    inventory = deprovision_secret_keys(paths, SPACE)
    assert _rows(paths, inventory.shared) == [
        ("operator-identity-key", "broker.json", "operator.seed", True, 0o600, None),
        ("operator-signing-key", "broker.json", "operator.signingSeed", True, 0o600, None),
        ("system-account-signing-key", "broker.json", "system.signingSeed", True, 0o600, None),
        ("system-user", "broker.json", "system.userCreds", True, 0o600, None),
        ("dev-idp-key", "devidp.json", "privateJwk", False, None, None),
    ]
    assert all(key.path.is_relative_to(inventory.segment) for key in inventory.keys)
    assert not any(key.path.is_relative_to(paths.spaces_dir) for key in inventory.shared)


def test_other_spaces_keys_are_not_listed(paths):
    listed = {key.path for key in deprovision_secret_keys(paths, SPACE).keys}
    assert not any(path.is_relative_to(paths.space("beta").dir) for path in listed)


def test_reads_no_secret_file_only_accounts_json(paths, monkeypatch):
    opened: list[str] = []

    def spy(real):
        def recording(file, *args, **kwargs):
            opened.append(os.fspath(file))
            return real(file, *args, **kwargs)
        return recording

    with monkeypatch.context() as patch:
        patch.setattr(builtins, "open", spy(builtins.open))
        patch.setattr(io, "open", spy(io.open))
        patch.setattr(os, "open", spy(os.open))
        patch.setattr(pathlib.Path, "open", spy(pathlib.Path.open))
        deprovision_secret_keys(paths, SPACE)
    assert set(opened) == {str(paths.space(SPACE).accounts_json)}


def test_deletes_and_changes_nothing(paths):
    write_json(paths.space(SPACE).auth_service_json, {"ver": 1, "cap": secrets.token_hex(32)})
    before = _snapshot(paths.root)
    deprovision_secret_keys(paths, SPACE)
    assert _snapshot(paths.root) == before


def test_capability_is_listed_while_a_lane_runs(paths):
    write_json(paths.space(SPACE).auth_service_json, {"ver": 1, "cap": secrets.token_hex(32)})
    capability = deprovision_secret_keys(paths, SPACE).keys[-1]
    assert (capability.kind, capability.exists, capability.mode) == ("capability", True, 0o600)


def test_reports_the_mode_it_finds(paths):
    os.chmod(paths.space(SPACE).owner_secret_json, 0o644)
    owner = next(k for k in deprovision_secret_keys(paths, SPACE).keys if k.kind == "owner-secret")
    assert owner.mode == 0o644


def test_without_accounts_json_no_public_key_is_known(paths):
    paths.space(SPACE).accounts_json.unlink()
    keys = deprovision_secret_keys(paths, SPACE).keys
    assert [k.public_key for k in keys] == [None] * 8
    assert [k.exists for k in keys] == [True] * 7 + [False]


def test_a_partly_provisioned_space_lists_its_missing_files(paths):
    sp = paths.space(SPACE)
    for path in (sp.callout_json, sp.accounts_json, sp.issuer_json):
        path.unlink()
    keys = deprovision_secret_keys(paths, SPACE).keys
    assert [(k.kind, k.exists) for k in keys] == [
        ("auth-account-signing-key", False), ("data-account-callout-signing-key", False),
        ("data-account-service-signing-key", False), ("xkey", False), ("callout-user", False),
        ("bearer-issuer-keys", False), ("owner-secret", True), ("capability", False),
    ]


def test_unknown_space_names_the_fix(paths):
    with pytest.raises(ConfigError) as info:
        deprovision_secret_keys(paths, "gamma")
    assert str(info.value) == f"space gamma is not in the root {paths.root} - see `cotal space list`"


@pytest.mark.parametrize("name", ["", "a.b", "x" * 65, "../alpha"])
def test_invalid_space_name_names_the_fix(paths, name):
    with pytest.raises(ConfigError) as info:
        deprovision_secret_keys(paths, name)
    assert str(info.value) == f"{name!r} is not a space name - use 1 to 64 letters, digits, _ and -"


def test_accounts_json_of_another_space_is_refused(paths):
    sp = paths.space(SPACE)
    write_json(sp.accounts_json, read_json(paths.space("beta").accounts_json))
    with pytest.raises(ConfigError) as info:
        deprovision_secret_keys(paths, SPACE)
    assert str(info.value) == (
        f"{sp.accounts_json} is corrupt (it belongs to space 'beta', not 'alpha') - restore it from "
        "a backup or move the root aside and run `cotal up` again"
    )


def test_a_public_key_of_the_wrong_role_is_refused(paths):
    sp = paths.space(SPACE)
    record = read_json(sp.accounts_json)
    record["auth"]["xkey"] = record["auth"]["calloutUser"]
    write_json(sp.accounts_json, record)
    with pytest.raises(ConfigError, match=r"accounts\.json is corrupt \(auth\.xkey: "):
        deprovision_secret_keys(paths, SPACE)


def test_locations_are_a_plan_without_io(tmp_path):
    paths = RootPaths(tmp_path / "nowhere")
    sp = paths.space(SPACE)
    assert [w.path.name for w in space_secret_locations(sp)] == [
        "callout.json"] * 5 + ["issuer.json", "owner-secret.json", "auth-service.json"]
    assert [w.path.name for w in shared_secret_locations(paths)] == ["broker.json"] * 4 + ["devidp.json"]
    assert not tmp_path.joinpath("nowhere").exists()


def test_an_inventory_never_holds_a_key_outside_its_segment(tmp_path):
    stray = SecretKey(kind="owner-secret", path=tmp_path / "elsewhere.json", field="secretB64",
                      exists=False, mode=None, public_key=None)
    with pytest.raises(ValueError, match="secret keys outside"):
        SecretInventory(space=SPACE, segment=tmp_path / SEGMENT, keys=(stray,), shared=())


def test_json_shape(paths, material):
    shape = deprovision_secret_keys(paths, SPACE).to_json()
    assert set(shape) == {"space", "segment", "keys", "shared", "aside"}
    assert shape["aside"] == []
    assert shape["keys"][0] == {
        "kind": "auth-account-signing-key", "path": str(paths.root / SEGMENT / "callout.json"),
        "field": "auth.signingSeed", "exists": True, "mode": "0600",
        "publicKey": material.auth_signing.public_key,
    }
    assert shape["keys"][-1]["mode"] is None


def test_a_reset_deletes_only_its_space_files(paths):
    """delete_secret_keys (issue 19 item 6): the space's three secret files go, beta's stay."""
    before = _snapshot(paths.root)
    done = delete_secret_keys(deprovision_secret_keys(paths, SPACE))
    assert [p.name for p in done.files] == ["owner-secret.json", "issuer.json", "callout.json"]
    assert len(done.keys) == 7 and done.aside == ()
    gone = {f"{SEGMENT}/{name}" for name in ("callout.json", "issuer.json", "owner-secret.json")}
    assert _snapshot(paths.root) == {k: v for k, v in before.items() if k not in gone}


def test_a_reset_refuses_a_symlinked_secret_file(paths, tmp_path):
    """Renaming a link would move the link and leave the secret where it points: nothing moves."""
    issuer = paths.space(SPACE).issuer_json
    target = tmp_path / "kept-issuer.json"
    os.rename(issuer, target)
    issuer.symlink_to(target)
    before = _snapshot(paths.root)
    with pytest.raises(ConfigError, match=f"^{issuer} is not a regular file - "):
        delete_secret_keys(deprovision_secret_keys(paths, SPACE))
    assert _snapshot(paths.root) == before
    assert issuer.is_symlink()


def test_an_inventory_never_lists_an_aside_folder_elsewhere(tmp_path):
    with pytest.raises(ValueError, match="secret keys outside"):
        SecretInventory(space=SPACE, segment=tmp_path / SEGMENT, keys=(), shared=(),
                        aside=(tmp_path / ".deprovision-x",))
