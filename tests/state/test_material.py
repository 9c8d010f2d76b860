"""state.layout and state.material: paths, round-trips, validation, never regenerating keys."""

from __future__ import annotations

import dataclasses
import json
import os
import stat
from pathlib import Path

import pytest

from cotal_trio.broker import provision
from cotal_trio.core import natsjwt
from cotal_trio.core.errors import ConfigError
from cotal_trio.core.idp import IdpPin
from cotal_trio.core.jose import IssuerKey
from cotal_trio.core.nkeys import KeyPair, Prefix
from cotal_trio.state import (
    BrokerPolicy,
    IdpPinRecord,
    IssuerKeys,
    RootPaths,
    load_accounts,
    load_broker,
    load_idp_pin,
    load_issuer_keys,
    load_owner_secret,
    load_policy,
    load_space,
    resolve_root,
    save_broker,
    save_idp_pin,
    save_issuer_keys,
    save_owner_secret,
    save_policy,
    save_space,
)

IAT = 1_800_000_000


@pytest.fixture
def paths(tmp_path) -> RootPaths:
    return RootPaths(tmp_path / "root")


@pytest.fixture
def broker(paths):
    return provision.ensure_root(paths, iat=IAT)


# -- layout ---------------------------------------------------------------------------------


def test_resolve_root_order(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert resolve_root("flagged", {"COTAL_ROOT": "/env"}) == tmp_path / "flagged"
    assert resolve_root(None, {"COTAL_ROOT": "/env/root"}) == Path("/env/root")
    assert resolve_root(None, {}) == tmp_path / ".cotal"
    assert resolve_root("", {}).is_absolute()


def test_layout_paths(tmp_path):
    paths = RootPaths(tmp_path)
    assert paths.broker_json == tmp_path / "broker.json"
    assert paths.policy_json == tmp_path / "policy.json"
    assert paths.server_conf.parent == paths.broker_dir == tmp_path / "broker"
    assert paths.resolver_dir.parent == paths.jetstream_dir.parent == paths.broker_dir
    assert paths.spaces_manifest == tmp_path / "spaces.json"
    space = paths.space("demo-1")
    assert space.dir == tmp_path / "spaces" / "demo-1"  # the name itself (issue 18 item 3)
    for bad in ("démo", "../x", "a.b", "", "x" * 65):
        with pytest.raises(ConfigError, match="is not a space name - use 1 to 64 letters"):
            paths.space(bad)
    assert space.actors_dir == space.dir / "actors"
    assert space.managed_dir == space.dir / "managed-actors"
    assert space.sentinel_creds.name == "sentinel.creds"
    assert space.auth_service_json.name == "auth-service.json"


# -- broker material ------------------------------------------------------------------------


def test_ensure_root_creates_once_and_never_regenerates(paths, broker):
    again = provision.ensure_root(paths, iat=IAT + 100)
    assert again == broker
    assert again.operator.seed == broker.operator.seed
    assert again.operator_jwt == broker.operator_jwt
    assert stat.S_IMODE(os.stat(paths.broker_json).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(paths.root).st_mode) == 0o700


def test_broker_claims_shape(broker):
    op = natsjwt.verify(broker.operator_jwt)
    assert op["iss"] == op["sub"] == broker.operator.public_key
    assert op["nats"]["signing_keys"] == [broker.operator_signing.public_key]
    assert op["nats"]["strict_signing_key_usage"] is True
    sys = natsjwt.verify(broker.system_jwt)
    assert sys["iss"] == broker.operator_signing.public_key
    assert sys["nats"]["signing_keys"] == [broker.system_signing.public_key]


def test_corrupt_broker_json_is_untouched(paths, broker):
    paths.broker_json.write_text("{oops")
    with pytest.raises(ConfigError, match=r"broker\.json is corrupt .* run `cotal up` again"):
        provision.ensure_root(paths, iat=IAT)
    assert paths.broker_json.read_text() == "{oops"


def test_broker_with_foreign_signing_key_is_refused(paths, broker):
    forged = dataclasses.replace(broker, operator_signing=KeyPair.generate(Prefix.OPERATOR))
    save_broker(paths.broker_json, forged)
    with pytest.raises(ConfigError, match="does not list the operator signing key"):
        load_broker(paths.broker_json)


def test_broker_with_wrong_role_is_refused(paths, broker):
    obj = json.loads(paths.broker_json.read_text())
    obj["system"]["signingSeed"] = KeyPair.generate(Prefix.USER).seed
    paths.broker_json.write_text(json.dumps(obj))
    with pytest.raises(ConfigError, match="system.signingSeed is a user seed where the account seed belongs"):
        load_broker(paths.broker_json)


# -- space material -------------------------------------------------------------------------


def test_ensure_space_creates_once_and_never_regenerates(paths, broker):
    first = provision.ensure_space(paths, broker, "demo", iat=IAT)
    sp = paths.space("demo")
    files = {p: p.read_bytes() for p in sp.dir.iterdir()}
    assert {p.name for p in files} == {
        "callout.json", "accounts.json", "issuer.json", "owner-secret.json", "sentinel.creds"
    }
    second = provision.ensure_space(paths, broker, "demo", iat=IAT + 50)
    assert second.xkey.seed == first.xkey.seed
    assert second.auth_signing.seed == first.auth_signing.seed
    assert second.data_callout_signing.seed == first.data_callout_signing.seed
    assert second == dataclasses.replace(first, xkey=second.xkey)  # XKeyPair compares by identity
    assert {p: p.read_bytes() for p in sp.dir.iterdir()} == files
    for path in files:
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(sp.dir).st_mode) == 0o700


def test_ensure_space_recreates_only_missing_files(paths, broker):
    first = provision.ensure_space(paths, broker, "demo", iat=IAT)
    sp = paths.space("demo")
    secret = load_owner_secret(sp.owner_secret_json)
    issuer = load_issuer_keys(sp.issuer_json, "demo")
    sp.accounts_json.unlink()
    sp.sentinel_creds.unlink()
    provision.ensure_space(paths, broker, "demo", iat=IAT + 5)
    record = load_accounts(sp.accounts_json, "demo", operator_signing_key=broker.operator_signing.public_key)
    assert record.data_account == first.data_account
    assert sp.sentinel_creds.read_text() == first.sentinel_creds
    assert load_owner_secret(sp.owner_secret_json) == secret
    assert load_issuer_keys(sp.issuer_json, "demo").active_kid == issuer.active_kid


def test_space_round_trip_and_claims(paths, broker, tmp_path):
    material = provision.ensure_space(paths, broker, "demo", iat=IAT)
    copy = tmp_path / "copy.json"
    save_space(copy, material)
    loaded = load_space(copy, "demo")
    assert loaded.xkey.public_key == material.xkey.public_key
    assert dataclasses.replace(loaded, xkey=material.xkey) == material
    record = provision.load_space_accounts(paths, broker, "demo")
    data = natsjwt.verify(record.data_jwt)
    auth = natsjwt.verify(record.auth_jwt)
    assert data["name"] == "demo" and auth["name"] == "AUTH_demo"
    assert data["nats"]["signing_keys"] == [
        material.data_callout_signing.public_key, material.data_service_signing.public_key
    ]
    assert data["nats"]["limits"]["disk_storage"] == -1
    assert auth["nats"]["limits"]["disk_storage"] == 0
    assert auth["nats"]["authorization"] == {
        "auth_users": [record.callout_user],
        "allowed_accounts": [material.data_account],
        "xkey": material.xkey.public_key,
    }


def test_space_users_shape(paths, broker):
    from cotal_trio.core.creds import parse_creds

    material = provision.ensure_space(paths, broker, "demo", iat=IAT)
    callout = natsjwt.verify(parse_creds(material.callout_creds)[0])
    sentinel = natsjwt.verify(parse_creds(material.sentinel_creds)[0])
    for user in (callout, sentinel):
        assert user["iss"] == material.auth_signing.public_key
        assert user["nats"]["issuer_account"] == material.auth_account
    assert callout["name"] == "callout"
    assert callout["nats"]["sub"] == {"allow": ["$SYS.REQ.USER.AUTH"]}
    assert callout["nats"]["pub"] == {"deny": [">"]}
    assert callout["nats"]["resp"] == {"max": 1, "ttl": 0}
    assert sentinel["name"] == "sentinel"
    assert sentinel["nats"]["bearer_token"] is True
    assert sentinel["nats"]["pub"] == sentinel["nats"]["sub"] == {"deny": [">"]}


def test_space_file_of_another_space_is_refused(paths, broker):
    provision.ensure_space(paths, broker, "demo", iat=IAT)
    with pytest.raises(ConfigError, match="belongs to space 'demo'"):
        load_space(paths.space("demo").callout_json, "other")


@pytest.mark.parametrize("name", ["", "a.b", "a b", "x" * 65, "../up"])
def test_invalid_space_names_are_refused(paths, broker, name):
    with pytest.raises(ConfigError, match="is not a space name"):
        provision.ensure_space(paths, broker, name, iat=IAT)


def test_mismatched_accounts_json_is_refused(paths, broker):
    provision.ensure_space(paths, broker, "demo", iat=IAT)
    provision.ensure_space(paths, broker, "other", iat=IAT)
    a, b = paths.space("demo"), paths.space("other")
    other = json.loads(b.accounts_json.read_text())
    other["space"] = "demo"
    a.accounts_json.write_text(json.dumps(other))
    with pytest.raises(ConfigError, match="does not match"):
        provision.ensure_space(paths, broker, "demo", iat=IAT)


def test_resign_space_always_changes_the_jwts(paths, broker):
    provision.ensure_space(paths, broker, "demo", iat=IAT)
    before = provision.load_space_accounts(paths, broker, "demo")
    after = provision.resign_space(paths, broker, "demo", iat=IAT)  # same second
    assert after.data_jwt != before.data_jwt and after.auth_jwt != before.auth_jwt
    assert natsjwt.decode(after.data_jwt).claims["iat"] == IAT + 1
    assert provision.load_space_accounts(paths, broker, "demo") == after


# -- issuer, owner secret, IdP pin, policy --------------------------------------------------------


def test_issuer_keys_round_trip_and_issuer_check(paths, broker, tmp_path):
    provision.ensure_space(paths, broker, "demo", iat=IAT)
    keys = load_issuer_keys(paths.space("demo").issuer_json, "demo")
    assert keys.issuer == "urn:cotal:auth:demo"
    assert keys.active in keys.keys
    with pytest.raises(ConfigError, match="its issuer is not urn:cotal:auth:other"):
        load_issuer_keys(paths.space("demo").issuer_json, "other")
    second = IssuerKey.generate(bytes(range(32)))
    two = IssuerKeys(issuer=keys.issuer, active_kid=second.kid, keys=(*keys.keys, second))
    save_issuer_keys(tmp_path / "issuer.json", two)
    loaded = load_issuer_keys(tmp_path / "issuer.json", "demo")
    assert loaded.active.kid == second.kid and len(loaded.keys) == 2


def test_issuer_keys_refuse_unknown_active_kid(tmp_path):
    key = IssuerKey.generate(bytes(32))
    path = tmp_path / "issuer.json"
    path.write_text(json.dumps({
        "ver": 1, "issuer": "urn:cotal:auth:demo", "activeKid": "nope",
        "keys": [{"kid": key.kid, "privateJwk": key.private_jwk()}],
    }))
    with pytest.raises(ConfigError, match="issuer.json is corrupt"):
        load_issuer_keys(path, "demo")


def test_owner_secret_round_trip(tmp_path):
    path = tmp_path / "owner-secret.json"
    secret = bytes(range(32))
    assert save_owner_secret(path, secret, exclusive=True)
    assert not save_owner_secret(path, bytes(32), exclusive=True)
    assert load_owner_secret(path) == secret
    path.write_text(json.dumps({"ver": 1, "secretB64": "c2hvcnQ="}))
    with pytest.raises(ConfigError, match="shorter than 32 bytes"):
        load_owner_secret(path)


def test_idp_pin_round_trip(tmp_path):
    path = tmp_path / "idp.json"
    pin = IdpPinRecord(kind="dev", url="http://127.0.0.1:7450", issuer="http://127.0.0.1:7450",
                       audience="http://127.0.0.1:7450", jwks_uri="http://127.0.0.1:7450/jwks")
    save_idp_pin(path, pin)
    assert load_idp_pin(path) == pin
    assert json.loads(path.read_text()) == {
        "ver": 1, "kind": "dev", "url": pin.url, "issuer": pin.issuer, "audience": pin.audience,
        "jwksUri": pin.jwks_uri,
    }  # fmt: skip
    path.write_text(json.dumps({**json.loads(path.read_text()), "kind": "saml"}))
    with pytest.raises(ConfigError, match="idp.json is corrupt"):
        load_idp_pin(path)


def test_idp_pin_record_gives_the_core_pin():
    record = IdpPinRecord(kind="oidc", url="https://idp.example", issuer="https://idp.example",
                          audience="aud", jwks_uri="https://idp.example/jwks")
    assert record.pin() == IdpPin(issuer="https://idp.example", audience="aud", jwks_uri="https://idp.example/jwks")
    inline = dataclasses.replace(record, kind="dev", url="", jwks_uri="")
    assert inline.pin() == IdpPin(issuer="https://idp.example", audience="aud", jwks_uri=None)


@pytest.mark.parametrize("timeout", [None, 3, 2.5])
def test_policy_round_trip(tmp_path, timeout):
    path = tmp_path / "policy.json"
    save_policy(path, BrokerPolicy(port=4222, auth_timeout_s=timeout))
    assert load_policy(path) == BrokerPolicy(port=4222, auth_timeout_s=timeout)
    assert json.loads(path.read_text()) == {"ver": 1, "port": 4222, "authTimeoutS": timeout}


@pytest.mark.parametrize("obj", [{"port": 0}, {"port": True}, {"port": 1, "authTimeoutS": -1},
                                 {"port": 1, "authTimeoutS": "2"}, {"port": 1, "authTimeoutS": float("inf")},
                                 {"port": 1, "authTimeoutS": 601}, {"port": "x"}])
def test_policy_refuses_bad_values(tmp_path, obj):
    path = tmp_path / "policy.json"
    path.write_text(json.dumps({"ver": 1, "authTimeoutS": None, **obj}))
    with pytest.raises(ConfigError, match="policy.json is corrupt") as refused:
        load_policy(path)
    assert str(refused.value).count("is corrupt") == 1  # once: it used to be wrapped twice


def test_material_repr_shows_no_secret(paths, broker):
    material = provision.ensure_space(paths, broker, "demo", iat=IAT)
    shown = repr(material) + repr(broker)
    from cotal_trio.core.creds import parse_creds

    user_seeds = [parse_creds(c)[1] for c in (material.callout_creds, broker.system_user_creds)]
    for secret in (material.auth_signing.seed, material.xkey.seed, broker.operator.seed, *user_seeds):
        assert secret not in shown
    assert material.sentinel_user.startswith("U") and material.callout_user.startswith("U")


@pytest.mark.parametrize("name", ["callout.json", "accounts.json", "issuer.json", "owner-secret.json"])
def test_corrupt_space_file_is_refused_and_untouched(paths, broker, name):
    provision.ensure_space(paths, broker, "demo", iat=IAT)
    path = paths.space("demo").dir / name
    path.write_text('{"ver": 1}')
    with pytest.raises(ConfigError, match=rf"{name} is corrupt \(.* is missing\)"):
        provision.ensure_space(paths, broker, "demo", iat=IAT)
    assert path.read_text() == '{"ver": 1}'


def test_lost_callout_json_is_not_regenerated(paths, broker):
    provision.ensure_space(paths, broker, "demo", iat=IAT)
    sp = paths.space("demo")
    sp.callout_json.unlink()
    with pytest.raises(ConfigError, match="callout.json is missing but .*accounts.json exists"):
        provision.ensure_space(paths, broker, "demo", iat=IAT)
    assert not sp.callout_json.exists()


@pytest.mark.parametrize("folder", ["actors", "managed-actors", "credentials"])
def test_a_lost_owner_secret_is_not_regenerated_under_a_ledger(paths, broker, folder):
    """Every owner id of the space is derived from owner-secret.json: a fresh one under existing
    ledger rows or credential records would silently give every person a new owner (an interrupted
    `cotal space deprovision --yes` moves it aside before callout.json, spec "Offline secret
    inventory"). With no row yet there is nothing to re-key, and it is made as on a first run."""
    provision.ensure_space(paths, broker, "demo", iat=IAT)
    sp = paths.space("demo")
    sp.owner_secret_json.unlink()
    provision.ensure_space(paths, broker, "demo", iat=IAT)
    assert sp.owner_secret_json.exists()
    sp.owner_secret_json.unlink()
    (sp.dir / folder).mkdir(mode=0o700)
    (sp.dir / folder / "u_x.cli.json").write_text("{}")
    with pytest.raises(ConfigError) as refused:
        provision.ensure_space(paths, broker, "demo", iat=IAT)
    assert str(refused.value) == (
        f"{sp.owner_secret_json} is missing but {sp.dir / folder} holds rows keyed by it - put it back (from a backup,"
        " or from the .deprovision-* folder an interrupted reset left; a new one would give every owner of the space"
        " a new id), or move the space folder aside and add the space again"
    )
    assert not sp.owner_secret_json.exists()
