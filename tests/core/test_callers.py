"""Standalone callers, the pure part (cotal_trio/core/callers.py; spec "Standalone callers";
docs/static-credentials.md): the surface's closed shape and digest, the supported surfaces, the
permission builder, the intent's canonical form and TTL, and the host check's every refusal."""

from __future__ import annotations

import dataclasses
import hashlib
import json

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from cotal_trio.core import caller_checks, callers, natsjwt
from cotal_trio.core import credentials as rules
from cotal_trio.core.credentials import Credential, LabelRecord
from cotal_trio.core.errors import CodecError, ConfigError, RefusalCode, Refused
from cotal_trio.core.issued import canonical_json
from cotal_trio.core.nkeys import KeyPair, Prefix
from cotal_trio.core.profiles import WHOLESALE, agent_permissions
from tests.support.callers import (
    ACCOUNT,
    ACTOR,
    DATA,
    ENDPOINT,
    EXP,
    GOOD,
    IAT,
    NONCE,
    OTHER_SIGNER,
    OWNER,
    SIGNER,
    SPACE,
    UID,
    USER,
    caller_jwt,
    caller_permissions,
    make_intent,
)


def answer(surface: dict, *, digest: str | None = None, **extra) -> bytes:
    body = {"ver": 1, "surface": surface, "digest": digest or "sha256:" + hashlib.sha256(canonical_json(surface)).hexdigest()}
    return json.dumps({**body, **extra}).encode()


# -- the surface --------------------------------------------------------------------------------


def test_a_surface_parses_when_its_digest_is_the_sha256_of_its_canonical_json():
    data = answer(GOOD.to_json())
    assert callers.parse_describe_answer(data, endpoint=ENDPOINT) == GOOD
    assert GOOD.digest == "sha256:" + hashlib.sha256(
        b'{"action":false,"endpoint":"weather","ephemeral":true,"journaled":false,"synchronous":true,'
        b'"targeted":false,"verbs":["invoke","forecast"]}'
    ).hexdigest()
    assert callers.render_describe_answer(GOOD) == canonical_json({"ver": 1, "surface": GOOD.to_json(), "digest": GOOD.digest})
    assert callers.parse_describe_answer(callers.render_describe_answer(GOOD), endpoint=ENDPOINT) == GOOD
    assert GOOD.request_verbs == ("describe", "invoke", "forecast")


REFUSE = "endpoint weather answered describe with "


@pytest.mark.parametrize(("change", "sentence"), [
    ({"color": "red"}, REFUSE + "a surface that is not the closed version 1 shape (unknown color)"),
    ({"verbs": ["invoke", "invoke"]}, REFUSE + "surface.verbs lists invoke twice"),
    ({"verbs": ["describe", "describe"]}, REFUSE + "surface.verbs lists describe twice"),
    ({"verbs": ["in.voke"]}, REFUSE + "surface.verbs holds 'in.voke', which is not an endpoint verb"),
    ({"verbs": []}, REFUSE + "surface.verbs must list 1 to 32 verbs"),
    ({"verbs": "invoke"}, REFUSE + "surface.verbs that is not a list"),
    ({"targeted": "no"}, REFUSE + "surface.targeted must be true or false"),
    ({"synchronous": 1}, REFUSE + "surface.synchronous must be true or false"),
    ({"endpoint": "other"}, REFUSE + "surface.endpoint other"),
    ({"endpoint": "v1"}, REFUSE + "surface.endpoint is not an endpoint name"),
])  # fmt: skip
def test_a_malformed_surface_is_refused_naming_the_field(change, sentence):
    with pytest.raises(ConfigError) as refused:
        callers.parse_describe_answer(answer({**GOOD.to_json(), **change}), endpoint=ENDPOINT)
    assert str(refused.value).startswith(sentence)
    assert str(refused.value).endswith("- fix its host's surface (the version 1 shape in docs/static-credentials.md), then mint again")


def test_a_missing_key_another_version_or_extra_member_is_refused():
    surface = {k: v for k, v in GOOD.to_json().items() if k != "action"}
    with pytest.raises(ConfigError, match=r"not the closed version 1 shape \(missing action\)"):
        callers.parse_describe_answer(answer(surface), endpoint=ENDPOINT)
    with pytest.raises(ConfigError, match="with version 2, not 1"):
        callers.parse_describe_answer(answer(GOOD.to_json(), ver=2), endpoint=ENDPOINT)
    with pytest.raises(ConfigError, match="whose keys are not exactly ver, surface, digest"):
        callers.parse_describe_answer(answer(GOOD.to_json(), extra=1), endpoint=ENDPOINT)
    with pytest.raises(ConfigError, match="something that is not JSON"):
        callers.parse_describe_answer(b"\xff", endpoint=ENDPOINT)


def test_a_digest_mismatch_is_refused():
    wrong = "sha256:" + "0" * 64
    with pytest.raises(ConfigError) as refused:
        callers.parse_describe_answer(answer(GOOD.to_json(), digest=wrong), endpoint=ENDPOINT)
    assert str(refused.value) == (
        f"endpoint weather's surface digest {wrong} does not match its surface ({GOOD.digest}) - fix its host: the "
        "digest is the sha256 of the surface's canonical JSON (RFC 8785)"
    )


@pytest.mark.parametrize(("change", "words"), [
    ({"targeted": True}, "a targeted"),
    ({"journaled": True}, "a journaled"),
    ({"action": True}, "an action"),
    ({"synchronous": False}, "an asynchronous"),
    ({"ephemeral": False}, "a non-ephemeral"),
    ({"targeted": True, "ephemeral": False, "action": True}, "a targeted, non-ephemeral, action"),
])  # fmt: skip
def test_only_untargeted_synchronous_ephemeral_surfaces_are_supported(change, words):
    callers.check_supported(GOOD)
    with pytest.raises(ConfigError) as refused:
        callers.check_supported(dataclasses.replace(GOOD, **change))
    assert str(refused.value) == (
        f"endpoint weather is {words} surface: standalone caller files support only untargeted synchronous ephemeral "
        "surfaces - call it from a managed seat or through service caller policy instead"
    )


# -- the permissions ----------------------------------------------------------------------------


def test_the_builder_is_the_agent_footprint_plus_exact_request_rows():
    perms = caller_permissions()
    agent = agent_permissions(space=SPACE, owner=OWNER, actor=ACTOR, allow_publish=("team.>", "ops"),
                              allow_subscribe=("team.>", "ops"), inbox_nonce=NONCE)  # fmt: skip
    ep = f"cotal.{SPACE}.ep.{ENDPOINT}"
    assert perms.pub_allow == (*agent.pub_allow[:-1], f"{ep}.describe.{OWNER}.{ACTOR}", f"{ep}.invoke.{OWNER}.{ACTOR}",
                               f"{ep}.forecast.{OWNER}.{ACTOR}", "$SYS.REQ.USER.INFO")  # fmt: skip
    assert perms.sub_allow == agent.sub_allow == (
        f"cotal.{SPACE}.ch.team.>", f"cotal.{SPACE}.ch.ops", f"cotal.{SPACE}.dm.{OWNER}.{ACTOR}.>", f"_INBOX_{NONCE}.>")
    assert f"cotal.{SPACE}.ch.team.>" in perms.pub_allow and f"cotal.{SPACE}.ch.ops" in perms.pub_allow
    assert not [s for s in perms.pub_allow if ".ctl.spawn" in s or ".ctl.run." in s or ".ctl.stop." in s or ".ctl.persona" in s]
    with pytest.raises(Refused, match="v1"):
        caller_permissions(endpoint="v1")


channel = st.from_regex(r"([a-z0-9_-]{1,5}|\*)(\.([a-z0-9_-]{1,5}|\*)){0,2}(\.>)?|>", fullmatch=True)
verb = st.from_regex(r"[A-Za-z0-9_-]{1,10}", fullmatch=True)


@settings(max_examples=200)
@given(st.lists(channel, max_size=4), st.lists(verb, min_size=1, max_size=5, unique=True),
       st.from_regex(r"[A-Za-z0-9_-]{1,12}", fullmatch=True))  # fmt: skip
@example(chans=[], verbs=["0"], space="ep")  # the clean-clone run's falsifying case: the test's own filter was wrong
def test_the_builder_adds_no_wholesale_grant_and_stays_in_its_space(chans, verbs, space):
    perms = caller_permissions(space=space, channels=tuple(chans), verbs=tuple(verbs))
    agent_wholesale = {g.replace("<S>", space) for g in WHOLESALE["agent"]}
    wholesale = [g for g in perms.pub_allow if g.startswith(("$JS.API.STREAM.MSG.GET", "$JS.API.DIRECT.GET", "$KV.")) or g in ("$JS.>", "$JS.API.>")]
    assert {g for g in wholesale if not g.startswith("$KV.cotal_presence_")} == agent_wholesale
    assert all(g.startswith((f"cotal.{space}.", "$JS.", "$KV.", "$SYS.REQ.USER.INFO", "_INBOX_")) for g in perms.pub_allow + perms.sub_allow)
    rows = [g for g in perms.pub_allow if g.startswith(f"cotal.{space}.ep.")]  # a space named ep: every subject has ".ep."
    assert rows == [f"cotal.{space}.ep.{ENDPOINT}.{v}.{OWNER}.{ACTOR}" for v in dict.fromkeys(("describe", *verbs))]


def test_the_minter_holds_the_provisioner_the_issued_stores_one_intent_key_and_describe():
    perms = callers.minter_permissions(space=SPACE, owner=OWNER, actor=ACTOR, uid=UID, endpoint=ENDPOINT, inbox_nonce=NONCE)
    assert f"$KV.cotal_issued_{SPACE}.intent.v1.{OWNER}.{ACTOR}.{UID}" in perms.pub_allow
    assert f"cotal.{SPACE}.ep.{ENDPOINT}.describe.{OWNER}.{ACTOR}" in perms.pub_allow
    assert f"$JS.API.STREAM.CREATE.KV_cotal_issued_{SPACE}" in perms.pub_allow
    assert not [g for g in perms.pub_allow if g.endswith(".>") and g.startswith("$KV.")]
    assert perms.sub_allow == (f"_INBOX_{NONCE}.>",)


def test_the_ceiling_digest_ignores_list_order():
    perms = caller_permissions().to_nats()
    shuffled = {"pub": {"allow": list(reversed(perms["pub"]["allow"]))}, "sub": perms["sub"]}
    assert callers.ceiling_digest(perms) == callers.ceiling_digest(shuffled)
    assert callers.ceiling_digest(perms) != callers.ceiling_digest(caller_permissions(channels=("ops",)).to_nats())


# -- the intent ---------------------------------------------------------------------------------


def test_the_intent_is_canonical_json_of_exactly_its_keys_and_holds_no_credential():
    intent = make_intent()
    data = callers.render_intent(intent)
    assert json.loads(data) == {
        "ver": 1, "space": SPACE, "endpoint": ENDPOINT, "owner": OWNER, "actor": ACTOR, "uid": UID,
        "userKey": USER.public_key, "surface": GOOD.digest, "ceiling": intent.ceiling, "issuedAt": IAT, "expiresAt": EXP,
    }  # fmt: skip
    assert data == canonical_json(json.loads(data)) and b"eyJ" not in data and USER.seed.encode() not in data
    assert callers.parse_intent(data) == intent == callers.parse_intent(json.loads(data))
    assert intent.key == f"intent.v1.{OWNER}.{ACTOR}.{UID}"
    with pytest.raises(CodecError, match="canonical"):
        callers.parse_intent(json.dumps(json.loads(data), indent=1).encode())
    with pytest.raises(CodecError, match="exactly its keys"):
        callers.parse_intent({**json.loads(data), "jwt": "x"})
    with pytest.raises(CodecError, match="expiresAt is malformed"):
        make_intent(expires_at=IAT)


def test_the_intent_ttl_is_expiry_plus_sixty_from_now():
    assert callers.intent_ttl_s(make_intent(), now=IAT) == EXP + 60 - IAT
    assert callers.intent_ttl_s(make_intent(), now=IAT + 0.5) == EXP + 60 - IAT
    assert callers.intent_ttl_s(make_intent(), now=EXP + 100) == 1


# -- the host check -----------------------------------------------------------------------------


def check(jwt: str, *, verb="invoke", subject=None, intent=None, now=IAT + 10, surface=GOOD, account=DATA):
    subject = subject or f"cotal.{SPACE}.ep.{ENDPOINT}.{verb}.{OWNER}.{ACTOR}"
    return caller_checks.check_standalone_caller(
        jwt, subject=subject, space=SPACE, endpoint=ENDPOINT, surface=surface, account=account,
        intent=callers.render_intent(intent or make_intent()), now=now,
    )  # fmt: skip


def test_the_host_accepts_the_minted_caller_for_describe_and_each_verb():
    for verb in ("describe", "invoke", "forecast"):
        found = check(caller_jwt(), verb=verb)
        assert (found.verb, found.intent) == (verb, make_intent())


EXTRA = [*caller_permissions(verbs=GOOD.verbs).to_nats()["pub"]["allow"], f"cotal.{SPACE}.ctl.spawn"]
SWAPPED = caller_permissions(verbs=GOOD.verbs, channels=("everything", ">")).to_nats()


@pytest.mark.parametrize(("jwt", "kwargs", "code", "reason"), [
    (caller_jwt(signer=OTHER_SIGNER), {}, RefusalCode.BAD_CREDENTIAL, "its JWT is not signed by a current signing key of the space's data account"),
    (caller_jwt(user=KeyPair.generate(Prefix.USER)), {}, RefusalCode.NOT_GRANTED, "its JWT's user key is not its intent's"),
    (caller_jwt(), {"now": EXP}, RefusalCode.BAD_CREDENTIAL, f"its JWT is outside its time window [{IAT}, {EXP}) at {EXP} - mint it again"),
    (caller_jwt(), {"now": IAT - 6}, RefusalCode.BAD_CREDENTIAL, f"its JWT is outside its time window [{IAT}, {EXP}) at {IAT - 6} - mint it again"),
    (caller_jwt(exp=EXP + 10), {}, RefusalCode.BAD_CREDENTIAL, "its JWT's issue and expiry times are not its intent's"),
    (caller_jwt(perms={"pub": {"allow": EXTRA}, "sub": caller_permissions(verbs=GOOD.verbs).to_nats()["sub"]}), {},
     RefusalCode.NOT_GRANTED, "its JWT's permissions are not what the standalone caller builder made for its intent"),
    (caller_jwt(perms=SWAPPED), {}, RefusalCode.NOT_GRANTED, "its JWT's permissions are not what the standalone caller builder made for its intent"),
    (caller_jwt(principal=f"{OWNER}.other"), {}, RefusalCode.NOT_GRANTED,
     f"the request is addressed as {OWNER}.{ACTOR}, not as its JWT's principal {OWNER}.other"),
    (caller_jwt(principal=f"{OWNER}.other"), {"intent": make_intent(actor="other"), "subject": f"cotal.{SPACE}.ep.{ENDPOINT}.invoke.{OWNER}.other"},
     RefusalCode.NOT_GRANTED, "its JWT's permissions are not what the standalone caller builder made for its intent"),
    (caller_jwt(uid="d" * 26), {}, RefusalCode.NOT_GRANTED, "its JWT's principal or lifecycle tag is not its intent's"),
    (caller_jwt(), {"verb": "delete"}, RefusalCode.FORBIDDEN, "delete is not describe or a verb of endpoint weather"),
    (caller_jwt(), {"subject": f"cotal.{SPACE}.ep.{ENDPOINT}.invoke.{OWNER}.other"}, RefusalCode.NOT_GRANTED,
     f"the request is addressed as {OWNER}.other, not as its JWT's principal {OWNER}.{ACTOR}"),
    (caller_jwt(), {"subject": f"cotal.{SPACE}.ep.other.invoke.{OWNER}.{ACTOR}"}, RefusalCode.FORBIDDEN,
     f"cotal.{SPACE}.ep.other.invoke.{OWNER}.{ACTOR} is not a request on endpoint weather's legacy rail"),
    (caller_jwt(), {"surface": dataclasses.replace(GOOD, verbs=("invoke",))}, RefusalCode.NOT_GRANTED,
     "its intent was minted for another endpoint or surface than weather"),
    (caller_jwt()[:-4] + "AAAA", {}, RefusalCode.BAD_CREDENTIAL, "its JWT's signature does not verify - send the JWT of the minted .creds"),
])  # fmt: skip
def test_the_host_refuses_each_failed_check_with_its_reason(jwt, kwargs, code, reason):
    with pytest.raises(Refused) as refused:
        check(jwt, **kwargs)
    assert refused.value.code is code
    assert refused.value.detail.startswith(f"standalone caller refused: {reason}")


def test_an_intent_that_does_not_parse_is_refused():
    with pytest.raises(Refused, match="its issuance intent is unreadable"):
        caller_checks.check_standalone_caller(caller_jwt(), subject=f"cotal.{SPACE}.ep.{ENDPOINT}.invoke.{OWNER}.{ACTOR}", space=SPACE,
                                        endpoint=ENDPOINT, surface=GOOD, account=DATA, intent=b"{}", now=IAT)  # fmt: skip


def test_account_signers_reads_plain_and_scoped_keys():
    claims = {"nats": {"signing_keys": [SIGNER.public_key, {"kind": "user_scope", "key": OTHER_SIGNER.public_key}, "junk"]}}
    assert caller_checks.account_signers(claims) == {SIGNER.public_key, OTHER_SIGNER.public_key}
    claims = {"sub": ACCOUNT, "nats": {**claims["nats"], "revocations": {USER.public_key: IAT, "*": 5, "bad": "x"}}}
    assert caller_checks.DataAccount.from_claims(claims) == caller_checks.DataAccount(
        key=ACCOUNT, signers=frozenset({SIGNER.public_key, OTHER_SIGNER.public_key}), revocations={USER.public_key: IAT, "*": 5})


# -- the record ---------------------------------------------------------------------------------


def caller_credential(**change) -> Credential:
    fields = {"label": ACTOR, "space": SPACE, "profile": "agent", "owner": OWNER, "actor": ACTOR, "lifecycle_uid": UID,
              "user_key": USER.public_key, "issued_at": IAT, "expires_at": EXP, "path": "/x/bot.creds", "inbox_nonce": NONCE,
              "allow_publish": ("ops",), "allow_subscribe": ("ops",), "endpoint": ENDPOINT, "surface_digest": GOOD.digest,
              "verbs": GOOD.verbs, "pending": True} | change  # fmt: skip
    return Credential(**fields)


def test_a_caller_record_round_trips_and_an_older_record_still_reads():
    cred = caller_credential()
    obj = cred.to_json()
    assert (obj["endpoint"], obj["surfaceDigest"], obj["verbs"], obj["pending"]) == (ENDPOINT, GOOD.digest, ["invoke", "forecast"], True)
    assert Credential.from_json(obj) == cred
    old = {k: v for k, v in obj.items() if k not in ("endpoint", "surfaceDigest", "verbs", "pending")}
    plain = Credential.from_json(old)
    assert (plain.endpoint, plain.verbs, plain.pending) == (None, (), False) and set(plain.to_json()) == set(old)
    for bad in ({"role": "ops"}, {"allow_subscribe": ("other",)}, {"expires_at": None}, {"verbs": ()}, {"profile": "observer"}):
        with pytest.raises(CodecError, match="malformed standalone caller"):
            caller_credential(**bad)


def test_an_interrupted_mint_refuses_the_label_naming_its_uid_and_the_remedy():
    record = LabelRecord(current=caller_credential())
    remedy = f"run `cotal auth revoke-credential {ACTOR} --space {SPACE}`, then mint again with --replace"
    no_file = (
        f"the mint of label {ACTOR} (lifecycle {UID}, endpoint {ENDPOINT}) was interrupted after its issuance intent: the "
        f"intent may exist but the file was never handed out, and the mint is not run again blindly - {remedy}"
    )
    a_file = (
        f"the mint of label {ACTOR} (lifecycle {UID}, endpoint {ENDPOINT}) did not finish: its file /x/bot.creds was "
        f"written but never recorded as handed out, and it connects until revoked - {remedy}"
    )
    for replace in (False, True):
        for pending_file, sentence in ((False, no_file), (True, a_file)):
            with pytest.raises(ConfigError) as refused:
                rules.check_replace(record, replace=replace, space=SPACE, now=IAT + 1, pending_file=pending_file)
            assert str(refused.value) == sentence
    revoked = LabelRecord(current=caller_credential(revoked_at=IAT + 2))
    rules.check_replace(revoked, replace=True, space=SPACE, now=IAT + 3)  # the remedy works
    fix = (f"cotal auth revoke-credential {ACTOR} --space {SPACE} && cotal auth mint --space {SPACE} --profile agent "
           f"--label {ACTOR} --endpoint {ENDPOINT} --out /x/bot.creds --channels ops --replace")  # fmt: skip
    [finding] = rules.credential_findings(record, now=IAT + 1, flags=f"--space {SPACE}", identity=None)
    assert (finding.problem, finding.next) == (
        f"its standalone-caller mint (lifecycle {UID}) was interrupted after its issuance intent; its file was never handed out", fix)
    [finding] = rules.credential_findings(record, now=IAT + 1, flags=f"--space {SPACE}", identity="/x/bot.creds")
    assert (finding.problem, finding.next) == (
        f"its standalone-caller mint (lifecycle {UID}) did not finish: its file was written but never recorded as handed "
        "out, and it connects until revoked", fix)
    assert rules.receipt(caller_credential(pending=False), replaced=False)["verbs"] == ["invoke", "forecast"]


def test_doctor_shows_a_live_pending_credential_as_pending_not_healthy():
    """Found by the fresh-user check: doctor's table said ``healthy`` beside the finding that
    the mint was interrupted."""
    assert rules.classify(caller_credential(), now=IAT + 1) is rules.Health.PENDING
    assert rules.classify(caller_credential(pending=False), now=IAT + 1) is rules.Health.HEALTHY
    assert rules.classify(caller_credential(revoked_at=IAT + 2), now=IAT + 3) is rules.Health.REVOKED
    assert rules.classify(caller_credential(), now=EXP) is rules.Health.EXPIRED


# -- review fixes -------------------------------------------------------------------------------

BUILT = caller_permissions(verbs=GOOD.verbs).to_nats()


@pytest.mark.parametrize("perms", [
    {"pub": "x"},
    {"sub": ["a"]},
    {"pub": {"allow": "x"}},
    {"pub": {"allow": [1, 2]}},
    {"sub": {"allow": BUILT["sub"]["allow"], "deny": "x"}},
    {"pub": None},
])  # fmt: skip
def test_a_malformed_permission_fragment_is_a_refusal_not_a_crash(perms):
    with pytest.raises(Refused) as refused:
        check(forged_jwt(nats=perms))
    assert refused.value.code is RefusalCode.NOT_GRANTED
    assert refused.value.detail.startswith(
        "standalone caller refused: its JWT's permissions are not what the standalone caller builder made for its intent")


def forged_jwt(*, nats: dict | None = None, top: dict | None = None) -> str:
    """The good caller JWT's claims with ``nats`` and top-level members added, re-signed by the signer."""
    claims = natsjwt.decode(caller_jwt()).claims
    claims = {k: v for k, v in claims.items() if k not in ("iss", "iat", "jti")} | (top or {})
    claims["nats"] = {**claims["nats"], **(nats or {})}
    return natsjwt.encode(claims, SIGNER, iat=IAT)


@pytest.mark.parametrize(("nats", "top", "named"), [
    ({"bearer_token": True}, None, "nats.bearer_token"),
    ({"resp": {"max": 1, "ttl": 0}}, None, "nats.resp"),
    ({"src": ["10.0.0.0/8"]}, None, "nats.src"),
    ({"allowed_connection_types": ["WEBSOCKET"]}, None, "nats.allowed_connection_types"),
    ({"subs": 5}, None, "nats.subs"),
    ({"times": [{"start": "00:00:00", "end": "01:00:00"}]}, None, "nats.times"),
    ({"tags": ["principal:" + OWNER + "." + ACTOR, "lifecycle:" + UID, "profile:agent", "admin:yes"]}, None, "nats.tags"),
    (None, {"aud": "someone"}, "aud"),
    (None, {"name": "someone-else"}, "name"),
])  # fmt: skip
def test_claims_the_mint_does_not_write_are_refused_naming_them(nats, top, named):
    with pytest.raises(Refused) as refused:
        check(forged_jwt(nats=nats, top=top))
    assert refused.value.code is RefusalCode.NOT_GRANTED
    assert refused.value.detail.startswith("standalone caller refused: its JWT carries claims the mint does not write")
    assert named in refused.value.detail


def test_an_owner_that_is_not_a_derived_owner_is_refused():
    with pytest.raises(Refused, match="an intent key needs an owner"):
        callers.intent_key("bot", ACTOR, UID)
    with pytest.raises(CodecError, match="owner is malformed"):
        make_intent(owner="bot")


@pytest.mark.parametrize(("revocations", "refused"), [
    ({USER.public_key: IAT}, True),  # revoked at its iat: nats-server refuses it too
    ({USER.public_key: IAT + 5}, True),
    ({"*": IAT}, True),  # every user issued at or before
    ({USER.public_key: IAT - 1}, False),  # an earlier JWT of the key was revoked, not this one
    ({KeyPair.generate(Prefix.USER).public_key: IAT}, False),
])  # fmt: skip
def test_a_revoked_user_key_is_refused_as_the_broker_would(revocations, refused):
    account = dataclasses.replace(DATA, revocations=revocations)
    if not refused:
        assert check(caller_jwt(), account=account).verb == "invoke"
        return
    with pytest.raises(Refused) as caught:
        check(caller_jwt(), account=account)
    assert caught.value.code is RefusalCode.BAD_CREDENTIAL
    assert caught.value.detail.startswith(f"standalone caller refused: its user key was revoked at {max(revocations.values())}")


def test_the_checks_that_need_no_intent_run_without_one():
    """check_caller_jwt decides signature, issuer, revocation, window and tags with no intent at
    hand; what it returns selects the intent's key."""
    subject = f"cotal.{SPACE}.ep.{ENDPOINT}.forecast.{OWNER}.{ACTOR}"
    found = caller_checks.check_caller_jwt(caller_jwt(), subject=subject, space=SPACE, endpoint=ENDPOINT, surface=GOOD,
                                     account=DATA, now=IAT + 1)  # fmt: skip
    assert (found.owner, found.actor, found.uid, found.verb) == (OWNER, ACTOR, UID, "forecast")
    assert callers.intent_key(found.owner, found.actor, found.uid) == make_intent().key
    for jwt in (caller_jwt(signer=OTHER_SIGNER), caller_jwt()[:-4] + "AAAA"):
        with pytest.raises(Refused) as refused:
            caller_checks.check_caller_jwt(jwt, subject=subject, space=SPACE, endpoint=ENDPOINT, surface=GOOD, account=DATA, now=IAT + 1)
        assert refused.value.code is RefusalCode.BAD_CREDENTIAL
    intent = callers.render_intent(make_intent())
    assert caller_checks.check_caller_intent(found, intent, space=SPACE, endpoint=ENDPOINT, surface=GOOD, account=DATA).verb == "forecast"


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8) | st.sampled_from(["_INBOX_nonce1234.>", f"cotal.{SPACE}.ch.a"]),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from(["allow", "deny", "max", "x"]), inner, max_size=3),
    max_leaves=8,
)  # fmt: skip


@settings(max_examples=300)
@given(st.sampled_from(["pub", "sub", "tags", "subs", "resp", "issuer_account", "type", "src"]), json_values)
def test_any_claim_value_is_a_refusal_or_the_minted_one_never_a_crash(member, value):
    try:
        check(forged_jwt(nats={member: value}))
    except Refused:
        return
    assert natsjwt.decode(caller_jwt()).claims["nats"].get(member) == value


def test_wire_layout_prints_both_standalone_caller_builders():
    """docs/wire-layout.md "Standalone caller (`auth mint --endpoint`)" lists every row the two
    builders make, with its placeholders."""
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "docs" / "wire-layout.md").read_text()
    start = text.index("### Standalone caller (`auth mint --endpoint`)")
    section = text[start:text.index("## Wholesale grants", start)]
    owner, uid = "u_" + "o" * 26, "9" * 26
    names = {owner: "<o>", "ACTOR9": "<a>", "NONCE9999": "<nonce>", "EP9": "<endpoint>", uid: "<uid>", "CH9": "<p>", "VERB9": "<verb>"}

    def placeholders(subject: str) -> str:
        for value, name in names.items():
            subject = subject.replace(value, name)
        return subject

    caller = callers.standalone_caller_permissions(space="S", owner=owner, actor="ACTOR9", channels=("CH9",),
                                                   inbox_nonce="NONCE9999", endpoint="EP9", verbs=("VERB9",))  # fmt: skip
    minter = callers.minter_permissions(space="S", owner=owner, actor="ACTOR9", uid=uid, endpoint="EP9", inbox_nonce="NONCE9999")
    provisioner = set(profiles_for_doc("S", "NONCE9999"))
    rows = [*caller.pub_allow, *caller.sub_allow, *(g for g in minter.pub_allow if g not in provisioner), *minter.sub_allow]
    missing = [placeholders(g) for g in rows if f"`{placeholders(g)}`" not in section]
    assert missing == []


def profiles_for_doc(space: str, nonce: str) -> tuple[str, ...]:
    from cotal_trio.core.profiles import provisioner_permissions

    return provisioner_permissions(space=space, inbox_nonce=nonce).pub_allow
