"""Provisioning against a real nats-server in operator mode (no mocks of the broker).

The rendered config is checked as text (DESIGN.md section 4) and by ``nats-server -t``; then a
broker started from it must accept the space accounts pushed at runtime, admit users signed by
the space's signing keys, refuse JWTs of another operator, and forget and revive a space.
"""

from __future__ import annotations

import time

import pytest
import trio

from cotal_trio.broker import provision
from cotal_trio.broker.accounts import (
    delete_accounts,
    lookup_subject,
    open_system_connection,
    push_accounts,
)
from cotal_trio.broker.config import render_config
from cotal_trio.core import natsjwt
from cotal_trio.core.errors import ConfigError, Unavailable
from cotal_trio.natsio import Message, open_connection, open_loop
from cotal_trio.state import RootPaths
from tests.support.brokers import nats_accepts, trust_lines

CEILING_S = 30
SPACE = "demo"  # the space tests/support/brokers.py provisions
APP = {"pub": {"allow": ["app.>"]}, "sub": {"allow": ["app.>", "_INBOX.>"]}}


def service_creds(provisioned, name: str = "svc") -> str:
    now = int(time.time())
    return provision.mint_service_user(
        provisioned.space, name=name, permissions=APP, iat=now, exp=now + 300
    )


async def push_space(url: str, provisioned, record=None) -> None:
    record = record or provision.load_space_accounts(provisioned.paths, provisioned.broker, SPACE)
    async with open_system_connection(url, provisioned.broker) as sys_conn:
        await push_accounts(sys_conn, [record.data_jwt, record.auth_jwt])


async def assert_pub_sub(url: str, creds: str) -> None:
    """A data-account user can subscribe and receive its own publish."""
    send, receive = trio.open_memory_channel[Message](4)
    async with open_connection(url, creds=creds, name="cotal:test-svc", reconnect=False) as conn:
        await conn.subscribe("app.hello", on_message=send.send_nowait)
        await conn.flush()
        await conn.publish("app.hello", b"hi")
        assert (await receive.receive()).data == b"hi"
        assert conn.last_error is None


# -- rendered config (no broker) -----------------------------------------------------------------


def test_render_config_is_the_design(provisioned):
    paths, broker = provisioned.paths, provisioned.broker
    text = render_config(paths, broker, port=4222, auth_timeout_s=None)
    assert text.splitlines()[1:] == [
        "server_name: cotal",
        'listen: "127.0.0.1:4222"',
        "max_control_line: 65536",
        *trust_lines(broker, paths.resolver_dir),
        "jetstream {",
        f'  store_dir: "{paths.jetstream_dir}"',
        "}",
    ]
    timed = render_config(paths, broker, port=4222, auth_timeout_s=2.5)
    assert timed == text + "authorization {\n  timeout: 2.5\n}\n"
    assert render_config(paths, broker, port=4222, auth_timeout_s=3).endswith("  timeout: 3\n}\n")


def test_render_config_quotes_paths(tmp_path, provisioned, nats_server_bin):
    paths = RootPaths(tmp_path / 'we "ird" \\ $root')
    text = render_config(paths, provisioned.broker, port=4222, auth_timeout_s=None)
    assert f'  dir: "{tmp_path}/we \\"ird\\" \\\\ $root/broker/resolver"' in text
    config = tmp_path / "server.conf"
    config.write_text(text)
    nats_accepts(nats_server_bin, config)


@pytest.mark.parametrize("bad", [dict(port=0), dict(port=70000), dict(auth_timeout_s=0)])
def test_render_config_refuses_bad_values(provisioned, bad):
    with pytest.raises(ConfigError):
        render_config(provisioned.paths, provisioned.broker, **{"port": 4222, "auth_timeout_s": None, **bad})
    with pytest.raises(ConfigError, match="control character"):
        render_config(RootPaths(provisioned.paths.root / "a\nb"), provisioned.broker, port=4222,
                      auth_timeout_s=None)


def test_delete_claim_shape(provisioned):
    osk = provisioned.broker.operator_signing.public_key
    claims = natsjwt.verify(provision.delete_accounts_claim(provisioned.broker, ["A1", "A2"], iat=7))
    assert claims["iss"] == claims["sub"] == osk
    assert claims["nats"] == {"accounts": ["A1", "A2"], "type": "generic", "version": 2}


def test_service_user_shape(provisioned):
    from cotal_trio.core.creds import parse_creds

    claims = natsjwt.verify(parse_creds(service_creds(provisioned))[0])
    assert claims["iss"] == provisioned.space.data_service_signing.public_key
    assert claims["nats"]["issuer_account"] == provisioned.space.data_account
    assert claims["nats"]["pub"] == APP["pub"] and claims["exp"] > claims["iat"]


# -- live broker ------------------------------------------------------------------------------


@pytest.mark.broker
async def test_pushed_space_admits_service_and_callout_users(operator_broker, provisioned):
    with trio.fail_after(CEILING_S):
        async with open_loop():
            await push_space(operator_broker, provisioned)
            await assert_pub_sub(operator_broker, service_creds(provisioned))
            async with open_connection(
                operator_broker, creds=provisioned.space.callout_creds, reconnect=False
            ) as callout:
                await callout.subscribe("$SYS.REQ.USER.AUTH", queue="cotal-auth-callout",
                                        on_message=lambda m: None)
                await callout.flush()
                assert callout.last_error is None
                await callout.subscribe("app.>", on_message=lambda m: None)  # not granted
                await callout.flush()
                assert "permissions violation" in (callout.last_error or "").lower()


@pytest.mark.broker
async def test_pushed_jwts_are_read_back(operator_broker, provisioned):
    record = provision.load_space_accounts(provisioned.paths, provisioned.broker, SPACE)
    with trio.fail_after(CEILING_S):
        async with open_loop():
            await push_space(operator_broker, provisioned, record)
            async with open_system_connection(operator_broker, provisioned.broker) as sys_conn:
                stored = await sys_conn.request(lookup_subject(record.auth_account), b"")
    assert stored.data == record.auth_jwt.encode()


@pytest.mark.broker
async def test_jwt_of_another_operator_is_refused_before_push(operator_broker, provisioned, tmp_path):
    other = RootPaths(tmp_path / "other")
    other_broker = provision.ensure_root(other, iat=provisioned.iat)
    provision.ensure_space(other, other_broker, SPACE, iat=provisioned.iat)
    foreign = provision.load_space_accounts(other, other_broker, SPACE)
    with trio.fail_after(CEILING_S):
        async with open_loop():
            await push_space(operator_broker, provisioned)
            async with open_system_connection(operator_broker, provisioned.broker) as sys_conn:
                with pytest.raises(ConfigError, match="not a signing key of the operator"):
                    await push_accounts(sys_conn, [foreign.data_jwt])
            await assert_pub_sub(operator_broker, service_creds(provisioned))  # good space intact


@pytest.mark.broker
async def test_delete_then_resign_and_push_revives_the_space(operator_broker, provisioned):
    paths, broker = provisioned.paths, provisioned.broker
    record = provision.load_space_accounts(paths, broker, SPACE)
    claim = provision.delete_accounts_claim(
        broker, [record.auth_account, record.data_account], iat=int(time.time())
    )
    with trio.fail_after(CEILING_S):
        async with open_loop():
            await push_space(operator_broker, provisioned, record)
            async with open_system_connection(operator_broker, broker) as sys_conn:
                await delete_accounts(sys_conn, claim)
            with pytest.raises(Unavailable):
                async with open_connection(operator_broker, creds=service_creds(provisioned),
                                           reconnect=False):
                    pass
            fresh = provision.resign_space(paths, broker, SPACE, iat=int(time.time()))
            assert fresh.data_jwt != record.data_jwt
            await push_space(operator_broker, provisioned, fresh)
            await assert_pub_sub(operator_broker, service_creds(provisioned, "svc-again"))


@pytest.mark.broker
async def test_delete_signed_by_the_identity_key_is_refused(operator_broker, provisioned):
    broker = provisioned.broker
    claims = natsjwt.generic_claims(subject=broker.operator.public_key,
                                    data={"accounts": [provisioned.space.data_account]})
    forged = natsjwt.encode(claims, broker.operator, iat=int(time.time()))
    with trio.fail_after(CEILING_S):
        async with open_loop():
            await push_space(operator_broker, provisioned)
            async with open_system_connection(operator_broker, broker) as sys_conn:
                with pytest.raises(ConfigError, match="refused by the broker"):
                    await delete_accounts(sys_conn, forged)
            await assert_pub_sub(operator_broker, service_creds(provisioned))
