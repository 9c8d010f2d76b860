"""``cotal space add/remove/list`` against a real operator-mode nats-server (no broker mocks).

The root of tests/support/brokers.py runs its broker with space ``demo`` (not pushed); these
tests add space ``b`` live, remove it (streams, then accounts) and add it again (re-signed).
"""

from __future__ import annotations

import json
import time

import pytest
import trio

from cotal_trio.broker import provision
from cotal_trio.broker.accounts import lookup_subject, open_system_connection
from cotal_trio.broker.spaces import add_space, list_spaces, remove_space
from cotal_trio.cli import main
from cotal_trio.core.errors import ConfigError, Unavailable
from cotal_trio.core.manifest import parse_manifest
from cotal_trio.natsio import ensure_bucket, kv_get, kv_put, open_connection, open_loop
from cotal_trio.state import BrokerPolicy, RootPaths, load_space, save_policy

CEILING_S = 30
SPACE = "b"
BUCKET = "cotal_auth_b"
ANY = {"pub": {"allow": [">"]}, "sub": {"allow": [">"]}}


def hosted(paths) -> tuple[str, ...]:
    if not paths.spaces_manifest.exists():
        return ()
    return parse_manifest(paths.spaces_manifest.read_bytes()).names


def service_creds(paths, space: str = SPACE) -> str:
    now = int(time.time())
    material = load_space(paths.space(space).callout_json, space)
    return provision.mint_service_user(material, name="svc", permissions=ANY, iat=now, exp=now + 300)


async def lookup(url: str, broker, account: str) -> bytes:
    async with open_loop(), open_system_connection(url, broker) as conn:
        return (await conn.request(lookup_subject(account), b"")).data.strip()


async def test_add_remove_and_add_again(operator_broker, provisioned):
    url, paths = operator_broker, provisioned.paths
    with trio.fail_after(CEILING_S):
        added = await add_space(paths, SPACE, server_url=url, now=time.time())
        assert (added.server_url, added.resigned, added.hosted) == (url, False, True)
        record = provision.load_space_accounts(paths, provisioned.broker, SPACE)
        assert await lookup(url, provisioned.broker, record.data_account) == record.data_jwt.encode()
        assert await lookup(url, provisioned.broker, record.auth_account) == record.auth_jwt.encode()
        assert hosted(paths) == (SPACE,)

        creds = service_creds(paths)
        async with open_loop(), open_connection(url, creds=creds, reconnect=False) as conn:
            await ensure_bucket(conn, BUCKET)
            await kv_put(conn, BUCKET, "k", b"v1")

        removed = await remove_space(paths, SPACE, server_url=url, now=time.time())
        assert removed.was_hosted and removed.accounts_deleted
        assert removed.streams_deleted == (f"KV_{BUCKET}",)
        assert hosted(paths) == ()
        async with open_loop():
            with pytest.raises(Unavailable):
                async with open_connection(url, creds=service_creds(paths), reconnect=False):
                    pass
        assert not (await lookup(url, provisioned.broker, record.data_account)).startswith(b"ey")

        again = await add_space(paths, SPACE, server_url=url, now=time.time())
        assert again.resigned
        assert (again.data_jwt, again.auth_jwt) != (record.data_jwt, record.auth_jwt)
        assert again.data_jwt != record.data_jwt and again.auth_jwt != record.auth_jwt
        assert hosted(paths) == (SPACE,)
        async with open_loop(), open_connection(url, creds=service_creds(paths), reconnect=False) as conn:
            assert conn.is_connected
            # The stream was deleted before the account: nothing comes back (pitfall P8).
            await ensure_bucket(conn, BUCKET)
            assert await kv_get(conn, BUCKET, "k") is None


async def test_remove_twice_is_idempotent_on_the_broker(operator_broker, provisioned):
    url, paths = operator_broker, provisioned.paths
    with trio.fail_after(CEILING_S):
        await add_space(paths, SPACE, server_url=url, now=time.time())
        await remove_space(paths, SPACE, server_url=url, now=time.time())
        again = await remove_space(paths, SPACE, server_url=url, now=time.time())
    assert (again.was_hosted, again.accounts_deleted, again.streams_deleted) == (False, False, ())


async def test_default_url_is_the_policy_port_and_other_entries_stay(operator_broker, provisioned):
    url, paths = operator_broker, provisioned.paths
    save_policy(paths.policy_json, BrokerPolicy(port=int(url.rsplit(":", 1)[1])))
    with trio.fail_after(CEILING_S):
        await add_space(paths, "a", server_url=url, now=time.time())
        added = await add_space(paths, SPACE, server_url=None, now=time.time())
        assert added.server_url == url
        assert hosted(paths) == ("a", SPACE)
        removed = await remove_space(paths, SPACE, server_url=None, now=time.time())
        assert removed.server_url == url and removed.accounts_deleted
    assert hosted(paths) == ("a",)


async def test_static_space_is_pushed_but_not_hosted(operator_broker, provisioned):
    url, paths = operator_broker, provisioned.paths
    with trio.fail_after(CEILING_S):
        added = await add_space(paths, "st", static=True, server_url=url, now=time.time())
        assert (added.mode, added.hosted) == ("static", False)
        async with open_loop(), open_connection(url, creds=service_creds(paths, "st"), reconnect=False) as conn:
            assert conn.is_connected
    assert hosted(paths) == ()
    assert json.loads((paths.space("st").dir / "mode.json").read_text()) == {"ver": 1, "mode": "static"}
    assert {"space": "st", "mode": "static", "hosted": False} in list_spaces(paths)


async def test_cli_add_list_remove(operator_broker, provisioned, capsys):
    url, root = operator_broker, str(provisioned.paths.root)
    with trio.fail_after(CEILING_S):
        assert await trio.to_thread.run_sync(main, ["space", "add", SPACE, "--root", root, "--server", url]) == 0
        issuer = json.loads(provisioned.paths.devidp_json.read_text())["issuer"]
        assert capsys.readouterr().out == (
            f"added space {SPACE} (accounts pushed to {url})\n  IdP: the development IdP {issuer}\n"
        )
        assert await trio.to_thread.run_sync(main, ["space", "list", "--json", "--root", root]) == 0
        assert json.loads(capsys.readouterr().out) == [
            {"space": SPACE, "mode": "user-auth", "hosted": True},
            {"space": "demo", "mode": "user-auth", "hosted": False},
        ]
        assert await trio.to_thread.run_sync(main, ["space", "remove", SPACE, "--root", root, "--server", url]) == 0
        assert capsys.readouterr().out.startswith(f"removed space {SPACE} (0 streams and its accounts deleted on {url}")


ARG_ERRORS = [
    (["space", "add", "a.b"], "cotal: 'a.b' is not a space name"),
    (["space", "remove", "nope"], "cotal: there is no root at"),  # the root is the typo here
    (["space", "add", "x", "--server", "", "--new-root"], "cotal: --server is empty"),
    (["space", "add", "x", "--root", ""], "cotal: --root is empty"),
]


@pytest.mark.parametrize(("argv", "sentence"), ARG_ERRORS)
def test_argument_errors_are_one_sentence(tmp_path, capsys, monkeypatch, argv, sentence):
    monkeypatch.chdir(tmp_path)
    assert main([*argv, *([] if "--root" in argv else ["--root", str(tmp_path / "root")])]) == 1
    err = capsys.readouterr().err
    assert err.startswith(sentence) and len(err.strip().splitlines()) == 1


def test_a_broken_manifest_is_refused_before_anything_is_written(tmp_path, capsys):
    root = tmp_path / "root"
    root.mkdir()
    (root / "spaces.json").write_text('{"version": 2, "spaces": [{"space": "a", "bogus": 1}]}')
    assert main(["space", "add", "x", "--root", str(root)]) == 1
    assert capsys.readouterr().err.startswith("cotal: ")
    assert not (root / "spaces").exists()
    with pytest.raises(ConfigError):
        list_spaces(RootPaths(root))


def test_add_pins_a_new_space_to_the_development_idp_before_hosting_it(tmp_path, capsys):
    """A fresh user found `cotal auth-service --spaces` retrying a space added without `cotal up`
    forever (`idp.json is missing`): `space add` now pins it before listing it in spaces.json."""
    root = tmp_path / "root"
    assert main(["space", "add", "beta", "--root", str(root), "--new-root"]) == 0
    paths = RootPaths(root)
    dev = json.loads(paths.devidp_json.read_text())
    pin = json.loads(paths.space("beta").idp_json.read_text())
    assert (pin["kind"], pin["issuer"], pin["audience"]) == ("dev", dev["issuer"], dev["audience"])
    assert f"IdP: the development IdP {dev['issuer']}" in capsys.readouterr().out
    # Adding it again keeps the pin (and the same development IdP for a second space).
    assert main(["space", "add", "beta", "--root", str(root)]) == 0
    assert main(["space", "add", "gamma", "--root", str(root)]) == 0
    assert json.loads(paths.space("beta").idp_json.read_text()) == pin
    assert json.loads(paths.space("gamma").idp_json.read_text())["issuer"] == dev["issuer"]


def test_add_refuses_to_change_a_pin_before_writing_anything(tmp_path, capsys):
    root = tmp_path / "root"
    assert main(["space", "add", "beta", "--root", str(root), "--new-root"]) == 0
    manifest = (root / "spaces.json").read_bytes()
    capsys.readouterr()
    assert main(["space", "add", "beta", "--idp", "https://idp.example", "--root", str(root)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("cotal: space beta is pinned to IdP ")
    assert "changing the pin re-keys every owner - keep the pinned IdP, or use a new space" in err
    assert (root / "spaces.json").read_bytes() == manifest


def test_add_static_with_idp_is_refused(tmp_path, capsys):
    assert main(["space", "add", "frozen", "--static", "--idp", "https://idp.example", "--root", str(tmp_path / "r")]) == 1
    assert capsys.readouterr().err.startswith("cotal: --idp pins a user-auth space's IdP; a --static space has none")
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize(("first", "again", "now_is"), [(["--static"], [], "static"), ([], ["--static"], "user-auth")])
def test_adding_a_space_again_never_changes_its_mode(tmp_path, capsys, first, again, now_is):
    """Found by the fresh-user check: `cotal space add lab` on a static space made it a user-auth
    space (hosted, its minted files still connecting, mint then refused). A re-add keeps the
    mode or is refused, naming both ways on."""
    root = str(tmp_path / "root")
    assert main(["space", "add", "lab", *first, "--root", root, "--new-root"]) == 0
    mode = (tmp_path / "root" / "spaces").glob("*/mode.json")
    before = {p: p.read_bytes() for p in mode}
    manifest = (tmp_path / "root" / "spaces.json").read_bytes() if (tmp_path / "root" / "spaces.json").exists() else None
    capsys.readouterr()
    assert main(["space", "add", "lab", *again, "--root", root]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"cotal: space lab is a {now_is} space - ")
    assert "cotal space remove lab" in err
    assert {p: p.read_bytes() for p in (tmp_path / "root" / "spaces").glob("*/mode.json")} == before
    after = (tmp_path / "root" / "spaces.json").read_bytes() if (tmp_path / "root" / "spaces.json").exists() else None
    assert after == manifest
