"""The public-face flags of ``cotal up`` and ``cotal auth-service`` (issue 5 item 1): the
manifest's own rules, named by flag, one sentence, exit 1, nothing written; and how ``cotal
up`` records them in its own space's entry of ``<root>/spaces.json``.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from cotal_trio.broker.spaces import hosted_entries
from cotal_trio.cli import main
from cotal_trio.core.errors import ConfigError
from cotal_trio.core.manifest import SpaceEntry, render_manifest
from cotal_trio.service.embedded import UpConfig, prepare_root
from cotal_trio.state import IdpPinRecord, RootPaths, save_idp_pin

NEEDS_PORT = "needs --exchange-public-port - add the public listener's port or remove"
URL_FIX = '- pass the address clients reach, for example "https://auth.example"'
SERVER_FIX = '- pass the broker address remote agents dial, for example "wss://nats.example"'

# Refused by both commands, with the same sentence (the manifest's rules, named by flag). A port
# outside 1-65535 is a usage error (exit 64) before those rules: tests/cli/test_exit_codes.py.
BAD_FLAGS = [
    (["--exchange-public-port", "7451", "--exchange-public-url", "http://auth.example"],
     f'--exchange-public-url "http://auth.example" is not an https:// URL with a host {URL_FIX}'),
    (["--exchange-public-port", "7451", "--exchange-public-url", "https://"],
     f'--exchange-public-url "https://" is not an https:// URL with a host {URL_FIX}'),
    (["--exchange-public-port", "7451", "--advertised-server", "http://nats.example"],
     '--advertised-server "http://nats.example" is not a nats://, tls://, ws:// or wss:// URL with a host '
     + SERVER_FIX),
    (["--exchange-public-url", "https://auth.example"], f"--exchange-public-url {NEEDS_PORT} --exchange-public-url"),
    (["--exchange-trusted-proxy"], f"--exchange-trusted-proxy {NEEDS_PORT} --exchange-trusted-proxy"),
    (["--advertised-server", "wss://nats.example"], f"--advertised-server {NEEDS_PORT} --advertised-server"),
]


def _one_sentence(err: str, sentence: str) -> None:
    assert err.strip().splitlines() == [f"cotal: {sentence}"], err
    assert "Traceback" not in err


@pytest.mark.parametrize(("flags", "sentence"), BAD_FLAGS)
def test_up_refuses_a_bad_public_face_and_writes_nothing(tmp_path, capsys, flags, sentence):
    root = tmp_path / "root"
    assert main(["up", "--root", str(root), *flags]) == 1
    _one_sentence(capsys.readouterr().err, sentence)
    assert not root.exists()


@pytest.mark.parametrize(("flags", "sentence"), BAD_FLAGS)
def test_auth_service_refuses_a_bad_public_face(tmp_path, capsys, flags, sentence):
    argv = ["auth-service", "--space", "a", "--server", "nats://127.0.0.1:4222", "--root", str(tmp_path / "root")]
    assert main([*argv, *flags]) == 1
    _one_sentence(capsys.readouterr().err, sentence)
    assert not (tmp_path / "root").exists()


@pytest.mark.parametrize(("flags", "sentence"), [
    (["--exchange-public-port", "7451"],
     ("--exchange-public-port: a callout-only replica has no exchange, so it has no public face"
      " - drop --callout-only or that flag")),
    (["--exchange-public-url", "https://auth.example", "--exchange-trusted-proxy"],
     ("--exchange-public-url and --exchange-trusted-proxy: a callout-only replica has no exchange,"
      " so it has no public face - drop --callout-only or those flags")),
])
def test_a_replica_refuses_the_public_face(tmp_path, capsys, flags, sentence):
    argv = ["auth-service", "--callout-only", "--space", "a", "--server", "nats://127.0.0.1:4222"]
    assert main([*argv, "--root", str(tmp_path / "root"), *flags]) == 1
    _one_sentence(capsys.readouterr().err, sentence)


@pytest.mark.parametrize(("flags", "sentence"), [
    (["--exchange-public-port", "7451"],
     ('--exchange-public-port applies to --space only - with --spaces, set "exchangePublicPort" on the'
      " space's manifest entry instead")),
    (["--exchange-public-port", "7451", "--advertised-server", "wss://nats.example"],
     ("--exchange-public-port and --advertised-server apply to --space only - with --spaces, set"
      ' "exchangePublicPort" and "advertisedServer" on the space\'s manifest entry instead')),
])
def test_a_manifest_host_refuses_the_flags(tmp_path, capsys, flags, sentence):
    manifest = tmp_path / "spaces.json"
    manifest.write_bytes(render_manifest([]))
    argv = ["auth-service", "--spaces", str(manifest), "--server", "nats://127.0.0.1:4222"]
    assert main([*argv, "--root", str(tmp_path / "root"), *flags]) == 1
    _one_sentence(capsys.readouterr().err, sentence)


# --- cotal up: the flags live in its own space's manifest entry ------------------------------


def _prepare(paths: RootPaths, **public) -> SpaceEntry:
    prepare_root(UpConfig(paths=paths, space="alpha", **public), now=time.time())
    return next(e for e in hosted_entries(paths) if e.space == "alpha")


def test_up_records_the_face_in_its_entry_and_keeps_it_without_flags(tmp_path: Path):
    paths = RootPaths(tmp_path / "root")
    assert _prepare(paths) == SpaceEntry(space="alpha")
    face = {"exchange_public_port": 7451, "exchange_public_url": "https://auth.example", "exchange_trusted_proxy": True}
    assert _prepare(paths, **face) == SpaceEntry(space="alpha", **face)
    assert _prepare(paths) == SpaceEntry(space="alpha", **face)  # recorded, like --port
    # Any public flag replaces the face as a whole: the URL and the proxy flag are gone.
    assert _prepare(paths, exchange_public_port=7452) == SpaceEntry(space="alpha", exchange_public_port=7452)


def test_up_refuses_a_port_another_space_has(tmp_path: Path, capsys):
    paths = RootPaths(tmp_path / "root")
    paths.root.mkdir(mode=0o700)
    paths.spaces_manifest.write_bytes(render_manifest([SpaceEntry(space="beta", exchange_public_port=7451)]))
    before = paths.spaces_manifest.read_bytes()
    with pytest.raises(ConfigError) as refused:
        _prepare(paths, exchange_public_port=7451)
    assert str(refused.value) == (
        f"--exchange-public-port 7451 is space beta's public port in {paths.spaces_manifest} - pass another port"
    )
    assert paths.spaces_manifest.read_bytes() == before


def test_a_refused_up_does_not_record_the_face(tmp_path: Path):
    """A review finding: the face was written into the entry before the IdP pin was checked, so
    a refused `cotal up` (here: a changed pin) left a face that never served recorded."""
    paths = RootPaths(tmp_path / "root")
    assert _prepare(paths) == SpaceEntry(space="alpha")
    dev = IdpPinRecord(kind="dev", url="", issuer="urn:cotal:dev-idp:000000000000", audience="cotal-dev", jwks_uri="")
    save_idp_pin(paths.space("alpha").idp_json, dev)  # pinned, as a first `cotal up` leaves it
    before = paths.spaces_manifest.read_bytes()
    face = {"exchange_public_port": 7451, "exchange_public_url": "https://auth.example"}
    with pytest.raises(ConfigError, match="pin"):
        _prepare(paths, idp_url="https://idp.example", **face)
    assert paths.spaces_manifest.read_bytes() == before


def test_an_up_whose_broker_cannot_start_does_not_record_the_face(tmp_path: Path, capsys):
    """The same, when the failure comes after the root is prepared: no nats-server there."""
    paths = RootPaths(tmp_path / "root")
    assert _prepare(paths) == SpaceEntry(space="alpha")
    before = paths.spaces_manifest.read_bytes()
    argv = ["up", "--root", str(paths.root), "--space", "alpha", "--nats-server", str(tmp_path / "no-such-nats-server"),
            "--exchange-public-port", "7451"]  # fmt: skip
    assert main(argv) == 1
    assert "Traceback" not in capsys.readouterr().err
    assert paths.spaces_manifest.read_bytes() == before


@pytest.mark.parametrize(
    ("flags", "sentence"),
    [
        ({"port": 4333, "exchange_public_port": 4333},
         "--exchange-public-port 4333 is the broker's port (--port) - pass another port"),
        ({"http_port": 7452, "exchange_public_port": 7452},
         "--exchange-public-port 7452 is the loopback exchange's port (--http-port) - pass another port"),
    ],
)
def test_up_refuses_a_public_port_it_uses_itself(tmp_path: Path, flags, sentence):
    """A fresh-user finding: the same port as --port started the broker, then failed the lane
    with "port 4333 is busy" (held by our own broker) after a "retrying" line."""
    paths = RootPaths(tmp_path / "root")
    assert _prepare(paths) == SpaceEntry(space="alpha")
    before = paths.spaces_manifest.read_bytes()
    with pytest.raises(ConfigError) as refused:
        _prepare(paths, **flags)
    assert str(refused.value) == sentence
    assert paths.spaces_manifest.read_bytes() == before


PUBLIC_FACE_FLAGS = ("--exchange-public-port", "--exchange-public-url", "--exchange-trusted-proxy", "--advertised-server")
PUBLIC_FACE_COMMANDS = (("up",), ("auth-service",), ("service", "install", "auth-service"), ("service", "render", "auth-service"))


def _public_face_help(command: tuple[str, ...]) -> list[str]:
    """The reference's lines of the four public-face flags under ``cotal <command>`` (docs/cli.md)."""
    from cotal_trio.cli.reference import render

    section = render().split(f"# cotal {' '.join(command)}\n", 1)[1].split("\n#", 1)[0]
    return [line for line in section.splitlines() if line.startswith(tuple(f"* `{flag} " for flag in PUBLIC_FACE_FLAGS))
            or line.startswith("* `--exchange-trusted-proxy,")]  # fmt: skip


def test_the_public_face_flags_are_declared_once():
    """Issue 16: one flag group (cli/common.py PublicFaceFlags) for every command that takes the
    public face, so the four flags read the same in each command's reference; they were declared
    three times in cli/ with three wordings."""
    helps = {command: _public_face_help(command) for command in PUBLIC_FACE_COMMANDS}
    assert [len(lines) for lines in helps.values()] == [4, 4, 4, 4], helps
    assert len({tuple(lines) for lines in helps.values()}) == 1, helps


# --- cotal up --service-endpoints: recorded in the same entry (issue 19 item 1) --------------


def test_up_records_service_endpoints_in_its_entry_and_keeps_it_without_the_flag(tmp_path: Path):
    paths = RootPaths(tmp_path / "root")
    assert _prepare(paths) == SpaceEntry(space="alpha")
    assert _prepare(paths, service_endpoints=True) == SpaceEntry(space="alpha", service_endpoints=True)
    assert _prepare(paths) == SpaceEntry(space="alpha", service_endpoints=True)  # recorded, like the face
    # the public-face flags replace the face alone, never the service-endpoint setting
    face = SpaceEntry(space="alpha", exchange_public_port=7451, service_endpoints=True)
    assert _prepare(paths, exchange_public_port=7451) == face


def test_up_no_service_endpoints_clears_the_recorded_setting(tmp_path: Path):
    """`cotal up --no-service-endpoints` (its --help lists it) closes the doors: it records
    ``serviceEndpoints`` false, where it used to keep the true one silently; the admission stays
    open (docs/http-api.md "Service endpoints")."""
    paths = RootPaths(tmp_path / "root")
    assert _prepare(paths, service_endpoints=True) == SpaceEntry(space="alpha", service_endpoints=True)
    assert _prepare(paths, service_endpoints=False) == SpaceEntry(space="alpha")
    assert _prepare(paths) == SpaceEntry(space="alpha")


def test_up_passes_service_endpoints_to_its_space(tmp_path: Path, monkeypatch, capsys):
    """`cotal up --service-endpoints` reaches the space's UpConfig, as the public-face flags do."""
    import cotal_trio.cli.up as up_command

    seen: list[UpConfig] = []

    async def run_up(config, *, task_status=None):
        seen.append(config)
        raise ConfigError("stopped by the test before serving")

    monkeypatch.setattr(up_command, "run_up", run_up)
    monkeypatch.setattr(up_command, "nats_server_version", lambda exe: "v2.15.1")
    argv = ["up", "--root", str(tmp_path / "root"), "--nats-server", "/bin/true", "--exchange-public-port", "7451"]
    assert main([*argv, "--service-endpoints"]) == 1
    assert main(argv) == 1
    assert main([*argv, "--no-service-endpoints"]) == 1
    assert [(c.service_endpoints, c.exchange_public_port) for c in seen] == [(True, 7451), (None, 7451), (False, 7451)]
    assert "Traceback" not in capsys.readouterr().err


def test_service_run_refuses_one_port_for_the_operator_and_public_faces(tmp_path, capsys):
    """--ops-port and --exchange-public-port on one port: refused before anything starts (the
    lane used to fail on its own operator face's port, "busy - stop whatever holds it")."""
    argv = ["service", "run", "auth-service", "--space", "a", "--server", "nats://127.0.0.1:4222",
            "--root", str(tmp_path / "root"), "--ops-port", "7451", "--exchange-public-port", "7451"]  # fmt: skip
    assert main(argv) == 1
    _one_sentence(
        capsys.readouterr().err,
        "--ops-port 7451 and --exchange-public-port 7451 are the same port - give each listener its own port",
    )
    assert not (tmp_path / "root").exists()
