"""``cotal auth mint --endpoint`` on a real operator-mode nats-server (issue 6 item 7; spec "Standalone
callers"; docs/static-credentials.md).

The endpoint host is a real NATS client of the space's data account: it answers ``describe`` with
its surface, and answers a request carrying ``Cotal-Caller-Jwt`` only after
``ops.callers.check_caller_request`` (the intent read from the issued store, then the pure
host check) passed; otherwise it answers the refusal.
"""

from __future__ import annotations

import json
import stat
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path

import pytest
import trio

from cotal_trio.broker.provision import mint_service_user
from cotal_trio.ops.caller_mint import MINT_DEADLINE_S, CallerSteps, mint_caller
from cotal_trio.ops.static_credentials import MintRequest
from cotal_trio.core import callers, natsjwt
from cotal_trio.core.creds import parse_creds
from cotal_trio.core.errors import ConfigError, RefusalCode, Refused
from cotal_trio.core.nkeys import KeyPair, Prefix
from cotal_trio.ops.callers import (
    IntentExists,
    IntentNotCreated,
    IntentUnsettled,
    check_caller_request,
    create_intent,
    load_data_account,
    refusal_answer,
)
from cotal_trio.natsio import (
    Connection,
    Message,
    consumer_info,
    first_message,
    kv_keys,
    open_connection,
    open_loop,
    stream_config,
)
from cotal_trio.state import load_space
from cotal_trio.state.credentials import load_record, write_creds
from tests.support.cli_root import cotal
from tests.support.static_mint import STATIC, connect_receipt, static_space  # noqa: F401 - the fixture

pytestmark = pytest.mark.broker

ENDPOINT = "weather"
CEILING_S = 40
ISSUED = f"KV_cotal_issued_{STATIC}"
SURFACE = callers.Surface(endpoint=ENDPOINT, verbs=("invoke",), targeted=False, synchronous=True, ephemeral=True,
                          journaled=False, action=False)  # fmt: skip


@dataclass
class Host:
    """The test endpoint host: what it answers to describe, and whether it answers at all."""

    conn: Connection
    surface: callers.Surface
    describe: Callable[[], bytes]
    silent: bool = False
    describe_delay_s: float = 0
    seen: list[str] = field(default_factory=list)


async def _answer(host: Host, msg: Message, paths) -> bytes:
    verb = msg.subject.split(".")[4]
    carries_jwt = any(name.lower() == "cotal-caller-jwt" for name in (msg.headers or {}))
    if verb == "describe" and not carries_jwt:
        await trio.sleep(host.describe_delay_s)
        return host.describe()  # the public surface probe (the mint's fresh surface): the surface only
    # The data account is loaded for each request, so a revocation counts at once (docs "Host check").
    account = await trio.to_thread.run_sync(load_data_account, paths, STATIC)
    try:
        found = await check_caller_request(host.conn, msg, space=STATIC, endpoint=ENDPOINT, surface=host.surface,
                                           account=account, now=int(time.time()))  # fmt: skip
    except Refused as exc:
        return refusal_answer(exc)
    if found.verb == "describe":
        return host.describe()
    return json.dumps({"verb": found.verb, "uid": found.intent.uid, "echo": msg.data.decode()}).encode()


async def run_host(url: str, paths, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
    """A real NATS peer in the data account serving ``cotal.st.ep.weather.>``; runs until cancelled."""
    material = load_space(paths.space(STATIC).callout_json, STATIC)
    now = int(time.time())
    creds = mint_service_user(material, name="test-endpoint-host", iat=now, exp=now + 600, permissions={
        "pub": {"allow": [">"]}, "sub": {"allow": [f"cotal.{STATIC}.ep.{ENDPOINT}.>", "_INBOX_testhost.>"]}})  # fmt: skip
    send, receive = trio.open_memory_channel(64)
    async with open_loop(), open_connection(url, creds=creds, name="testhost", inbox_prefix="_INBOX_testhost", reconnect=False) as conn:
        await conn.subscribe(f"cotal.{STATIC}.ep.{ENDPOINT}.>", on_message=send.send_nowait)
        await conn.flush()
        host = Host(conn=conn, surface=SURFACE, describe=lambda: callers.render_describe_answer(host.surface))
        task_status.started(host)
        async for msg in receive:
            host.seen.append(msg.subject)
            if not host.silent:
                await conn.publish(msg.reply, await _answer(host, msg, paths))


@pytest.fixture
def space(static_space):
    """(broker URL, root paths): the static space on the provisioned root's running broker."""
    return static_space


@pytest.fixture
async def host(space, nursery) -> Host:
    url, paths = space
    with trio.fail_after(CEILING_S):
        return await nursery.start(run_host, url, paths)


@asynccontextmanager
async def inspector(space) -> AsyncIterator[Connection]:
    """A test-only data-account user allowed everything, to look at (and replay into) the stores."""
    url, paths = space
    material = load_space(paths.space(STATIC).callout_json, STATIC)
    now = int(time.time())
    creds = mint_service_user(material, name="test-inspector", iat=now, exp=now + 600,
                              permissions={"pub": {"allow": [">"]}, "sub": {"allow": ["_INBOX_inspect.>"]}})  # fmt: skip
    async with open_loop(), open_connection(url, creds=creds, name="inspect", inbox_prefix="_INBOX_inspect", reconnect=False) as conn:
        yield conn


def argv(space, label: str, out: Path, *extra: str) -> list[str]:
    url, paths = space
    return ["auth", "mint", "--space", STATIC, "--root", str(paths.root), "--server", url, "--label", label,
            "--endpoint", ENDPOINT, "--out", str(out), *extra]  # fmt: skip


async def intents(space) -> list[str]:
    """The intent keys of the space's issued store ([] when the store does not exist)."""
    async with inspector(space) as conn:
        if await stream_config(conn, ISSUED) is None:
            return []
        return await kv_keys(conn, f"cotal_issued_{STATIC}", prefix="intent.")


async def refused_publish(conn: Connection, subject: str) -> None:
    before = conn.error_count
    await conn.publish(subject, b"x")
    error = await conn.wait_error(after=before)
    assert f'permissions violation for publish to "{subject.lower()}"' in error.lower(), error


async def refused_subscribe(conn: Connection, subject: str) -> None:
    before = conn.error_count
    await conn.subscribe(subject, on_message=lambda msg: None)
    await conn.flush()
    error = await conn.wait_error(after=before)
    assert f'permissions violation for subscription to "{subject.lower()}"' in error.lower(), error


def one_sentence(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("cotal: "), err
    return lines[0].removeprefix("cotal: ")


# -- a standalone caller end to end ----------------------------------------------------------------


async def test_a_minted_caller_calls_its_rows_only_and_its_intent_is_private_and_create_only(space, host, capsys, tmp_path):
    url, paths = space
    out = tmp_path / "calls" / "caller.creds"
    with trio.fail_after(CEILING_S):
        before = int(time.time())
        code, text, err = await cotal(capsys, *argv(space, "caller", out, "--channels", "team.news", "--json"))
        assert code == 0, err
        receipt = json.loads(text)
        assert (receipt["endpoint"], receipt["surfaceDigest"], receipt["verbs"], receipt["channels"]) == (
            ENDPOINT, SURFACE.digest, ["invoke"], ["team.news"])
        assert receipt["path"] == str(out) and stat.S_IMODE(out.stat().st_mode) == 0o600
        assert receipt["expiresAt"] == receipt["issuedAt"] + 24 * 3600
        record = load_record(paths.space(STATIC), "caller").current
        assert (record.pending, record.endpoint, record.surface_digest, record.lifecycle_uid) == (
            False, ENDPOINT, SURFACE.digest, receipt["lifecycleUid"])
        owner, actor = receipt["principal"].split(".")
        jwt, seed = parse_creds(out.read_text())
        claims = natsjwt.verify(jwt)
        assert "profile:agent" in claims["nats"]["tags"] and f"lifecycle:{record.lifecycle_uid}" in claims["nats"]["tags"]

        # The intent: first message on its key, canonical, no credential, TTL expiresAt + 60 - now.
        key = f"intent.v1.{owner}.{actor}.{record.lifecycle_uid}"
        assert await intents(space) == [key]
        async with inspector(space) as look:
            msg = await first_message(look, ISSUED, f"$KV.cotal_issued_{STATIC}.{key}")
            # Create-only: replaying the same coordinates at the broker is refused.
            with pytest.raises(IntentExists, match="create-only and never issued twice"):
                await create_intent(look, callers.parse_intent(msg.data), now=time.time())
        intent = callers.parse_intent(msg.data)
        assert (intent.endpoint, intent.user_key, intent.surface, intent.issued_at, intent.expires_at) == (
            ENDPOINT, receipt["userKey"], SURFACE.digest, receipt["issuedAt"], receipt["expiresAt"])
        assert intent.ceiling == callers.ceiling_digest({"pub": claims["nats"]["pub"], "sub": claims["nats"]["sub"]})
        ttl = int(msg.headers["Nats-TTL"])
        assert receipt["expiresAt"] + 60 - int(time.time()) <= ttl <= receipt["expiresAt"] + 60 - before
        assert seed.encode() not in msg.data and jwt.encode() not in msg.data and b"-----BEGIN" not in msg.data
        assert await intents(space) == [key]

        headers = {callers.CALLER_JWT_HEADER: jwt}
        ep = f"cotal.{STATIC}.ep.{ENDPOINT}"
        received, inbox = trio.open_memory_channel(8)
        async with open_loop(), connect_receipt(url, receipt) as conn:
            answer = await conn.request(f"{ep}.describe.{owner}.{actor}", b"", headers)
            assert answer.data == callers.render_describe_answer(SURFACE)
            answer = await conn.request(f"{ep}.invoke.{owner}.{actor}", b"rain?", headers)
            assert json.loads(answer.data) == {"verb": "invoke", "uid": record.lifecycle_uid, "echo": "rain?"}
            # Without the header the host's check refuses (the answer is the refusal, no traceback).
            answer = await conn.request(f"{ep}.invoke.{owner}.{actor}", b"", None)
            assert json.loads(answer.data) == {"ver": 1, "code": "bad-credential",
                                               "error": "standalone caller refused: the request carries no Cotal-Caller-Jwt header"}
            # A JWT re-signed by the right signer with an edited grant is not the builder's.
            edited = dict(claims)
            edited["nats"] = {**claims["nats"], "pub": {"allow": [*claims["nats"]["pub"]["allow"], f"cotal.{STATIC}.ctl.spawn"]}}
            material = load_space(paths.space(STATIC).callout_json, STATIC)
            forged = natsjwt.encode({k: v for k, v in edited.items() if k not in ("iss", "iat", "jti")},
                                    material.data_service_signing, iat=claims["iat"])  # fmt: skip
            answer = await conn.request(f"{ep}.invoke.{owner}.{actor}", b"", {callers.CALLER_JWT_HEADER: forged})
            assert json.loads(answer.data)["error"].startswith("standalone caller refused: its JWT's permissions are not")
            other = natsjwt.encode({k: v for k, v in claims.items() if k not in ("iss", "iat", "jti")},
                                   KeyPair.generate(Prefix.ACCOUNT), iat=claims["iat"])  # fmt: skip
            answer = await conn.request(f"{ep}.invoke.{owner}.{actor}", b"", {callers.CALLER_JWT_HEADER: other})
            assert json.loads(answer.data)["error"].startswith("standalone caller refused: its JWT is not signed by a current")

            # Its channels: read and post exactly team.news.
            await conn.subscribe(f"cotal.{STATIC}.ch.team.news", on_message=received.send_nowait)
            await conn.publish(f"cotal.{STATIC}.ch.team.news", b"hello")
            await conn.flush()
            assert (await inbox.receive()).data == b"hello"
            assert conn.error_count == 0
            # Nothing else: another verb, another endpoint, another actor, another channel, control.
            for subject in (f"{ep}.forecast.{owner}.{actor}", f"cotal.{STATIC}.ep.other.invoke.{owner}.{actor}",
                            f"{ep}.invoke.{owner}.someone", f"cotal.{STATIC}.ch.team.other", f"cotal.{STATIC}.ctl.spawn",
                            f"cotal.{STATIC}.ctl.run.start", f"cotal.{STATIC}.ctl.persona"):  # fmt: skip
                await refused_publish(conn, subject)
            # Its intent is private: no leader read or direct get of the issued store, no read or
            # write of its keys (its own intent's included).
            for subject in (f"$JS.API.STREAM.MSG.GET.{ISSUED}", f"$JS.API.DIRECT.GET.{ISSUED}",
                            f"$JS.API.DIRECT.GET.{ISSUED}.$KV.cotal_issued_{STATIC}.{key}",
                            f"$KV.cotal_issued_{STATIC}.{key}"):  # fmt: skip
                await refused_publish(conn, subject)
            await refused_subscribe(conn, f"$KV.cotal_issued_{STATIC}.>")
            await refused_subscribe(conn, f"$KV.cotal_issued_{STATIC}.{key}")
            # Its native footprint: its DM inbox durable exists and it may bind it.
            info = await consumer_info(conn, f"COTAL_DM_{STATIC}", f"dm-{owner}-{actor}")
            assert info["config"]["filter_subject"] == f"cotal.{STATIC}.dm.{owner}.{actor}.>"
            # and its two watch readers (issue 19 item 4), which it may inspect
            errors = conn.error_count
            watches = [await consumer_info(conn, f"KV_cotal_{kind}_{STATIC}", f"watch-{kind}-{owner}-{actor}")
                       for kind in ("presence", "channels")]  # fmt: skip
            assert [w["config"]["filter_subject"] for w in watches] == [
                f"$KV.cotal_presence_{STATIC}.>", f"$KV.cotal_channels_{STATIC}.>"]
            assert conn.error_count == errors, conn.last_error
        assert [s.split(".")[4] for s in host.seen] == ["describe", "describe", "invoke", "invoke", "invoke", "invoke"]

        code, text, err = await cotal(capsys, "doctor", "auth", "--root", str(paths.root), "--space", STATIC, "--json")
        [row] = json.loads(text)["spaces"][0]["credentials"]
        assert (row["endpoint"], row["surfaceDigest"], row["verbs"], row["pending"]) == (ENDPOINT, SURFACE.digest, ["invoke"], False)


# -- refusals: exit 1, one sentence, nothing written, no intent ------------------------------------


def surface_answer(**change) -> bytes:
    return callers.render_describe_answer(replace(SURFACE, **change))


REFUSED_SURFACES = [
    (surface_answer(targeted=True), f"endpoint {ENDPOINT} is a targeted surface: standalone caller files support only"),
    (surface_answer(journaled=True), f"endpoint {ENDPOINT} is a journaled surface"),
    (surface_answer(action=True), f"endpoint {ENDPOINT} is an action surface"),
    (surface_answer(synchronous=False), f"endpoint {ENDPOINT} is an asynchronous surface"),
    (surface_answer(ephemeral=False), f"endpoint {ENDPOINT} is a non-ephemeral surface"),
    (json.dumps({"ver": 1, "surface": SURFACE.to_json(), "digest": "sha256:" + "1" * 64}).encode(),
     f"endpoint {ENDPOINT}'s surface digest sha256:{'1' * 64} does not match its surface ({SURFACE.digest})"),
    (json.dumps({"ver": 1, "surface": {**SURFACE.to_json(), "extra": 1}, "digest": SURFACE.digest}).encode(),
     f"endpoint {ENDPOINT} answered describe with a surface that is not the closed version 1 shape (unknown extra)"),
]  # fmt: skip


async def test_unsupported_or_unverified_surfaces_are_refused_with_nothing_written(space, host, capsys, tmp_path):
    _, paths = space
    out = tmp_path / "refused.creds"
    with trio.fail_after(CEILING_S):
        for payload, sentence in REFUSED_SURFACES:
            host.describe = lambda payload=payload: payload
            code, text, err = await cotal(capsys, *argv(space, "refused", out))
            assert (code, text) == (1, "") and one_sentence(err).startswith(sentence), err
            assert not out.exists() and load_record(paths.space(STATIC), "refused") is None
            assert await intents(space) == []


async def test_no_answer_is_refused_within_the_describe_deadline(space, nursery, capsys, tmp_path):
    url, paths = space
    out = tmp_path / "none.creds"
    # Found by the fresh-user check: "no responders" came back at once, saying "within 5 s".
    nobody = (f"nothing serves endpoint {ENDPOINT} in space {STATIC} (no host subscribes to its describe) - start its "
              "host, or check the name given to --endpoint")  # fmt: skip
    silent = (f"endpoint {ENDPOINT} did not answer describe in space {STATIC} within 5 s - check that its host runs, "
              "or the name given to --endpoint")  # fmt: skip
    with trio.fail_after(CEILING_S):
        code, _, err = await cotal(capsys, *argv(space, "nobody", out))  # nothing subscribes: no responders
        assert code == 1 and one_sentence(err) == nobody
        host = await nursery.start(run_host, url, paths)
        host.silent = True  # subscribed, never answers
        started = trio.current_time()
        code, _, err = await cotal(capsys, *argv(space, "nobody", out))
        assert code == 1 and one_sentence(err) == silent
        assert 5 <= trio.current_time() - started < 10
        assert not out.exists() and load_record(paths.space(STATIC), "nobody") is None
        assert await intents(space) == []


# -- interruption after the intent, and the remedy -------------------------------------------------


async def test_an_interrupted_mint_is_not_replayed_blindly_and_the_remedy_works(space, host, capsys, tmp_path):
    url, paths = space
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    out = tmp_path / "ok" / "late.creds"
    with trio.fail_after(CEILING_S):
        code, _, err = await cotal(capsys, *argv(space, "late", blocker / "late.creds"))
        record = load_record(paths.space(STATIC), "late").current
        assert code == 1 and record.pending and "Traceback" not in err
        assert one_sentence(err).endswith(
            f"- the mint of label late (lifecycle {record.lifecycle_uid}, endpoint {ENDPOINT}) was interrupted after its "
            "issuance intent: the intent may exist but the file was never handed out, and the mint is not run again "
            f"blindly - {remedy('late')}"
        )
        key = f"intent.v1.{record.owner}.{record.actor}.{record.lifecycle_uid}"
        assert await intents(space) == [key]
        for extra in ((), ("--replace",)):  # a rerun, even with --replace, is refused before anything
            code, _, err = await cotal(capsys, *argv(space, "late", out, *extra))
            assert code == 1 and one_sentence(err).startswith(f"the mint of label late (lifecycle {record.lifecycle_uid}")
        assert not out.exists() and await intents(space) == [key]

        code, _, err = await cotal(capsys, "auth", "revoke-credential", "late", "--space", STATIC, "--root", str(paths.root), "--server", url)
        assert code == 0, err
        code, text, err = await cotal(capsys, *argv(space, "late", out, "--replace"))
        assert code == 0, err
        fresh = load_record(paths.space(STATIC), "late")
        assert fresh.current.lifecycle_uid != record.lifecycle_uid and not fresh.current.pending and out.exists()
        assert [c.lifecycle_uid for c in fresh.replaced] == [record.lifecycle_uid]  # revoked, kept for the account
        lines = text.splitlines()
        assert lines[0] == f"replaced agent credential late in space {STATIC}"
        assert lines[7:11] == [f"  endpoint  {ENDPOINT}", f"  surface   {SURFACE.digest}", "  verbs     invoke", "  channels  none"]
        receipt = {"inboxPrefix": f"_INBOX_{fresh.current.inbox_nonce}", "path": str(out), "principal": fresh.current.principal,
                   "lifecycleUid": fresh.current.lifecycle_uid}  # fmt: skip
        assert len(await intents(space)) == 2
        async with open_loop(), connect_receipt(url, receipt) as conn:
            owner, actor = receipt["principal"].split(".")
            jwt = parse_creds(out.read_text())[0]
            answer = await conn.request(f"cotal.{STATIC}.ep.{ENDPOINT}.invoke.{owner}.{actor}", b"", {callers.CALLER_JWT_HEADER: jwt})
            assert json.loads(answer.data)["uid"] == receipt["lifecycleUid"]


# -- a revoked caller's JWT, replayed by its replacement -------------------------------------------


async def test_a_revoked_jwt_is_refused_even_from_the_replacement_file(space, host, capsys, tmp_path):
    """After revoke-credential and mint --replace, the new file (same owner and actor rows) sends the
    OLD JWT in Cotal-Caller-Jwt while the old intent still lives: the host refuses it, as revoked."""
    url, paths = space
    old_out, new_out = tmp_path / "old.creds", tmp_path / "new.creds"
    with trio.fail_after(CEILING_S):
        code, text, err = await cotal(capsys, *argv(space, "rot", old_out, "--json"))
        assert code == 0, err
        old_jwt = parse_creds(old_out.read_text())[0]
        code, _, err = await cotal(capsys, "auth", "revoke-credential", "rot", "--space", STATIC, "--root", str(paths.root), "--server", url)
        assert code == 0, err
        code, text, err = await cotal(capsys, *argv(space, "rot", new_out, "--replace", "--json"))
        assert code == 0, err
        receipt = json.loads(text)
        assert len(await intents(space)) == 2  # the old intent lives until its expiry + 60 s
        owner, actor = receipt["principal"].split(".")
        subject = f"cotal.{STATIC}.ep.{ENDPOINT}.invoke.{owner}.{actor}"
        revoked_at = load_record(paths.space(STATIC), "rot").replaced[0].revoked_at
        async with open_loop(), connect_receipt(url, receipt) as conn:
            answer = await conn.request(subject, b"", {callers.CALLER_JWT_HEADER: old_jwt})
            assert json.loads(answer.data) == {"ver": 1, "code": "bad-credential", "error": (
                f"standalone caller refused: its user key was revoked at {revoked_at} (`cotal auth revoke-credential`) - "
                "use the label's current file")}  # fmt: skip
            new_jwt = parse_creds(new_out.read_text())[0]
            answer = await conn.request(subject, b"", {callers.CALLER_JWT_HEADER: new_jwt})
            assert json.loads(answer.data)["uid"] == receipt["lifecycleUid"]


# -- interruptions at each step after the intent (the steps are wrapped: ops/caller_mint.CallerSteps) --


def flags_for(space, label: str, out: Path, **change) -> MintRequest:
    _, paths = space
    flags = MintRequest(profile="agent", label=label, out=str(out), expires_in=None, expires_at=None, no_expiry=False,
                        replace=False, identity=None, paths=paths, sp=paths.space(STATIC))  # fmt: skip
    return replace(flags, **change)


async def mint_here(space, label: str, out: Path, *, steps: CallerSteps, deadline_s: float = MINT_DEADLINE_S):
    """``mint_caller`` in this trio run (its steps wrapped), as `cotal auth mint --endpoint` runs it."""
    url, _ = space
    return await mint_caller(flags_for(space, label, out), ENDPOINT, (), url, steps=steps, deadline_s=deadline_s)


def remedy(label: str) -> str:
    return f"run `cotal auth revoke-credential {label} --space {STATIC}`, then mint again with --replace"


async def assert_rerun_refused(space, capsys, label: str, out: Path, sentence: str) -> None:
    for extra in ((), ("--replace",)):
        code, _, err = await cotal(capsys, *argv(space, label, out, *extra))
        assert code == 1 and one_sentence(err) == sentence, err


async def test_an_unacknowledged_intent_keeps_the_record_pending_and_says_it_may_exist(space, host, capsys, tmp_path):
    out = tmp_path / "lost.creds"

    async def created_but_unacknowledged(conn, intent, *, now):
        await create_intent(conn, intent, now=now)  # the broker stored it; its ack never came
        raise IntentUnsettled("the issuance intent's create was not acknowledged (no answer within 10 s), so it may exist")

    with trio.fail_after(CEILING_S):
        with pytest.raises(ConfigError) as refused:
            await mint_here(space, "lost", out, steps=CallerSteps(create_intent=created_but_unacknowledged))
        record = load_record(space[1].space(STATIC), "lost")
        assert record is not None and record.current.pending, "the record was undone while the intent may exist"
        uid = record.current.lifecycle_uid
        interrupted = (f"the mint of label lost (lifecycle {uid}, endpoint {ENDPOINT}) was interrupted after its issuance "
                       f"intent: the intent may exist but the file was never handed out, and the mint is not run again "
                       f"blindly - {remedy('lost')}")  # fmt: skip
        assert str(refused.value) == ("the issuance intent's create was not acknowledged (no answer within 10 s), so it "
                                      f"may exist - {interrupted}")  # fmt: skip
        assert not out.exists() and await intents(space) == [f"intent.v1.{record.current.principal}.{uid}"]
        await assert_rerun_refused(space, capsys, "lost", out, interrupted)


async def test_the_mint_deadline_after_the_intent_keeps_the_record_pending(space, host, capsys, tmp_path):
    out = tmp_path / "slow.creds"

    async def created_then_stuck(conn, intent, *, now):
        await create_intent(conn, intent, now=now)
        await trio.sleep_forever()  # the ack is late: the mint's deadline hits

    with trio.fail_after(CEILING_S):
        with pytest.raises(ConfigError) as refused:
            await mint_here(space, "slow", out, steps=CallerSteps(create_intent=created_then_stuck), deadline_s=3)
        record = load_record(space[1].space(STATIC), "slow")
        assert record is not None and record.current.pending
        assert str(refused.value).startswith("the mint did not finish within 3 s - the mint of label slow (lifecycle "
                                             f"{record.current.lifecycle_uid}, endpoint {ENDPOINT}) was interrupted after "
                                             "its issuance intent: the intent may exist")  # fmt: skip
        assert "nothing was written" not in str(refused.value) and not out.exists()
        assert len(await intents(space)) == 1


async def test_a_create_the_broker_refused_undoes_the_record(space, host, capsys, tmp_path):
    out = tmp_path / "no.creds"

    async def refused_by_the_broker(conn, intent, *, now):
        raise IntentNotCreated("the issuance intent was not created: jetstream not enabled for account")

    async def key_taken(conn, intent, *, now):
        raise IntentExists(RefusalCode.CONFLICT, f"an issuance intent already exists for {intent.owner}.{intent.actor}")

    with trio.fail_after(CEILING_S):
        for step, problem in ((refused_by_the_broker, "the issuance intent was not created: jetstream not enabled for account"),
                              (key_taken, "an issuance intent already exists for")):  # fmt: skip
            with pytest.raises(ConfigError) as refused:
                await mint_here(space, "no", out, steps=CallerSteps(create_intent=step))
            assert str(refused.value).startswith(problem) and str(refused.value).endswith("nothing of this mint was written"), refused.value
            assert load_record(space[1].space(STATIC), "no") is None and not out.exists()
        assert await intents(space) == []


class Interrupt(BaseException):
    """Stands for Ctrl-C (KeyboardInterrupt itself would stop pytest)."""


async def test_a_file_whose_record_did_not_become_final_is_removed_and_the_refusal_says_where_it_stands(space, host, capsys, tmp_path):
    url, paths = space
    out = tmp_path / "half.creds"

    def failing(failure: BaseException):
        def save_final(sp, record):
            raise failure
        return save_final

    async def revoke() -> None:
        code, _, err = await cotal(capsys, "auth", "revoke-credential", "half", "--space", STATIC, "--root", str(paths.root),
                                   "--server", url)  # fmt: skip
        assert code == 0, err

    with trio.fail_after(CEILING_S):
        # The final record cannot be saved: the file is removed, the record stays pending.
        with pytest.raises(ConfigError) as refused:
            await mint_here(space, "half", out, steps=CallerSteps(save_final=failing(OSError(28, "No space left on device"))))
        record = load_record(paths.space(STATIC), "half").current
        assert record.pending and not out.exists(), "a file not recorded final was left usable"
        assert str(refused.value) == (
            f"No space left on device: the file {out} was written but its record could not be made final, so it was "
            f"removed - the mint of label half (lifecycle {record.lifecycle_uid}, endpoint {ENDPOINT}) was interrupted "
            "after its issuance intent: the intent may exist but the file was never handed out, and the mint is not run "
            f"again blindly - {remedy('half')}"
        )  # fmt: skip
        await revoke()

        # Ctrl-C there (any interrupt): the same, and the interrupt goes on.
        with pytest.RaisesGroup(Interrupt, flatten_subgroups=True):  # out of the connection's loop, as any interrupt
            await mint_caller(flags_for(space, "half", out, replace=True), ENDPOINT, (), url,
                              steps=CallerSteps(save_final=failing(Interrupt())))  # fmt: skip
        assert load_record(paths.space(STATIC), "half").current.pending and not out.exists()
        await revoke()

        # A process killed between the file and its final record leaves both: the refusal says so.
        kept = tmp_path / "kept.creds"
        steps = CallerSteps(save_final=failing(OSError(5, "Input/output error")),
                            write_file=lambda path, text: (write_creds(path, text), write_creds(kept, text)))  # fmt: skip
        with pytest.raises(ConfigError):
            await mint_caller(flags_for(space, "half", out, replace=True), ENDPOINT, (), url, steps=steps)
        kept.rename(out)  # as if the removal had never run
        record = load_record(paths.space(STATIC), "half").current
        await assert_rerun_refused(space, capsys, "half", out, (
            f"the mint of label half (lifecycle {record.lifecycle_uid}, endpoint {ENDPOINT}) did not finish: its file {out} "
            f"was written but never recorded as handed out, and it connects until revoked - {remedy('half')}"))  # fmt: skip


async def test_a_footprint_failure_after_the_intent_leaves_the_record_pending(space, host, capsys, tmp_path):
    """The space's chat stream exists with another shape: the footprint fails after the intent."""
    out = tmp_path / "fp.creds"
    with trio.fail_after(CEILING_S):
        async with inspector(space) as look:
            body = {"name": f"COTAL_CHAT_{STATIC}", "subjects": [f"cotal.{STATIC}.ch.>"], "storage": "memory"}
            answer = await look.request(f"$JS.API.STREAM.CREATE.COTAL_CHAT_{STATIC}", json.dumps(body).encode())
            assert "error" not in json.loads(answer.data), answer.data
        code, _, err = await cotal(capsys, *argv(space, "fp", out))
        record = load_record(space[1].space(STATIC), "fp").current
        interrupted = (f"the mint of label fp (lifecycle {record.lifecycle_uid}, endpoint {ENDPOINT}) was interrupted after "
                       "its issuance intent: the intent may exist but the file was never handed out, and the mint is not "
                       f"run again blindly - {remedy('fp')}")  # fmt: skip
        sentence = one_sentence(err)
        assert code == 1 and record.pending and sentence.startswith(f"stream COTAL_CHAT_{STATIC}") and sentence.endswith(interrupted), err
        assert not out.exists() and await intents(space) == [f"intent.v1.{record.principal}.{record.lifecycle_uid}"]
        await assert_rerun_refused(space, capsys, "fp", out, interrupted)


# -- the lifetime is checked again right before the intent ---------------------------------------


async def test_a_lifetime_that_ran_out_during_the_describe_is_refused_before_the_intent(space, host, capsys, tmp_path):
    out = tmp_path / "short.creds"
    host.describe_delay_s = 4  # a slow describe: 33 s at planning, under 30 s at the intent
    with trio.fail_after(CEILING_S):
        code, text, err = await cotal(capsys, *argv(space, "short", out, "--expires-in", "33"))
        assert (code, text) == (1, ""), err
        sentence = one_sentence(err)
        assert sentence.startswith("the credential would expire at ") and sentence.endswith(
            "- pass a longer --expires-in (or a later --expires-at): a standalone caller file must outlive its hand-out by "
            "at least 30 s; nothing was written"), sentence
        assert not out.exists() and load_record(space[1].space(STATIC), "short") is None and await intents(space) == []
        host.describe_delay_s = 0
        code, _, err = await cotal(capsys, *argv(space, "short", out, "--expires-in", "20"))
        assert code == 1 and "pass a longer --expires-in" in one_sentence(err)  # refused at planning: nothing asked


# -- a drifted issued store on a static space, and its recovery ----------------------------------


async def test_a_drifted_issued_store_names_the_static_recreate_command_which_recovers_it(space, host, capsys, tmp_path):
    url, paths = space
    backup = tmp_path / "backup"
    with trio.fail_after(CEILING_S):
        code, _, err = await cotal(capsys, *argv(space, "one", tmp_path / "one.creds"))
        assert code == 0, err
        async with inspector(space) as look:  # someone edits the store
            config = await stream_config(look, ISSUED)
            answer = await look.request(f"$JS.API.STREAM.UPDATE.{ISSUED}", json.dumps({**config, "max_msgs": 1000}).encode())
            assert "error" not in json.loads(answer.data), answer.data
        code, _, err = await cotal(capsys, *argv(space, "two", tmp_path / "two.creds"))
        assert code == 1 and one_sentence(err) == (
            f"space {STATIC}'s store {ISSUED} has another shape than issued authority needs (max_msgs is 1000, not -1) and "
            "is refused - stop every process using the space's issued stores first (its endpoint hosts, and anything else "
            f"reading them), then run `cotal auth recreate-issued-stores --space {STATIC} <backup-dir>`"
        ), err
        assert load_record(paths.space(STATIC), "two") is None

        code, text, err = await cotal(capsys, "auth", "recreate-issued-stores", "--space", STATIC, "--root", str(paths.root),
                                      "--server", url, str(backup))  # fmt: skip
        assert code == 0, err
        assert text.splitlines()[0] == (f"recreated space {STATIC}'s issued stores; the old ones are backed up in {backup} "
                                        f"({ISSUED}: 1 messages, KV_cotal_accepted_{STATIC}: 0 messages)")  # fmt: skip
        assert (backup / f"{ISSUED}.jsonl").exists()
        code, _, err = await cotal(capsys, *argv(space, "two", tmp_path / "two.creds"))
        assert code == 0, err

        # The command is a static-space one, and refuses a folder that is not empty.
        code, _, err = await cotal(capsys, "auth", "recreate-issued-stores", "--space", STATIC, "--root", str(paths.root),
                                   "--server", url, str(backup))  # fmt: skip
        assert code == 1 and "is not an empty folder" in one_sentence(err)
