"""``cotal space deprovision`` (cotal_trio/cli/space.py): ``--dry-run`` lists, ``--yes`` deletes.

Spec "Offline secret inventory" (issue 5 item 8, issue 19 item 6). The root is the provisioned
test root of ``conftest.py`` (space ``default``, a dev IdP, in no manifest); no broker runs for
the offline tests. The live test at the end runs a real nats-server holding a space's accounts.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import trio

from cotal_trio.broker.config import write_config
from cotal_trio.broker.process import free_port, run_nats_server
from cotal_trio.broker.spaces import set_hosted
from cotal_trio.cli import main
from cotal_trio.core.manifest import LaneStatus, format_utc, render_applied
from cotal_trio.state import load_space, write_json
from cotal_trio.state.applied import applied_path

from tests.support.cli_root import SPACE, Root, cotal

SEGMENT = "spaces/default"  # the space folder is its name
REFUSAL = (
    "cotal: deprovisioning deletes space default's secret keys for good - list them with `cotal space"
    " deprovision default --dry-run`, then pass --yes to delete them\n"
)
SECRET_FILES = ("callout.json", "issuer.json", "owner-secret.json")  # auth-service.json: only while a lane runs


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
        "aside": [],
    }


def test_dry_run_changes_nothing(root: Root, capsys):
    before = _snapshot(root.paths.root)
    for flags in (("--dry-run",), ("--dry-run", "--json")):
        code, _, _ = root.run(capsys, "space", "deprovision", SPACE, *flags)
        assert code == 0
    assert _snapshot(root.paths.root) == before


def test_without_yes_or_dry_run_refuses_and_changes_nothing(root: Root, capsys):
    before = _snapshot(root.paths.root)
    for flags in ((), ("--json",)):
        assert root.run(capsys, "space", "deprovision", SPACE, *flags) == (1, "", REFUSAL)
    assert _snapshot(root.paths.root) == before


def test_dry_run_and_yes_together_are_refused(root: Root, capsys):
    before = _snapshot(root.paths.root)
    assert root.run(capsys, "space", "deprovision", SPACE, "--dry-run", "--yes") == (1, "", (
        "cotal: pass --dry-run or --yes, not both - `cotal space deprovision default --dry-run` lists the"
        " secret keys, and `cotal space deprovision default --yes` deletes them for good\n"))
    assert _snapshot(root.paths.root) == before


def _dead_pid() -> int:
    """The pid of a process that has exited and been reaped."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def _rows(root: Root, pub: dict[str, str]) -> list[str]:
    """The deleted-key rows of the --yes output, inventory order."""
    return [
        f"auth-account-signing-key\t{SEGMENT}/callout.json\tauth.signingSeed\t{pub['auth-account-signing-key']}",
        (f"data-account-callout-signing-key\t{SEGMENT}/callout.json\tdata.calloutSigningSeed\t"
         f"{pub['data-account-callout-signing-key']}"),
        (f"data-account-service-signing-key\t{SEGMENT}/callout.json\tdata.serviceSigningSeed\t"
         f"{pub['data-account-service-signing-key']}"),
        f"xkey\t{SEGMENT}/callout.json\txkeySeed\t{pub['xkey']}",
        f"callout-user\t{SEGMENT}/callout.json\tcalloutCreds\t{pub['callout-user']}",
        f"bearer-issuer-keys\t{SEGMENT}/issuer.json\tkeys.*.privateJwk\t-",
        f"owner-secret\t{SEGMENT}/owner-secret.json\tsecretB64\t-",
    ]


def test_yes_deletes_exactly_the_listed_files(root: Root, capsys):
    """A stale auth-service.json (its lane killed) holds a capability: it goes too; nothing else
    changes, byte for byte and mtime for mtime."""
    pub = _public(root)
    write_json(root.space.auth_service_json, {"ver": 1, "url": "http://127.0.0.1:1", "pid": _dead_pid(), "cap": "0" * 64})
    before = _snapshot(root.paths.root)
    code, out, err = root.run(capsys, "space", "deprovision", SPACE, "--yes")
    segment = root.paths.root / SEGMENT
    assert (code, err) == (0, "")
    assert out.splitlines() == [
        f"space default: deleted 8 secret keys in 4 files from {segment}",
        "kind\tfile\tfield\tpublic key",
        *_rows(root, pub),
        f"capability\t{SEGMENT}/auth-service.json\tcap\t-",
        (f"its other files stay (no secret in them); to add a space named default again with new keys,"
         f" move {segment} aside first"),
    ]
    gone = {f"{SEGMENT}/{name}" for name in (*SECRET_FILES, "auth-service.json")}
    assert _snapshot(root.paths.root) == {k: v for k, v in before.items() if k not in gone}
    assert sorted(p.name for p in segment.iterdir()) == ["accounts.json", "idp.json", "sentinel.creds"]


def test_yes_json_and_a_rerun_deletes_nothing(root: Root, capsys):
    pub = _public(root)
    code, out, err = root.run(capsys, "space", "deprovision", SPACE, "--yes", "--json")
    assert (code, err) == (0, "")
    segment = root.paths.root / SEGMENT
    kinds = [row.split("\t") for row in _rows(root, pub)]
    assert json.loads(out) == {
        "space": SPACE, "segment": str(segment),
        "deleted": [{"kind": kind, "path": str(root.paths.root / file), "field": field,
                     "publicKey": None if public == "-" else public} for kind, file, field, public in kinds],
        "files": [str(segment / name) for name in reversed(SECRET_FILES)],  # callout.json last
        "aside": [],
    }
    after = _snapshot(root.paths.root)
    assert root.run(capsys, "space", "deprovision", SPACE, "--yes") == (
        0, f"space default: no secret key on disk in {segment} - nothing to delete\n", "")
    assert _snapshot(root.paths.root) == after


def test_refused_while_the_manifest_lists_the_space(root: Root, capsys):
    set_hosted(root.paths, SPACE, True)
    before = _snapshot(root.paths.root)
    assert root.run(capsys, "space", "deprovision", SPACE, "--yes") == (1, "", (
        f"cotal: space default is still in the manifest {root.paths.spaces_manifest} - run `cotal space"
        " remove default` first (it stops the lane and deletes the space's accounts on the broker)\n"))
    assert _snapshot(root.paths.root) == before


def test_refused_while_the_manifest_is_refused(root: Root, capsys):
    root.paths.spaces_manifest.write_text('{"version": 2, "spaces": [{"spac": "x"}]}')
    before = _snapshot(root.paths.root)
    code, out, err = root.run(capsys, "space", "deprovision", SPACE, "--yes")
    assert (code, out) == (1, "")
    assert err.startswith(f"cotal: cannot tell whether space default is still hosted: {root.paths.spaces_manifest} is refused (")
    assert _snapshot(root.paths.root) == before


def test_refused_while_a_host_still_runs_its_lane(root: Root, capsys):
    """`cotal space remove` took it out of spaces.json, but the live host has not stopped the lane yet."""
    set_hosted(root.paths, "other", True)  # a manifest without the space
    applied = render_applied(manifest_sha256=None, applied_at=format_utc(time.time()),
                             spaces={SPACE: LaneStatus(state="serving")}, refused=None, pid=os.getpid())
    applied_path(root.paths.spaces_manifest).write_bytes(applied)
    before = _snapshot(root.paths.root)
    assert root.run(capsys, "space", "deprovision", SPACE, "--yes") == (1, "", (
        f"cotal: a lane of space default still runs in the host pid {os.getpid()}"
        f" ({applied_path(root.paths.spaces_manifest)}) - wait until it stops (`cotal status` shows it),"
        " or stop that host\n"))
    assert _snapshot(root.paths.root) == before


def test_refused_while_an_auth_service_serves_it(root: Root, capsys):
    """A full lane of a host on another manifest (or `--space`) writes the space's auth-service.json."""
    write_json(root.space.auth_service_json, {"ver": 1, "url": "http://127.0.0.1:1", "pid": os.getpid(), "cap": "0" * 64})
    before = _snapshot(root.paths.root)
    assert root.run(capsys, "space", "deprovision", SPACE, "--yes") == (1, "", (
        f"cotal: space default is still served by pid {os.getpid()} ({root.space.auth_service_json})"
        " - stop that auth service first\n"))
    assert _snapshot(root.paths.root) == before


def test_a_failed_move_puts_every_file_back(root: Root):
    """callout.json moves last; a bind mount over it (a private mount namespace) makes its rename
    fail with EBUSY after the other two moved: both come back, nothing is half-deleted."""
    unshare = shutil.which("unshare")
    if unshare is None:
        pytest.skip("unshare (util-linux) is not installed: the busy mount cannot be made")
    before = _snapshot(root.paths.root)
    callout = root.space.callout_json
    mount = f'mount --bind "$0" "$0" && exec "$@"'
    cotal_argv = [sys.executable, "-m", "cotal_trio", "space", "deprovision", SPACE, "--yes",
                  "--root", str(root.paths.root)]
    for prefix in ([unshare, "--mount"], [unshare, "--map-root-user", "--mount"]):
        done = subprocess.run([*prefix, "sh", "-c", mount, str(callout), *cotal_argv],
                              capture_output=True, text=True, timeout=60)
        if "mount" not in done.stderr and "unshare" not in done.stderr:
            break
    else:
        pytest.skip(f"cannot bind-mount here (no mount namespace): {done.stderr.strip()}")
    assert (done.returncode, done.stdout) == (1, "")
    assert done.stderr == (f"cotal: moving {callout} aside failed (Device or resource busy) - nothing was"
                           " deleted (every file is back in place); fix that and run the reset again\n")
    assert _snapshot(root.paths.root) == before
    assert not [p for p in root.space.dir.iterdir() if p.name.startswith(".deprovision-")]


def test_an_interrupted_reset_is_finished_by_a_rerun(root: Root, capsys):
    """A reset killed after moving issuer.json aside: the dry run names the folder, a rerun deletes it."""
    segment = root.paths.root / SEGMENT
    aside = segment / ".deprovision-x1"
    aside.mkdir(mode=0o700)
    os.rename(root.space.issuer_json, aside / "issuer.json")
    code, out, _ = root.run(capsys, "space", "deprovision", SPACE, "--dry-run")
    assert code == 0
    assert out.splitlines()[-1] == f"left by an interrupted reset (--yes deletes it too): {SEGMENT}/.deprovision-x1"
    before = _snapshot(root.paths.root)
    code, out, err = root.run(capsys, "space", "deprovision", SPACE, "--yes")
    assert (code, err) == (0, "")
    lines = out.splitlines()
    assert lines[0] == f"space default: deleted 6 secret keys in 2 files from {segment}"
    assert lines[-2] == f"also deleted {SEGMENT}/.deprovision-x1 (left by an interrupted reset)"
    gone = {f"{SEGMENT}/callout.json", f"{SEGMENT}/owner-secret.json", f"{SEGMENT}/.deprovision-x1/issuer.json"}
    assert _snapshot(root.paths.root) == {k: v for k, v in before.items() if k not in gone}
    assert sorted(p.name for p in segment.iterdir()) == ["accounts.json", "idp.json", "sentinel.creds"]


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


async def test_refused_while_the_broker_holds_its_accounts(operator_broker, provisioned, capsys):
    """A real nats-server: a space out of spaces.json but with its accounts still pushed is
    refused (a replica anywhere may still answer for them); after `cotal space remove` it goes."""
    url, paths = operator_broker, provisioned.paths
    root = ("--root", str(paths.root), "--server", url)
    with trio.fail_after(30):
        assert (await cotal(capsys, "space", "add", "b", *root))[0] == 0
        await trio.to_thread.run_sync(set_hosted, paths, "b", False)  # the manifest edited by hand
        before = _snapshot(paths.root)
        assert await cotal(capsys, "space", "deprovision", "b", "--yes", *root) == (1, "", (
            f"cotal: the broker at {url} still holds space b's accounts - run `cotal space remove b`"
            " first (it deletes them once the lane stops)\n"))
        assert _snapshot(paths.root) == before
        assert (await cotal(capsys, "space", "remove", "b", *root))[0] == 0
        code, out, err = await cotal(capsys, "space", "deprovision", "b", "--yes", *root)
    assert (code, err) == (0, "")
    assert out.splitlines()[0] == f"space b: deleted 7 secret keys in 3 files from {paths.space('b').dir}"
    assert not any(paths.space("b").dir.joinpath(name).exists() for name in SECRET_FILES)
    assert paths.space("demo").callout_json.exists()


async def test_a_stopped_broker_is_checked_by_its_resolver_folder(provisioned, nats_server_bin, capsys):
    """With no broker answering, the root's own broker's resolver folder tells: a pushed account
    is ``<account>.jwt`` there (refused), a deleted one ``<account>.jwt.deleted`` (a real
    nats-server wrote both, started and stopped here)."""
    paths, port = provisioned.paths, free_port()
    config = write_config(paths, provisioned.broker, port=port, auth_timeout_s=2)
    url = f"nats://127.0.0.1:{port}"
    run = functools.partial(run_nats_server, config, executable=nats_server_bin, log_path=paths.broker_log, port=port)

    async def with_broker(*argv: str) -> tuple[int, str, str]:
        async with trio.open_nursery() as nursery:
            with trio.fail_after(30):
                await nursery.start(run)
                done = await cotal(capsys, *argv, "--root", str(paths.root), "--server", url)
            nursery.cancel_scope.cancel()
        return done

    assert (await with_broker("space", "add", "b"))[0] == 0
    await trio.to_thread.run_sync(set_hosted, paths, "b", False)
    auth = load_space(paths.space("b").callout_json, "b").auth_account
    before = _snapshot(paths.root)
    assert await cotal(capsys, "space", "deprovision", "b", "--yes", "--root", str(paths.root)) == (1, "", (
        f"cotal: the root's broker, which is not running, still holds space b's accounts"
        f" ({paths.resolver_dir / (auth + '.jwt')}) - start it (`cotal up`), then run `cotal space remove b`\n"))
    assert _snapshot(paths.root) == before
    assert (await with_broker("space", "remove", "b"))[0] == 0
    assert (paths.resolver_dir / f"{auth}.jwt.deleted").exists()
    code, out, err = await cotal(capsys, "space", "deprovision", "b", "--yes", "--root", str(paths.root))
    assert (code, err) == (0, "")
    assert out.splitlines()[0] == f"space b: deleted 7 secret keys in 3 files from {paths.space('b').dir}"
