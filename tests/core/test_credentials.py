"""The static credential rules: lifetime, the record, --replace, revocations, doctor's verdicts."""

from __future__ import annotations

import dataclasses

import pytest

from cotal_trio.core import credentials as rules
from cotal_trio.core import natsjwt
from cotal_trio.core.credentials import Credential, Health, LabelRecord, Severity
from cotal_trio.core.errors import CodecError, ConfigError
from cotal_trio.core.identity import derive_owner
from cotal_trio.core.nkeys import KeyPair, Prefix

NOW = 1_800_000_000
DAY = 86_400
OWNER = "u_rbxbyevw4etgpbzfupdhu2zxwe"
KEY = KeyPair.from_raw(Prefix.USER, bytes(32)).public_key
OTHER_KEY = KeyPair.from_raw(Prefix.USER, bytes([1]) * 32).public_key
UID = "0" * 26
FLAGS = "--space st"


def cred(**overrides) -> Credential:
    fields = {
        "label": "bot", "space": "st", "profile": "agent", "owner": OWNER, "actor": "bot",
        "lifecycle_uid": UID, "user_key": KEY, "issued_at": NOW, "expires_at": NOW + DAY,
        "path": "/r/auth/creds/bot.creds", "inbox_nonce": "nonce_0123456789",
        "allow_publish": ("team.news",), "allow_subscribe": ("team.>",),
    }  # fmt: skip
    return Credential(**{**fields, **overrides})


# -- lifetime ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(("flags", "expected"), [
    ({}, NOW + DAY),
    ({"expires_in": 600}, NOW + 600),
    ({"expires_at": NOW + 5}, NOW + 5),
    ({"no_expiry": True}, None),
])  # fmt: skip
def test_expiry_from_the_flags(flags, expected):
    given = {"expires_in": None, "expires_at": None, "no_expiry": False, **flags}
    assert rules.choose_expiry(now=NOW, **given) == expected


@pytest.mark.parametrize(("flags", "sentence"), [
    ({"expires_in": 600, "no_expiry": True}, "--expires-in and --no-expiry both set the lifetime - pass at most one of them"),
    ({"expires_in": 1, "expires_at": NOW + 9}, "--expires-in and --expires-at both set the lifetime"),
    ({"expires_in": 0}, "--expires-in 0 is not a lifetime - pass seconds above 0"),
    ({"expires_at": NOW}, f"--expires-at {NOW} is not in the future (now is {NOW})"),
])  # fmt: skip
def test_expiry_flags_refused(flags, sentence):
    given = {"expires_in": None, "expires_at": None, "no_expiry": False, **flags}
    with pytest.raises(ConfigError) as caught:
        rules.choose_expiry(now=NOW, **given)
    assert str(caught.value).startswith(sentence)


# -- health -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(("overrides", "now", "health"), [
    ({}, NOW + 1, Health.HEALTHY),
    ({}, NOW + DAY - 8641, Health.HEALTHY),            # 2 h 24 min 1 s left: above 10 % of a day
    ({}, NOW + DAY - 8639, Health.NEAR_EXPIRY),        # under 10 % of the lifetime left
    ({"expires_at": NOW + 30 * DAY}, NOW + 30 * DAY - 3599, Health.NEAR_EXPIRY),  # 10 % is 3 days; under 1 h left
    ({"expires_at": NOW + 1800}, NOW, Health.HEALTHY),  # a short credential is healthy when minted (was near-expiry)
    ({"expires_at": NOW + 1800}, NOW + 1621, Health.NEAR_EXPIRY),  # 179 s left: under 10 % of 30 min
    ({}, NOW + DAY, Health.EXPIRED),                   # at exp the broker refuses it
    ({"expires_at": None}, NOW + 10 * DAY, Health.NO_EXPIRY),
    ({"revoked_at": NOW + 5}, NOW + 10, Health.REVOKED),
])  # fmt: skip
def test_classify(overrides, now, health):
    assert rules.classify(cred(**overrides), now=now) is health


# -- the record -------------------------------------------------------------------------------------


def test_record_json_round_trip_and_strictness():
    record = LabelRecord(current=cred(revoked_at=NOW + 3), replaced=(cred(expires_at=None, user_key=OTHER_KEY),))
    obj = record.to_json()
    assert obj["ver"] == 1 and obj["current"]["userKey"] == KEY and obj["current"]["revokedAt"] == NOW + 3
    assert obj["current"]["allowPublish"] == ["team.news"] and obj["replaced"][0]["expiresAt"] is None
    assert LabelRecord.from_json(obj) == record
    with pytest.raises(CodecError, match="not an object of the credential fields"):
        Credential.from_json({**obj["current"], "extra": 1})
    with pytest.raises(CodecError, match="malformed user key"):
        Credential.from_json({**obj["current"], "userKey": "A" + KEY[1:]})
    with pytest.raises(CodecError, match="malformed expiry"):
        cred(expires_at=NOW)
    with pytest.raises(CodecError, match="mixes the credentials of two labels"):
        LabelRecord(current=cred(), replaced=(cred(label="other"),))


def test_replace_keeps_what_still_matters():
    revoked = cred(revoked_at=NOW + 5, user_key=OTHER_KEY)
    unbounded = cred(expires_at=None, lifecycle_uid="1" * 26)
    expired = cred(expires_at=NOW + 10, lifecycle_uid="2" * 26)
    record = LabelRecord(current=unbounded, replaced=(revoked, expired))
    fresh = cred(lifecycle_uid="3" * 26, issued_at=NOW + 100, expires_at=NOW + 100 + DAY)
    after = record.replace_with(fresh, now=NOW + 100)
    assert after.current == fresh
    assert after.replaced == (unbounded, revoked)  # the expired one is dropped
    assert rules.unbounded_replaced(after) == (unbounded,)


def test_check_replace():
    rules.check_replace(None, replace=False, space="st", now=NOW)
    rules.check_replace(None, replace=True, space="st", now=NOW)
    live = LabelRecord(current=cred())
    with pytest.raises(ConfigError) as caught:
        rules.check_replace(live, replace=True, space="st", now=NOW + 10)
    assert str(caught.value) == (
        f"label bot already has a live credential, which cannot be replaced: it is live until {NOW + DAY} "
        f"({DAY - 10} s left) - revoke it first with `cotal auth revoke-credential bot --space st`, "
        "or choose another --label"
    )
    for current, state in [
        (cred(), f"it expired at {NOW + DAY}"),
        (cred(expires_at=None), "it has no expiry"),
        (cred(revoked_at=NOW + 1), f"its key was revoked at {NOW + 1}"),
    ]:
        record, now = LabelRecord(current=current), NOW + DAY
        with pytest.raises(ConfigError) as caught:
            rules.check_replace(record, replace=False, space="st", now=now)
        assert str(caught.value) == f"label bot already has a credential ({state}) - pass --replace to replace it"
        rules.check_replace(record, replace=True, space="st", now=now)


def test_issue_time_passes_every_revocation_of_the_key():
    record = LabelRecord(current=cred(revoked_at=NOW + 50))
    assert rules.issue_time(record, KEY, now=NOW + 50) == NOW + 51
    assert rules.issue_time(record, KEY, now=NOW + 90) == NOW + 90
    assert rules.issue_time(record, OTHER_KEY, now=NOW + 50) == NOW + 50
    assert rules.issue_time(None, KEY, now=NOW) == NOW


def test_revocations_map():
    a = LabelRecord(current=cred(revoked_at=NOW + 9), replaced=(cred(revoked_at=NOW + 4, lifecycle_uid="1" * 26),))
    b = LabelRecord(current=cred(label="b", user_key=OTHER_KEY, revoked_at=NOW + 2, expires_at=NOW + 3))
    c = LabelRecord(current=cred(label="c", user_key=OTHER_KEY, expires_at=None))
    assert rules.revocations([a, b, c], now=NOW + 3) == {KEY: NOW + 9}  # b expired; c not revoked
    assert rules.revocations([b], now=NOW + 2) == {OTHER_KEY: NOW + 2}


def test_account_claims_with_revocations():
    signer = KeyPair.from_raw(Prefix.OPERATOR, bytes([2]) * 32)
    account = KeyPair.from_raw(Prefix.ACCOUNT, bytes([3]) * 32).public_key
    jwt = natsjwt.encode(natsjwt.account_claims(account=account, name="st", signing_keys=["A" * 56]), signer, iat=NOW)
    claims = natsjwt.verify(jwt)
    assert rules.missing_revocations(claims, {KEY: NOW}) == {KEY: NOW}
    revoked = rules.with_revocations(claims, {KEY: NOW})
    assert "iss" not in revoked and "jti" not in revoked and "iat" not in revoked
    resigned = natsjwt.verify(natsjwt.encode(revoked, signer, iat=NOW + 1))
    assert resigned["nats"]["revocations"] == {KEY: NOW}
    assert {k: v for k, v in resigned["nats"].items() if k != "revocations"} == claims["nats"]
    assert rules.missing_revocations(resigned, {KEY: NOW}) == {}
    assert rules.missing_revocations(resigned, {KEY: NOW + 1}) == {KEY: NOW + 1}
    assert "revocations" not in rules.with_revocations(resigned, {})["nats"]


# -- the JWT and the receipt ------------------------------------------------------------------------


def test_claims_and_principal_round_trip():
    minted = cred()
    claims = rules.credential_claims(minted, data_account="ADATA", permissions={"pub": {"allow": ["a"]}, "sub": {"deny": [">"]}})
    assert claims["sub"] == KEY and claims["exp"] == NOW + DAY and claims["name"] == f"{OWNER}-bot"
    assert claims["nats"]["issuer_account"] == "ADATA"
    assert claims["nats"]["pub"] == {"allow": ["a"]} and claims["nats"]["sub"] == {"deny": [">"]}
    assert claims["nats"]["tags"] == [
        f"owner:{OWNER}", "actor:bot", f"principal:{OWNER}.bot", "profile:agent", f"lifecycle:{UID}", "label:bot",
    ]
    assert rules.principal_of_claims(claims) == (OWNER, "bot")
    assert "exp" not in rules.credential_claims(cred(expires_at=None), data_account="A", permissions={})
    with pytest.raises(ConfigError, match="names no principal"):
        rules.principal_of_claims({"nats": {"tags": ["owner:x"]}})


def test_receipt():
    assert rules.receipt(cred(), replaced=False) == {
        "space": "st", "label": "bot", "principal": f"{OWNER}.bot", "profile": "agent", "lifecycleUid": UID,
        "userKey": KEY, "issuedAt": NOW, "expiresAt": NOW + DAY, "path": "/r/auth/creds/bot.creds",
        "inboxPrefix": "_INBOX_nonce_0123456789", "replaced": False,
    }  # fmt: skip


def test_static_owner_is_the_derivation_of_the_root():
    secret = bytes(range(32))
    assert rules.static_owner(secret) == derive_owner(secret, "cotal:static", "root")


def test_labels():
    assert rules.check_label("ops_1") == "ops_1"
    for bad in ("", "a.b", "a-b", "x" * 65):
        with pytest.raises(ConfigError, match="--label is 1 to 64 letters, digits and _"):
            rules.check_label(bad)


# -- doctor -----------------------------------------------------------------------------------------


def test_findings_per_health():
    healthy = rules.credential_findings(LabelRecord(current=cred()), now=NOW + 1, flags=FLAGS, identity=None)
    assert healthy == [] and rules.verdict(healthy) == (True, "healthy")

    warning = rules.credential_findings(LabelRecord(current=cred(expires_at=None)), now=NOW, flags=FLAGS, identity=None)
    assert [(f.severity, f.problem) for f in warning] == [
        (Severity.WARNING, "minted with --no-expiry: it connects until its key is revoked")
    ]
    assert warning[0].next == "cotal auth revoke-credential bot --space st"
    assert rules.verdict(warning) == (True, "healthy")

    expired = rules.credential_findings(LabelRecord(current=cred()), now=NOW + DAY, flags=FLAGS, identity=None)
    assert [(f.severity, f.problem) for f in expired] == [(Severity.FINDING, f"expired at {NOW + DAY}")]
    mint = ("cotal auth mint --space st --profile agent --label bot --allow-publish team.news "
            "--allow-subscribe 'team.>' --replace")  # fmt: skip (quoted: > is a shell redirect)
    assert rules.verdict(expired) == (False, f"next: {mint}")

    near = rules.credential_findings(LabelRecord(current=cred(expires_at=NOW + 600)), now=NOW + 550, flags=FLAGS, identity="/f.creds")
    assert near[0].problem == f"expires at {NOW + 600}, in 50 s"  # under 10 % of its 600 s left
    assert near[0].next == (
        "cotal auth revoke-credential bot --space st && cotal auth mint --space st --profile agent --label bot "
        "--allow-publish team.news --allow-subscribe 'team.>' --expires-in 600 --identity /f.creds --replace"
    )


def test_an_unbounded_replaced_credential_is_a_finding():
    old = cred(expires_at=None, user_key=OTHER_KEY, lifecycle_uid="1" * 26)
    found = rules.credential_findings(LabelRecord(current=cred(), replaced=(old,)), now=NOW, flags=FLAGS, identity=None)
    assert [(f.severity, f.subject, f.next) for f in found] == [(
        Severity.FINDING, f"replaced credential bot key {OTHER_KEY} (space st)",
        f"cotal auth revoke-credential bot --space st --key {OTHER_KEY}",
    )]
    revoked = dataclasses.replace(old, revoked_at=NOW)
    assert rules.credential_findings(LabelRecord(current=cred(), replaced=(revoked,)), now=NOW, flags=FLAGS, identity=None) == []


@pytest.mark.parametrize(
    ("expires_in", "expires_at"), [(10**17, None), (None, 10**20), (None, 253402300800)],
)
def test_an_expiry_past_year_9999_is_refused_naming_no_expiry(expires_in, expires_at):
    # --expires-at 99999999999999999999 escaped as an OverflowError traceback
    with pytest.raises(ConfigError, match="9999-12-31.*--no-expiry"):
        rules.choose_expiry(now=NOW, expires_in=expires_in, expires_at=expires_at, no_expiry=False)
    assert rules.choose_expiry(now=NOW, expires_in=None, expires_at=253402300799, no_expiry=False) == 253402300799
