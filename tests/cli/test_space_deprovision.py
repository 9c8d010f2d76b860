"""``cotal space deprovision`` (cotal_trio/cli/space.py): only ``--dry-run`` is built.

The root is the provisioned test root of ``conftest.py`` (space ``default``, a dev IdP); no
broker runs, since the inventory is offline.
"""

from __future__ import annotations

import json
from pathlib import Path

from cotal_trio.cli import main
from cotal_trio.state import load_space

from tests.support.cli_root import SPACE, Root

SEGMENT = "spaces/default"  # the space folder is its name
REFUSAL = (
    "cotal: deprovisioning a space is not built yet - run `cotal space deprovision default --dry-run`"
    " to list its secret keys\n"
)


def _snapshot(root: Path) -> dict[str, tuple[bytes, int, int]]:
    """Every file under ``root``: (content, mode, mtime_ns)."""
    return {
        str(p.relative_to(root)): (p.read_bytes(), p.stat().st_mode, p.stat().st_mtime_ns)
        for p in sorted(root.rglob("*")) if p.is_file()
    }


def _public(root: Root) -> dict[str, str]:
    material = load_space(root.space.callout_json, SPACE)
    return {
        "auth-account-signing-key": material.auth_signing.public_key,
        "data-account-callout-signing-key": material.data_callout_signing.public_key,
        "data-account-service-signing-key": material.data_service_signing.public_key,
        "xkey": material.xkey.public_key,
        "callout-user": material.callout_user,
    }


def test_dry_run_prints_the_inventory(root: Root, capsys):
    pub = _public(root)
    code, out, err = root.run(capsys, "space", "deprovision", SPACE, "--dry-run")
    assert (code, err) == (0, "")
    assert out.splitlines() == [
        (f"space default: 7 secret keys on disk, 8 places in {root.paths.root / SEGMENT}"
         " (dry run: no secret read, nothing deleted)"),
        "kind\tfile\tfield\tmode\tpublic key",
        f"auth-account-signing-key\t{SEGMENT}/callout.json\tauth.signingSeed\t0600\t{pub['auth-account-signing-key']}",
        (f"data-account-callout-signing-key\t{SEGMENT}/callout.json\tdata.calloutSigningSeed\t0600\t"
         f"{pub['data-account-callout-signing-key']}"),
        (f"data-account-service-signing-key\t{SEGMENT}/callout.json\tdata.serviceSigningSeed\t0600\t"
         f"{pub['data-account-service-signing-key']}"),
        f"xkey\t{SEGMENT}/callout.json\txkeySeed\t0600\t{pub['xkey']}",
        f"callout-user\t{SEGMENT}/callout.json\tcalloutCreds\t0600\t{pub['callout-user']}",
        f"bearer-issuer-keys\t{SEGMENT}/issuer.json\tkeys.*.privateJwk\t0600\t-",
        f"owner-secret\t{SEGMENT}/owner-secret.json\tsecretB64\t0600\t-",
        f"capability\t{SEGMENT}/auth-service.json\tcap\tmissing\t-",
        "shared by every space of the root (not this space's to delete):",
        "operator-identity-key\tbroker.json\toperator.seed\t0600\t-",
        "operator-signing-key\tbroker.json\toperator.signingSeed\t0600\t-",
        "system-account-signing-key\tbroker.json\tsystem.signingSeed\t0600\t-",
        "system-user\tbroker.json\tsystem.userCreds\t0600\t-",
        "dev-idp-key\tdevidp.json\tprivateJwk\t0600\t-",
    ]


def test_dry_run_json(root: Root, capsys):
    pub = _public(root)
    code, out, err = root.run(capsys, "space", "deprovision", SPACE, "--dry-run", "--json")
    assert (code, err) == (0, "")
    segment = root.paths.root / SEGMENT

    def entry(kind, path, field, *, mode="0600", public=None):
        return {"kind": kind, "path": str(path), "field": field, "exists": mode is not None,
                "mode": mode, "publicKey": public}

    callout = segment / "callout.json"
    broker = root.paths.broker_json
    assert json.loads(out) == {
        "space": SPACE,
        "segment": str(segment),
        "keys": [
            entry("auth-account-signing-key", callout, "auth.signingSeed", public=pub["auth-account-signing-key"]),
            entry("data-account-callout-signing-key", callout, "data.calloutSigningSeed",
                  public=pub["data-account-callout-signing-key"]),
            entry("data-account-service-signing-key", callout, "data.serviceSigningSeed",
                  public=pub["data-account-service-signing-key"]),
            entry("xkey", callout, "xkeySeed", public=pub["xkey"]),
            entry("callout-user", callout, "calloutCreds", public=pub["callout-user"]),
            entry("bearer-issuer-keys", segment / "issuer.json", "keys.*.privateJwk"),
            entry("owner-secret", segment / "owner-secret.json", "secretB64"),
            entry("capability", segment / "auth-service.json", "cap", mode=None),
        ],
        "shared": [
            entry("operator-identity-key", broker, "operator.seed"),
            entry("operator-signing-key", broker, "operator.signingSeed"),
            entry("system-account-signing-key", broker, "system.signingSeed"),
            entry("system-user", broker, "system.userCreds"),
            entry("dev-idp-key", root.paths.devidp_json, "privateJwk"),
        ],
    }


def test_dry_run_changes_nothing(root: Root, capsys):
    before = _snapshot(root.paths.root)
    for flags in (("--dry-run",), ("--dry-run", "--json")):
        code, _, _ = root.run(capsys, "space", "deprovision", SPACE, *flags)
        assert code == 0
    assert _snapshot(root.paths.root) == before


def test_without_dry_run_refuses_and_changes_nothing(root: Root, capsys):
    before = _snapshot(root.paths.root)
    for flags in ((), ("--json",)):
        assert root.run(capsys, "space", "deprovision", SPACE, *flags) == (1, "", REFUSAL)
    assert _snapshot(root.paths.root) == before


def test_refusal_comes_before_any_root_check(tmp_path, capsys):
    capsys.readouterr()
    code = main(["space", "deprovision", SPACE, "--root", str(tmp_path / "absent")])
    assert (code, *capsys.readouterr()) == (1, "", REFUSAL)
    assert not (tmp_path / "absent").exists()


def test_unknown_space(root: Root, capsys):
    code, out, err = root.run(capsys, "space", "deprovision", "gamma", "--dry-run")
    assert (code, out) == (1, "")
    assert err == f"cotal: space gamma is not in the root {root.paths.root} - see `cotal space list`\n"


def test_invalid_space_name(root: Root, capsys):
    code, out, err = root.run(capsys, "space", "deprovision", "no.dots", "--dry-run")
    assert (code, out, err) == (1, "", "cotal: 'no.dots' is not a space name - use 1 to 64 letters, digits, _ and -\n")
