"""``cotal service install|render`` (issue 7 item 4, "Service units"; ``cli/service.py``).

The rendered units are compared line by line, and ``systemd-analyze verify`` must accept the
units written to ``tmp_path`` with no warning at all (their ``ExecStart`` is the real ``cotal``
script of this installation, which verify requires to exist). Where ``systemd-analyze`` is not
installed, the verify tests still check the written files and then skip, saying so; it is
installed in this project's environment (``/usr/bin/systemd-analyze``).
"""

from __future__ import annotations

import errno
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from cotal_trio.cli import main
from cotal_trio.cli.service import ExecUnit, cotal_script, render_unit, unwritable
from cotal_trio.core.errors import ConfigError

SERVER = "nats://127.0.0.1:4222"
VERIFY = shutil.which("systemd-analyze")


EMPTY_MANIFEST = '{"version": 2, "spaces": []}\n'


@pytest.fixture(autouse=True)
def _existing_paths(tmp_path, monkeypatch):
    """``install`` checks the root and the manifest it writes into the unit (issue 18 item 6):
    the tests run in ``tmp_path``, where the default root ``.cotal`` and ``m.json`` exist."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("COTAL_ROOT", raising=False)
    (tmp_path / ".cotal").mkdir()
    (tmp_path / "m.json").write_text(EMPTY_MANIFEST)


def cotal(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["service", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def verify(unit: Path) -> None:
    """``systemd-analyze verify`` accepts ``unit`` without a word (unknown keys only warn)."""
    if VERIFY is None:
        pytest.skip("systemd-analyze is not installed: the unit's text was checked, verify did not run")
    done = subprocess.run([VERIFY, "verify", str(unit)], capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stdout, done.stderr) == (0, "", ""), done


@pytest.mark.parametrize("kind", ["auth-service", "callout-replica"])
def test_the_unit_passes_the_operator_faces_port_on(capsys, tmp_path, kind):
    """Issue 18 item 8: a unit's process serves its operator face on the --ops-port given."""
    argv = ("render", kind, "--spaces", str(tmp_path / "m.json"), "--server", SERVER, "--root", str(tmp_path))
    code, out, _ = cotal(capsys, *argv, "--ops-port", "9464")
    [exec_start] = [line for line in out.splitlines() if line.startswith("ExecStart=")]
    assert code == 0 and exec_start.endswith(" --ops-port 9464")
    code, out, err = cotal(capsys, *argv, "--ops-port", "70000")  # a usage error (tests/cli/test_exit_codes.py)
    assert (code, out) == (64, "") and 'Invalid value "70000" for --ops-port.' in err


def test_the_auth_service_unit_has_the_exact_lines(capsys, tmp_path):
    manifest = tmp_path / "etc" / "spaces.json"
    code, out, err = cotal(
        capsys, "render", "auth-service", "--spaces", str(manifest), "--server", SERVER,
        "--root", str(tmp_path / "root"), "--watchdog", "10", "--auth-timeout", "1.5",
    )
    assert (code, err) == (0, "")
    assert out.splitlines()[1:] == [
        "[Unit]",
        f"Description=Cotal auth service (spaces of {manifest})",
        "After=network-online.target",
        "Wants=network-online.target",
        "",
        "[Service]",
        "Type=notify",
        "NotifyAccess=main",
        f"ExecStart={cotal_script()} service run auth-service --server {SERVER} --root {tmp_path / 'root'}"
        f" --spaces {manifest} --auth-timeout 1.5",
        "ExecReload=kill -HUP $MAINPID",
        "Restart=on-failure",
        "RestartSec=2",
        "TimeoutStartSec=90s",
        "WatchdogSec=10s",
        "KillSignal=SIGTERM",
        "",
        "[Install]",
        "WantedBy=multi-user.target",
    ]


def test_relative_paths_become_absolute(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("COTAL_ROOT", "state")
    _, out, _ = cotal(capsys, "render", "callout-replica", "--spaces", "spaces.json", "--server", SERVER)
    assert f"service run callout-replica --server {SERVER} --root {tmp_path / 'state'} --spaces {tmp_path / 'spaces.json'}\n" in out


def test_a_single_space_replica_unit(capsys, tmp_path):
    (tmp_path / "r").mkdir()
    code, out, _ = cotal(
        capsys, "install", "callout-replica", "--space", "a", "--server", SERVER, "--root", str(tmp_path / "r"),
        "--out", str(tmp_path),
    )
    unit = tmp_path / "cotal-callout-replica-a.service"
    assert code == 0 and f"✓ wrote {unit}" in out
    text = unit.read_text()
    assert f"ExecStart={cotal_script()} service run callout-replica --server {SERVER} --root {tmp_path / 'r'} --space a\n" in text
    assert "Description=Cotal callout replica (space a)\n" in text
    assert "ExecReload" not in text  # SIGHUP rereads a manifest; a single-space process has none
    assert "WatchdogSec" not in text
    assert unit.stat().st_mode & 0o777 == 0o644
    assert out.splitlines()[1:] == [
        "next:",
        f"  systemctl link {unit}",
        "  systemctl daemon-reload",
        f"  systemctl enable --now {unit.name}",
        f"  systemctl status {unit.name}     # STATUS: <n>/<m> lanes serving",
        f"  journalctl -u {unit.name} -f",
    ]
    verify(unit)


def test_systemd_analyze_verify_accepts_the_full_unit(capsys, tmp_path):
    """The full service with every flag it can carry, a root path that needs quoting and
    escaping (blank, ``%``, ``$``), and a watchdog."""
    root = tmp_path / "my root 100% $HOME"
    root.mkdir()
    out_file = tmp_path / "units" / "cotal-edge.service"
    out_file.parent.mkdir()  # --out's folder must exist (test_a_missing_unit_folder_is_one_sentence)
    code, _, err = cotal(
        capsys, "install", "auth-service", "--space", "a", "--server", SERVER, "--root", str(root),
        "--service-endpoints", "--exchange-public-port", "7451", "--exchange-public-url", "https://auth.example.com",
        "--exchange-trusted-proxy", "--advertised-server", "tls://nats.example.com:4222", "--watchdog", "5",
        "--start-timeout", "120", "--out", str(out_file),
    )
    assert (code, err) == (0, "")
    exec_start = next(line for line in out_file.read_text().splitlines() if line.startswith("ExecStart="))
    escaped = str(root).replace("%", "%%").replace("$", "$$")
    assert exec_start == (
        f'ExecStart={cotal_script()} service run auth-service --server {SERVER} --root "{escaped}" --space a'
        " --service-endpoints --exchange-public-port 7451 --exchange-public-url https://auth.example.com"
        " --exchange-trusted-proxy --advertised-server tls://nats.example.com:4222"
    )
    assert "TimeoutStartSec=120s\nWatchdogSec=5s\n" in out_file.read_text()
    verify(out_file)


def test_a_user_unit(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    code, out, _ = cotal(capsys, "install", "auth-service", "--spaces", "m.json", "--server", SERVER, "--user")
    unit = tmp_path / "config" / "systemd" / "user" / "cotal-auth-service.service"
    assert code == 0 and unit.read_text().endswith("[Install]\nWantedBy=default.target\n")
    assert "  systemctl --user enable --now cotal-auth-service.service" in out.splitlines()
    assert "  journalctl --user-unit cotal-auth-service.service -f" in out.splitlines()
    verify(unit)


def test_another_unit_is_not_overwritten_without_force(capsys, tmp_path):
    unit = tmp_path / "cotal-auth-service.service"
    unit.write_text("[Service]\nExecStart=/bin/true\n")
    argv = ("install", "auth-service", "--spaces", "m.json", "--server", SERVER, "--out", str(tmp_path))
    code, _, err = cotal(capsys, *argv)
    assert code == 1 and f"{unit} exists with other content" in err and "--force" in err
    assert unit.read_text() == "[Service]\nExecStart=/bin/true\n"
    assert cotal(capsys, *argv, "--force")[0] == 0
    assert "Type=notify" in unit.read_text()
    code, out, _ = cotal(capsys, *argv)  # the same unit again: fine, unchanged
    assert code == 0 and f"✓ {unit} is already this unit" in out


@pytest.mark.parametrize(("argv", "words"), [
    (("auth-service", "--server", SERVER), "pass exactly one of --space"),
    (("auth-service", "--spaces", "m", "--space", "a", "--server", SERVER), "pass exactly one of --space"),
    (("auth-service", "--spaces", "m", "--server", "http://x:1"), "is not a broker address"),
    (("auth-service", "--spaces", "m", "--server", SERVER, "--exchange-public-port", "7451"), "to --space only"),
    (("auth-service", "--spaces", "m", "--server", SERVER, "--watchdog", "0.5"), "--watchdog 0.5 is out of range"),
    (("auth-service", "--spaces", "m", "--server", SERVER, "--auth-timeout", "0.1"), "--auth-timeout 0.1 is out of range"),
    (("auth-service", "--spaces", "m", "--server", SERVER, "--name", "a@b"), "--name a@b is not a unit name"),
    (("auth-service", "--space", "no space", "--server", SERVER), "--space"),
    (("callout-replica", "--space", "a", "--server", SERVER, "--user", "--out", "x"), "--out and --user"),
    (("callout-replica", "--space", "a", "--server", SERVER, "--out", "x.conf"), "must be a folder or a .service file"),
])
def test_refused_flags_are_one_sentence(capsys, tmp_path, argv, words):
    code, out, err = cotal(capsys, "install", *argv)
    assert code == 1 and out == "" and words in err and err.startswith("cotal: ")
    assert sorted(p.name for p in tmp_path.iterdir()) == [".cotal", "m.json"]  # nothing written


def test_the_replica_refuses_full_service_flags(capsys):
    code = main(["service", "render", "callout-replica", "--space", "a", "--server", SERVER, "--service-endpoints"])
    assert code == 64  # a usage error (issue 18 item 7: cotal_trio/cli/exits.py)
    assert "--service-endpoints" in capsys.readouterr().err


def test_control_characters_are_refused():
    with pytest.raises(ConfigError, match="control character"):
        render_unit(ExecUnit(description="two\nlines", argv=("/bin/true",)))


def test_a_linked_unit_is_never_replaced_by_a_file(capsys, tmp_path):
    """``systemctl link FILE`` leaves a symlink in the unit folder: ``install`` (even with
    ``--force``) refuses to turn it into a plain file, and names the linked file to write."""
    linked = tmp_path / "src" / "cotal-auth-service.service"
    linked.parent.mkdir()
    linked.write_text("[Service]\nExecStart=/bin/true\n")
    units = tmp_path / "units"
    units.mkdir()
    (units / linked.name).symlink_to(linked)
    argv = ("install", "auth-service", "--spaces", "m.json", "--server", SERVER, "--out", str(units))
    for extra in ((), ("--force",)):
        code, out, err = cotal(capsys, *argv, *extra)
        assert (code, out) == (1, "")
        assert err == (
            f"cotal: {units / linked.name} is a symlink to {linked} (`systemctl link` makes these) - cotal does not"
            f" replace a link with a file: pass --out {linked} to write the linked unit, or remove the link"
            f" (`systemctl disable {linked.name}`) first\n"
        )
        assert (units / linked.name).is_symlink() and linked.read_text() == "[Service]\nExecStart=/bin/true\n"
    assert cotal(capsys, "install", "auth-service", "--spaces", "m.json", "--server", SERVER, "--out", str(linked),
                 "--force")[0] == 0  # the fix the sentence names
    assert (units / linked.name).is_symlink() and "Type=notify" in (units / linked.name).read_text()
    code, out, _ = cotal(capsys, *argv)  # through the link, the same unit: fine, unchanged
    assert code == 0 and f"✓ {units / linked.name} is already this unit" in out


def test_a_dangling_link_is_not_replaced_either(capsys, tmp_path):
    gone = tmp_path / "gone.service"
    (tmp_path / "cotal-auth-service.service").symlink_to(gone)
    code, _, err = cotal(capsys, "install", "auth-service", "--spaces", "m.json", "--server", SERVER, "--out", str(tmp_path))
    assert code == 1 and f"is a symlink to {gone}" in err
    assert not gone.exists()


def test_a_missing_unit_folder_is_one_sentence(capsys, tmp_path):
    folder = tmp_path / "no" / "such"
    code, out, err = cotal(
        capsys, "install", "auth-service", "--spaces", "m.json", "--server", SERVER, "--out", str(folder / "x.service"))
    assert (code, out) == (1, "")
    assert err == f"cotal: the folder {folder} does not exist - create it (mkdir -p {folder}) or pass --out an existing folder\n"
    assert not (tmp_path / "no").exists()


@pytest.mark.parametrize(("error", "sentence"), [
    (OSError(errno.EROFS, "Read-only file system"),
     "cannot write {path} (read-only file system) - pass --out a writable folder, then `systemctl link` the unit"),
    (PermissionError(errno.EACCES, "Permission denied"),
     "cannot write {path} (permission denied) - run as root, or pass --user or --out a folder you can write"),
    (OSError(errno.EPERM, "Operation not permitted"),
     "cannot write {path} (permission denied) - run as root, or pass --user or --out a folder you can write"),
    (OSError(errno.ENOSPC, "No space left on device"),
     "cannot write {path} (no space left on the device) - free some, or pass --out a folder on another device"),
    (OSError(errno.EIO, "Input/output error"),
     "cannot write {path} (Input/output error) - pass --out a folder you can write"),
])
def test_write_errors_name_the_fix(error, sentence):
    path = Path("/etc/systemd/system/cotal-auth-service.service")
    assert str(unwritable(path, error)) == sentence.format(path=path)


def test_a_read_only_file_system_is_one_sentence(tmp_path):
    """A real read-only mount (a private mount namespace, so nothing outside the child sees it)."""
    unshare = shutil.which("unshare")
    if unshare is None:
        pytest.skip("unshare (util-linux) is not installed: the read-only mount cannot be made")
    ro = tmp_path / "ro"
    ro.mkdir()
    mount = f"mount -t tmpfs -o ro tmpfs {ro} && exec \"$@\""
    cotal = [sys.executable, "-m", "cotal_trio", "service", "install", "auth-service", "--spaces", "m.json",
             "--server", SERVER, "--out", str(ro)]
    for prefix in ([unshare, "--mount"], [unshare, "--map-root-user", "--mount"]):
        done = subprocess.run([*prefix, "sh", "-c", mount, "sh", *cotal], capture_output=True, text=True, timeout=60)
        if "mount" not in done.stderr and "unshare" not in done.stderr:
            break
    else:
        pytest.skip(f"cannot mount a read-only tmpfs here (no mount namespace): {done.stderr.strip()}")
    unit = ro / "cotal-auth-service.service"
    assert (done.returncode, done.stdout) == (1, "")
    assert done.stderr == (
        f"cotal: cannot write {unit} (read-only file system) - pass --out a writable folder, then `systemctl link` the unit\n")


@pytest.mark.parametrize("kind", ["auth-service", "callout-replica"])
def test_render_checks_the_name_as_install_does(capsys, kind):
    """Found by the fresh-user check: `render --name ../evil` printed a unit install refuses."""
    serve = ("--spaces", "m") if kind == "auth-service" else ("--space", "a")
    code, out, err = cotal(capsys, "render", kind, *serve, "--server", SERVER, "--name", "../evil")
    assert (code, out) == (1, "") and err.startswith("cotal: --name ../evil is not a unit name")


def test_install_refuses_a_root_that_is_not_there(capsys, tmp_path):
    """Issue 18 item 6: the unit would start on a root that does not exist and serve nothing."""
    code, out, err = cotal(
        capsys, "install", "auth-service", "--spaces", "m.json", "--server", SERVER,
        "--root", str(tmp_path / "nosuch"), "--out", str(tmp_path),
    )
    assert (code, out) == (1, "")
    assert err == (
        f"cotal: the root {tmp_path / 'nosuch'} does not exist - pass the --root of an existing one "
        "(`cotal up` or `cotal space add --new-root` makes one); the unit would serve nothing\n"
    )
    assert list(tmp_path.glob("*.service")) == []


def test_install_refuses_a_manifest_that_is_not_there(capsys, tmp_path):
    code, out, err = cotal(
        capsys, "install", "callout-replica", "--spaces", "missing.json", "--server", SERVER, "--out", str(tmp_path),
    )
    assert (code, out) == (1, "")
    assert err == (
        f"cotal: --spaces {tmp_path / 'missing.json'} does not exist - write the manifest first"
        ' (an empty one is {"version": 2, "spaces": []}); the auth service refuses a missing one at start\n'
    )
    assert list(tmp_path.glob("*.service")) == []


def test_render_does_not_check_the_paths(capsys, tmp_path):
    """A rendered unit may be for another host: its paths are not this host's to check."""
    code, out, _ = cotal(
        capsys, "render", "auth-service", "--spaces", "elsewhere.json", "--server", SERVER,
        "--root", str(tmp_path / "elsewhere"),
    )
    assert code == 0 and f"--spaces {tmp_path / 'elsewhere.json'}" in out


def test_a_leaf_replica_unit_carries_its_callout_server(capsys, tmp_path):
    """A leaf node's replica (docs/deploy.md "Leaf nodes"): its callout on the leaf, its stores on --server."""
    leaf = "nats://127.0.0.1:4225"
    code, out, _ = cotal(capsys, "render", "callout-replica", "--space", "a", "--server", SERVER,
                         "--callout-server", f" {leaf} ,{leaf}", "--name", "callout-replica-leaf1")
    assert code == 0
    assert f"service run callout-replica --server {SERVER} --root {tmp_path / '.cotal'} --space a --callout-server {leaf}\n" in out
    code, _, err = cotal(capsys, "render", "callout-replica", "--space", "a", "--server", SERVER, "--callout-server", "a,,b")
    assert code != 0 and "--callout-server" in err
