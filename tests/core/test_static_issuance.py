"""A static agent credential is an issuance: its rows, evidence, source, durables and renewal rule
(cotal_trio/core/static_issuance.py; issue 19 items 2 and 3; spec credential-authority "Issued
authority", "Provisioning")."""

from __future__ import annotations

import dataclasses

import pytest

from cotal_trio.core import static_issuance as si
from cotal_trio.core import wire
from cotal_trio.core.credentials import Credential, receipt
from cotal_trio.core.errors import CodecError, ConfigError
from cotal_trio.core.issued import STATIC_AGENT_HORIZON_S, Source, ceiling_from_native, new_generation
from cotal_trio.core.nkeys import KeyPair, Prefix
from cotal_trio.core.profiles import provisioner_permissions

NOW = 1_800_000_000
OWNER = "u_rbxbyevw4etgpbzfupdhu2zxwe"
UID = "a" * 26
GENERATION = new_generation(NOW + STATIC_AGENT_HORIZON_S, bytes(range(12)))
TOKEN = "0123456789abcdef" * 2
KEY = KeyPair.from_raw(Prefix.USER, bytes(32)).public_key


def cred(**overrides) -> Credential:
    fields = {
        "label": "bot", "space": "st", "profile": "agent", "owner": OWNER, "actor": "bot", "lifecycle_uid": UID,
        "user_key": KEY, "issued_at": NOW, "expires_at": NOW + 86_400, "path": "/r/bot.creds",
        "inbox_nonce": "nonce_0123456789", "allow_publish": ("team.news",), "allow_subscribe": ("team.>",),
        "role": "ops", "generation": GENERATION, "accepted_token": TOKEN,
    }  # fmt: skip
    return Credential(**{**fields, **overrides})


def test_the_source_is_the_credential_ledger_family_of_its_lifecycle():
    assert si.ledger_family("st", UID) == Source(space="st", bucket="cotal_auth_st", key=f"cred.{UID}")


def test_its_permissions_ride_ep_v1_with_the_generation_pinned_and_read_its_own_accepted_row():
    perms = si.issued_agent_permissions(cred())
    request = f"cotal.st.ep.v1.{GENERATION}.{OWNER}.bot.registry.endpoints"
    assert request in perms.pub_allow and f"{request}.reply.>" in perms.sub_allow
    read = f"$JS.API.DIRECT.GET.KV_cotal_accepted_st.$KV.cotal_accepted_st.accepted.v1.{TOKEN}"
    assert read in perms.pub_allow
    assert [s for s in perms.pub_allow if ".ep." in s] == [request]  # one request row, nothing else on the rails


def test_its_dm_inbox_is_keyed_by_its_lifecycle_uid_and_it_binds_no_other():
    perms = si.issued_agent_permissions(cred())
    inbox = f"dm-{OWNER}-bot-{UID}"
    assert f"$JS.API.CONSUMER.MSG.NEXT.COTAL_DM_st.{inbox}" in perms.pub_allow
    assert f"$JS.API.CONSUMER.MSG.NEXT.COTAL_DM_st.dm-{OWNER}-bot" not in perms.pub_allow
    assert [d.name for d in si.durables_of(cred())] == [inbox, "task-ops"]
    # A credential minted before static issuance keeps binding its principal's inbox.
    legacy = cred(generation=None, accepted_token=None, role=None)
    assert [d.name for d in si.durables_of(legacy)] == [f"dm-{OWNER}-bot"]


def test_the_evidence_records_the_whole_ceiling_the_source_and_no_expiry():
    fragment = si.issued_agent_permissions(cred()).to_nats()
    evidence = si.static_evidence(cred(), fragment)
    assert evidence.ref == si.ref_of(cred()) and evidence.ref.horizon == NOW + STATIC_AGENT_HORIZON_S
    assert evidence.sources == (si.ledger_family("st", UID),) and evidence.expires_at is None
    assert evidence.permissions == ceiling_from_native(fragment)


def test_a_renewal_keeps_the_generation_only_for_a_byte_identical_ceiling():
    evidence = si.static_evidence(cred(), si.issued_agent_permissions(cred()).to_nats())
    later = cred(issued_at=NOW + 3600, expires_at=NOW + 7200)  # a new lifetime: the same ceiling
    assert si.renewal_keeps(evidence, si.issued_agent_permissions(later).to_nats())
    reordered = cred(allow_subscribe=("team.>", "team.>"))  # the same set: the same bytes
    assert si.renewal_keeps(evidence, si.issued_agent_permissions(reordered).to_nats())
    wider = cred(allow_publish=("team.news", "team.other"))
    assert not si.renewal_keeps(evidence, si.issued_agent_permissions(wider).to_nats())


@pytest.mark.parametrize(("change", "now", "sentence"), [
    ({"generation": None, "accepted_token": None}, NOW, "credential bot carries no issued generation"),
    ({"revoked_at": NOW}, NOW, f"credential bot was revoked at {NOW} and is not renewed"),
    ({}, NOW + STATIC_AGENT_HORIZON_S, "credential bot's generation reached its horizon"),
])  # fmt: skip
def test_renewals_stop_at_the_horizon_and_after_a_revocation(change, now, sentence):
    with pytest.raises(ConfigError) as caught:
        si.check_renewable(cred(**change), now=now)
    assert str(caught.value).startswith(sentence)
    assert "cotal auth mint --label bot --space st --identity /r/bot.creds --replace" in str(caught.value)


def test_a_live_issued_agent_is_renewable():
    si.check_renewable(cred(), now=NOW + STATIC_AGENT_HORIZON_S - 1)


def test_the_record_keeps_the_generation_and_token_and_the_receipt_prints_them_with_the_horizon():
    issued = cred()
    assert Credential.from_json(issued.to_json()) == issued
    assert {"generation": GENERATION, "acceptedToken": TOKEN}.items() <= issued.to_json().items()
    shown = receipt(issued, replaced=False)
    assert (shown["generation"], shown["acceptedToken"], shown["horizon"]) == (GENERATION, TOKEN, NOW + STATIC_AGENT_HORIZON_S)
    assert "generation" not in cred(generation=None, accepted_token=None).to_json()


@pytest.mark.parametrize("change", [
    {"accepted_token": None},
    {"generation": None},
    {"accepted_token": "XYZ"},
    {"generation": "1234"},
    {"profile": "observer", "role": None, "allow_publish": (), "allow_subscribe": ()},
])  # fmt: skip
def test_a_half_or_malformed_issuance_in_a_record_is_refused(change):
    with pytest.raises(CodecError, match="issued generation"):
        cred(**change)


def test_the_minter_holds_the_provisioner_issuer_and_store_creates_and_no_consumer_delete():
    perms = si.static_minter_permissions(space="st", inbox_nonce="nonce_0123456789")
    for stream in ("KV_cotal_issued_st", "KV_cotal_accepted_st"):
        assert wire.js_stream_create(stream) in perms.pub_allow
    assert "$KV.cotal_issued_st.>" in perms.pub_allow and "$JS.API.STREAM.CREATE.COTAL_DM_st" in perms.pub_allow
    assert not any("DELETE" in s for s in perms.pub_allow)
    assert perms.pub_allow[-1] == wire.USER_INFO_SUBJECT


def matches(subject: str, pattern: str) -> bool:
    """NATS subject matching: ``*`` one token, ``>`` one or more trailing tokens."""
    tokens, wanted = subject.split("."), pattern.split(".")
    for i, want in enumerate(wanted):
        if want == ">":
            return len(tokens) > i
        if i >= len(tokens) or want not in ("*", tokens[i]):
            return False
    return len(tokens) == len(wanted)


def test_an_agent_reads_its_two_watch_readers_an_observer_and_admin_their_history_readers():
    """Issue 19 item 4 for static credentials (spec "Profiles"): what a static mint or
    ``cotal auth provision`` makes, by profile."""
    agent = cred()
    assert [(d.stream, d.name) for d in si.footprint_of(agent)] == [
        ("COTAL_DM_st", f"dm-{OWNER}-bot-{UID}"), ("COTAL_TASK_st", "task-ops"),
        ("KV_cotal_presence_st", f"watch-presence-{OWNER}-bot"), ("KV_cotal_channels_st", f"watch-channels-{OWNER}-bot"),
    ]  # fmt: skip
    assert si.readers_of(agent) == tuple(wire.watch_durable("st", k, OWNER, "bot") for k in ("presence", "channels"))
    plain = dict(generation=None, accepted_token=None, role=None, allow_publish=(), allow_subscribe=())
    observer, admin = cred(profile="observer", **plain), cred(profile="admin", **plain)
    assert si.footprint_of(observer) == (wire.history_reader("st", "chat", "nonce_0123456789"),)
    assert si.footprint_of(admin) == tuple(wire.history_reader("st", k, "nonce_0123456789") for k in ("chat", "dm"))


def test_the_minter_may_create_each_consumer_of_a_static_footprint_and_no_create_beyond_the_provisioners():
    """The static minter's consumer creates are the provisioner's, unchanged (the pinned-filter
    form only; none of the create forms that take any filter in the body), and they cover every
    consumer :func:`footprint_of` names for an agent, an observer and an admin."""
    nonce = "nonce_0123456789"
    perms = si.static_minter_permissions(space="st", inbox_nonce=nonce)
    creates = [s for s in perms.pub_allow if ".CONSUMER.CREATE." in s or ".CONSUMER.DURABLE." in s]
    provisioner = provisioner_permissions(space="st", inbox_nonce=nonce)
    assert creates == [s for s in provisioner.pub_allow if ".CONSUMER.CREATE." in s]
    plain = dict(generation=None, accepted_token=None, role=None, allow_publish=(), allow_subscribe=())
    for one in (cred(), cred(profile="observer", **plain), cred(profile="admin", **plain)):
        for durable in si.footprint_of(one):
            subject = wire.js_consumer_create(durable.stream, durable.name, durable.filter_subject)
            assert any(matches(subject, grant) for grant in creates), subject
            info = wire.js_consumer_info(durable.stream, durable.name)
            assert any(matches(info, grant) for grant in perms.pub_allow), info
    # the forms whose filter is the body's are granted to nobody (docs/wire-layout.md)
    for form in ("$JS.API.CONSUMER.CREATE.COTAL_CHAT_st", "$JS.API.CONSUMER.CREATE.COTAL_CHAT_st.x",
                 "$JS.API.CONSUMER.DURABLE.CREATE.COTAL_CHAT_st.x",
                 "$JS.API.CONSUMER.CREATE.KV_cotal_admission_st.x.$KV.cotal_admission_st.>"):  # fmt: skip
        assert not any(matches(form, grant) for grant in perms.pub_allow), form


def test_ref_of_refuses_an_unissued_credential():
    with pytest.raises(ValueError, match="carries no issued generation"):
        si.ref_of(dataclasses.replace(cred(), generation=None, accepted_token=None))
