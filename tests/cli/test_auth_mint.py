"""``cotal auth mint`` and ``cotal auth revoke-credential`` on a static space (cotal_trio/cli/auth.py;
issue 6 item 3; docs/static-credentials.md). No broker: nothing listens on the root's policy port."""

from __future__ import annotations

import dataclasses
import json
import os
import stat
import time

import pytest

from cotal_trio.broker import provision
from cotal_trio.core import credentials as rules
from cotal_trio.core import natsjwt, profiles, static_issuance
from cotal_trio.core.creds import parse_creds
from cotal_trio.core.identity import is_inbox_nonce, is_lifecycle_uid
from cotal_trio.core.nkeys import KeyPair
from cotal_trio.state import load_broker, load_owner_secret, load_policy, load_space
from cotal_trio.state.credentials import default_creds_path, load_record, record_path, save_record

from tests.support.cli_root import Root
from tests.support.static_mint import STATIC, add_static, mint, one_sentence
from tests.support.static_mint import static, static_offline  # noqa: F401 - the fixtures


def decoded(path) -> tuple[dict, KeyPair]:
    with open(path) as handle:
        jwt, seed = parse_creds(handle.read())
    return natsjwt.verify(jwt), KeyPair.from_seed(seed)


def expected_permissions(root: Root, receipt: dict, **agent) -> dict:
    if "generation" in receipt:  # an issued static agent (issue 19 item 2): its record says how it was built
        record = load_record(root.paths.space(STATIC), receipt["label"]).current
        grant = {"allow_publish": agent.get("allow_publish", ()), "allow_subscribe": agent.get("allow_subscribe", ()),
                 "role": agent.get("role")}  # fmt: skip
        return static_issuance.issued_agent_permissions(dataclasses.replace(record, **grant)).to_nats()
    owner, actor = receipt["principal"].split(".")
    context = {"space": STATIC, "inbox_nonce": receipt["inboxPrefix"].removeprefix("_INBOX_")}
    if receipt["profile"] == "agent":
        context.update(owner=owner, actor=actor, allow_publish=agent.get("allow_publish", ()),
                       allow_subscribe=agent.get("allow_subscribe", ()), role=agent.get("role"))  # fmt: skip
    return profiles.profile_permissions(receipt["profile"], **context).to_nats()


# -- mint -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("profile", ["agent", "observer", "admin"])
def test_mint_each_profile_writes_a_creds_file_signed_by_the_data_account(static, capsys, profile):
    before = int(time.time())
    code, receipt, err = mint(static, capsys, "--profile", profile)
    assert code == 0, err
    material = load_space(static.paths.space(STATIC).callout_json, STATIC)
    owner = rules.static_owner(load_owner_secret(static.paths.space(STATIC).owner_secret_json))
    path = default_creds_path(static.paths, STATIC, profile)
    assert receipt["path"] == str(path) and stat.S_IMODE(path.stat().st_mode) == 0o600
    assert (receipt["space"], receipt["label"], receipt["profile"], receipt["replaced"]) == (STATIC, profile, profile, False)
    assert receipt["principal"] == f"{owner}.{profile}" and is_lifecycle_uid(receipt["lifecycleUid"])
    assert is_inbox_nonce(receipt["inboxPrefix"].removeprefix("_INBOX_"))
    claims, key = decoded(path)
    assert claims["sub"] == key.public_key == receipt["userKey"]
    assert claims["iss"] == material.data_service_signing.public_key
    assert claims["nats"]["issuer_account"] == material.data_account
    assert before <= claims["iat"] == receipt["issuedAt"] <= int(time.time())
    assert claims["exp"] == receipt["expiresAt"] == claims["iat"] + 24 * 3600
    assert {"pub": claims["nats"]["pub"], "sub": claims["nats"]["sub"]} == expected_permissions(static, receipt)
    assert f"lifecycle:{receipt['lifecycleUid']}" in claims["nats"]["tags"]
    record = load_record(static.paths.space(STATIC), profile)
    assert record.current.user_key == key.public_key and record.replaced == ()
    assert stat.S_IMODE(record_path(static.paths.space(STATIC), profile).stat().st_mode) == 0o600


def test_agent_flags_shape_the_grant(static, capsys):
    code, receipt, err = mint(static, capsys, "--label", "bot", "--allow-publish", "team.news",
                              "--allow-subscribe", "team.>,ops.*", "--role", "ops", "--expires-in", "600")  # fmt: skip
    assert code == 0, err
    claims, _ = decoded(receipt["path"])
    assert claims["exp"] == claims["iat"] + 600
    perms = expected_permissions(static, receipt, allow_publish=("team.news",), allow_subscribe=("team.>", "ops.*"), role="ops")
    assert perms != expected_permissions(static, receipt, allow_publish=("team.news",), allow_subscribe=("team.>", "ops.*"))
    assert load_record(static.paths.space(STATIC), "bot").current.role == "ops"
    assert {"pub": claims["nats"]["pub"], "sub": claims["nats"]["sub"]} == perms
    assert f"cotal.{STATIC}.ch.team.news" in perms["pub"]["allow"]
    assert f"cotal.{STATIC}.ch.other" not in perms["pub"]["allow"]


def test_text_receipt_and_no_expiry(static, capsys):
    code, out, err = static.run(capsys, "auth", "mint", "--space", STATIC, "--label", "keeper", "--no-expiry")
    assert code == 0, err
    record = load_record(static.paths.space(STATIC), "keeper").current
    assert out.splitlines() == [
        f"minted agent credential keeper in space {STATIC}",
        f"  principal {record.principal}",
        f"  lifecycle {record.lifecycle_uid}",
        f"  user key  {record.user_key}",
        "  expires   never (--no-expiry: `cotal doctor auth` warns about it)",
        f"  file      {record.path}",
        f"  inbox     _INBOX_{record.inbox_nonce} (the client's inbox prefix)",
        f"  generation {record.generation} (horizon {record.issued_at + 30 * 24 * 3600}, "
        f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime(record.issued_at + 30 * 24 * 3600))})",
        f"  accepted  {record.accepted_token} (the token of its accepted row: its generation)",
        f"  binds     dm-{record.owner}-{record.actor}-{record.lifecycle_uid} (COTAL_DM_{STATIC}), "
        f"watch-presence-{record.owner}-{record.actor} (KV_cotal_presence_{STATIC}), "
        f"watch-channels-{record.owner}-{record.actor} (KV_cotal_channels_{STATIC})",
        f"  server    nats://127.0.0.1:{load_policy(static.paths.policy_json).port}",
    ]
    claims, _ = decoded(record.path)
    assert "exp" not in claims and record.expires_at is None


@pytest.mark.parametrize(("argv", "sentence"), [
    (["--profile", "observer", "--allow-publish", "a"], "--allow-publish shapes an agent's grant; profile observer has a fixed one - drop it"),
    (["--profile", "admin", "--role", "r", "--allow-subscribe", "a"], "--allow-subscribe, --role shape an agent's grant"),
    (["--expires-in", "60", "--no-expiry"], "--expires-in and --no-expiry both set the lifetime"),
    (["--label", "a.b"], "--label is 1 to 64 letters, digits and _"),
    (["--allow-publish", "a..b"], "a channel pattern is dot-separated segments"),
])  # fmt: skip
def test_flags_refused_before_anything_is_written(static, capsys, argv, sentence):
    code, _, err = mint(static, capsys, *argv)
    assert code == 1 and one_sentence(err).startswith(sentence)
    assert not (static.paths.root / "auth").exists()
    assert not (static.paths.space(STATIC).dir / "credentials").exists()


def test_a_user_auth_space_refuses_to_mint(root, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, out, err = root.run(capsys, "auth", "mint", "--space", "default", "--profile", "agent")
    assert (code, out) == (1, "")
    assert one_sentence(err) == (
        "space default is a user-auth space: its agents join under a logged-in user (`cotal actor grant` and the "
        "exchange), never with a handed-out credential file - mint on a static space (`cotal space add NAME --static`)"
    )
    assert not (root.paths.root / "auth").exists()


def test_a_folder_holding_another_roots_trust_is_refused_naming_both(static, capsys, tmp_path, monkeypatch):
    other = Root(paths=type(static.paths)(tmp_path / "proj" / ".cotal"), space=static.space, idp=static.idp)
    provision.ensure_root(other.paths, iat=int(time.time()))
    add_static(other)
    monkeypatch.chdir(tmp_path / "proj")
    code, _, err = mint(static, capsys, "--label", "bot")
    theirs = json.loads(other.paths.space(STATIC).accounts_json.read_text())["data"]["account"]
    ours = json.loads(static.paths.space(STATIC).accounts_json.read_text())["data"]["account"]
    assert code == 1 and one_sentence(err) == (
        f"{tmp_path / 'proj'} holds trust for another root, {other.paths.root} (space {STATIC} is account {theirs} "
        f"there), but this mint signs with root {static.paths.root} (space {STATIC}, account {ours}) - run it from "
        f"another folder, write --out outside {tmp_path / 'proj'}, or pass --root {other.paths.root} to mint there"
    )
    monkeypatch.chdir(tmp_path)
    code, _, err = mint(static, capsys, "--label", "bot", "--out", str(tmp_path / "proj" / "bot.creds"))
    assert code == 1 and "holds trust for another root" in one_sentence(err)
    code, receipt, err = mint(static, capsys, "--label", "bot", "--out", str(tmp_path / "elsewhere" / "bot.creds"))
    assert code == 0, err


def test_out_refuses_a_file_that_is_not_the_labels(static, capsys, tmp_path):
    taken = tmp_path / "taken.creds"
    taken.write_text("someone's")
    code, _, err = mint(static, capsys, "--out", str(taken))
    assert code == 1 and one_sentence(err).startswith(f"{taken} exists and is not this label's credential")
    assert taken.read_text() == "someone's"


# -- replace ----------------------------------------------------------------------------------------


def _age(root: Root, label: str, *, issued_at: int, expires_at: int | None) -> None:
    sp = root.paths.space(STATIC)
    record = load_record(sp, label)
    save_record(sp, dataclasses.replace(record, current=dataclasses.replace(record.current, issued_at=issued_at, expires_at=expires_at)))


def test_replace_is_refused_on_a_live_credential_and_allowed_once_expired(static, capsys):
    code, first, _ = mint(static, capsys, "--label", "bot")
    assert code == 0
    code, _, err = mint(static, capsys, "--label", "bot")
    assert code == 1 and one_sentence(err).startswith("label bot already has a live credential, which cannot be replaced: it is live until")
    code, _, err = mint(static, capsys, "--label", "bot", "--replace")
    assert code == 1 and one_sentence(err).endswith(
        f"- revoke it first with `cotal auth revoke-credential bot --space {STATIC}`, or choose another --label"
    )
    assert decoded(first["path"])[0]["sub"] == first["userKey"]  # untouched
    now = int(time.time())
    _age(static, "bot", issued_at=now - 100, expires_at=now - 10)
    code, _, err = mint(static, capsys, "--label", "bot")
    assert code == 1 and one_sentence(err) == f"label bot already has a credential (it expired at {now - 10}) - pass --replace to replace it"
    code, second, err = mint(static, capsys, "--label", "bot", "--replace")
    assert code == 0, err
    assert second["replaced"] and second["path"] == first["path"] and second["userKey"] != first["userKey"]
    assert decoded(second["path"])[0]["sub"] == second["userKey"]
    assert load_record(static.paths.space(STATIC), "bot").replaced == ()  # the expired one is forgotten


def test_revoke_then_replace_with_the_same_identity(static, capsys):
    code, first, _ = mint(static, capsys, "--label", "bot", "--allow-publish", "team.news")
    assert code == 0
    accounts_before = json.loads(static.paths.space(STATIC).accounts_json.read_text())["data"]["jwt"]
    code, out, err = static.run(capsys, "auth", "revoke-credential", "bot", "--space", STATIC, "--json")
    assert code == 0, err
    revoked = json.loads(out)
    server = f"nats://127.0.0.1:{load_policy(static.paths.policy_json).port}"
    assert (revoked["label"], revoked["userKey"], revoked["pushedTo"], revoked["revocations"]) == ("bot", first["userKey"], server, 1)
    assert revoked["retiredIssuances"] == 1  # the lifecycle terminal retires its issuance (issue 19 item 2)
    record = load_record(static.paths.space(STATIC), "bot").current
    assert record.revoked_at == revoked["revokedAt"] >= first["issuedAt"]
    broker = load_broker(static.paths.broker_json)
    accounts = provision.load_space_accounts(static.paths, broker, STATIC)  # still validates
    data = natsjwt.verify(accounts.data_jwt)
    assert accounts.data_jwt != accounts_before and data["iss"] == broker.operator_signing.public_key
    assert data["nats"]["revocations"] == {first["userKey"]: record.revoked_at}
    assert data["iat"] > natsjwt.decode(accounts_before).claims["iat"]

    code, second, err = mint(static, capsys, "--label", "bot", "--replace", "--identity", first["path"], "--allow-publish", "team.news")
    assert code == 0, err
    assert (second["userKey"], second["principal"]) == (first["userKey"], first["principal"])
    assert second["lifecycleUid"] != first["lifecycleUid"] and second["path"] == first["path"]
    claims, key = decoded(second["path"])
    assert key.public_key == first["userKey"] and claims["iat"] > record.revoked_at
    kept = load_record(static.paths.space(STATIC), "bot")
    assert [c.revoked_at for c in kept.replaced] == [record.revoked_at]  # the revocation stays in the records


@pytest.mark.parametrize(("profile", "streams"), [("observer", ["CHAT"]), ("admin", ["CHAT", "DM"])])
def test_an_observer_or_admin_receipt_names_its_history_readers_and_the_provision_that_creates_them(
    static_offline, capsys, profile, streams
):
    """Issue 19 item 4 for static credentials (spec "Profiles": the observer's and admin's own
    ``hist__`` readers): the mint is offline, so its receipt lists the readers and the exact
    ``cotal auth provision`` that creates them."""
    static = static_offline
    code, receipt, err = mint(static, capsys, "--profile", profile, "--label", "eye")
    assert code == 0, err
    nonce, uid = receipt["inboxPrefix"].removeprefix("_INBOX_"), receipt["lifecycleUid"]
    command = f"cotal auth provision {uid} --space {STATIC}"
    assert receipt["durables"] == [{"stream": f"COTAL_{s}_{STATIC}", "name": f"hist__{nonce}"} for s in streams]
    assert receipt["provision"] == command
    code, out, err = static.run(capsys, "auth", "mint", "--space", STATIC, "--profile", profile, "--label", "eye2")
    assert code == 0, err
    cred = load_record(static.paths.space(STATIC), "eye2").current
    lines = out.splitlines()
    assert lines[-3:-1] == [
        "  binds     " + ", ".join(f"hist__{cred.inbox_nonce} (COTAL_{s}_{STATIC})" for s in streams),
        f"  provision not yet: `cotal auth provision {cred.lifecycle_uid} --space {STATIC}` creates them (with the broker running)",
    ]


def test_an_agent_receipt_lists_its_durables_and_watch_readers(static, capsys):
    """Issue 19 item 4 for static agents: the receipt lists the bind-only durables and the two
    watch readers the mint created; ``--no-provision`` names the provision that creates them."""
    code, receipt, err = mint(static, capsys, "--label", "bot", "--role", "ops")
    assert code == 0, err
    owner, actor = receipt["principal"].split(".")
    assert receipt["durables"] == [
        {"stream": f"COTAL_DM_{STATIC}", "name": f"dm-{owner}-{actor}-{receipt['lifecycleUid']}"},
        {"stream": f"COTAL_TASK_{STATIC}", "name": "task-ops"},
        {"stream": f"KV_cotal_presence_{STATIC}", "name": f"watch-presence-{owner}-{actor}"},
        {"stream": f"KV_cotal_channels_{STATIC}", "name": f"watch-channels-{owner}-{actor}"},
    ]
    assert receipt["provision"] is None
    code, later, err = mint(static, capsys, "--label", "later", "--no-provision")
    assert code == 0, err
    assert later["provision"] == f"cotal auth provision {later['lifecycleUid']} --space {STATIC}"
    assert [d["name"].split("-")[0] for d in later["durables"]] == ["dm", "watch", "watch"]


def test_revoke_text_without_a_broker(static_offline, capsys):
    static = static_offline
    assert mint(static, capsys, "--label", "bot", "--profile", "observer")[0] == 0
    code, out, _ = static.run(capsys, "auth", "revoke-credential", "bot", "--space", STATIC)
    key = load_record(static.paths.space(STATIC), "bot").current.user_key
    assert code == 0 and out == (
        f"revoked credential bot key {key} in space {STATIC} (no broker running: the revocation takes effect when the "
        f"account is pushed, and its issuances are retired then - run `cotal auth revoke-credential bot --space {STATIC}` "
        "again while the broker runs)\n"
    )
    code, _, err = static.run(capsys, "auth", "revoke-credential", "nobody", "--space", STATIC)
    assert code == 1 and one_sentence(err) == f"space {STATIC} has no credential labelled nobody - see `cotal doctor auth`"


def test_replacing_a_no_expiry_credential_keeps_it_until_its_key_is_revoked(static, capsys):
    code, first, _ = mint(static, capsys, "--label", "keeper", "--no-expiry")
    assert code == 0
    code, out, err = static.run(capsys, "auth", "mint", "--space", STATIC, "--label", "keeper", "--replace")
    assert code == 0, err
    assert out.splitlines()[-1] == (
        f"  note: the replaced credential {first['userKey']} has no expiry and still connects - revoke it with "
        f"`cotal auth revoke-credential keeper --space {STATIC} --key {first['userKey']}`"
    )
    code, _, err = static.run(capsys, "auth", "revoke-credential", "keeper", "--space", STATIC, "--key", first["userKey"])
    assert code == 0, err
    record = load_record(static.paths.space(STATIC), "keeper")
    assert record.current.revoked_at is None and record.replaced[0].revoked_at is not None
    data = natsjwt.decode(json.loads(static.paths.space(STATIC).accounts_json.read_text())["data"]["jwt"]).claims
    assert list(data["nats"]["revocations"]) == [first["userKey"]]


def test_identity_from_another_account_is_refused(static, capsys, tmp_path):
    add_static(static, "other")
    code, out, err = static.run(capsys, "auth", "mint", "--space", "other", "--label", "x", "--profile", "observer", "--json")
    assert code == 0, err
    foreign = json.loads(out)["path"]
    code, _, err = mint(static, capsys, "--identity", foreign)
    other_account = load_space(static.paths.space("other").callout_json, "other").data_account
    ours = load_space(static.paths.space(STATIC).callout_json, STATIC).data_account
    assert code == 1 and one_sentence(err) == (
        f"--identity {foreign} was minted into account {other_account}, not space {STATIC}'s account {ours} - "
        "pass a file of this space, or --space its own space"
    )


def test_the_file_is_written_atomically_0600_whatever_the_umask(static, capsys):
    old = os.umask(0)
    try:
        code, receipt, _ = mint(static, capsys, "--label", "bot")
    finally:
        os.umask(old)
    assert code == 0 and stat.S_IMODE(os.stat(receipt["path"]).st_mode) == 0o600
    assert [p.name for p in os.scandir(os.path.dirname(receipt["path"]))] == ["bot.creds"]  # no temp file left


def test_identity_of_another_label_is_refused(static, capsys):
    # Two labels sharing one nkey: revoking either would silently revoke the other.
    code, first, _ = mint(static, capsys, "--label", "alpha1")
    assert code == 0
    code, _, err = mint(static, capsys, "--label", "beta1", "--identity", first["path"])
    assert code == 1
    assert err.strip() == (
        f"cotal: the key of --identity {first['path']} belongs to credential alpha1 - replace that one "
        "(--label alpha1 --replace), or mint beta1 without --identity"
    )
    assert load_record(static.paths.space(STATIC), "beta1") is None


def test_a_creds_file_that_cannot_be_written_leaves_no_record(static, capsys, tmp_path):
    # The record was saved first, so a failed write left a live credential with no file, and
    # every later mint of the label was refused ("revoke it first").
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    code, _, err = mint(static, capsys, "--label", "lost", "--out", str(blocker / "lost.creds"))
    assert code == 1 and "Traceback" not in err
    assert load_record(static.paths.space(STATIC), "lost") is None
    assert mint(static, capsys, "--label", "lost")[0] == 0  # the label is free


@pytest.mark.parametrize("broken", ["record", "accounts"])
def test_a_revoke_that_cannot_sign_the_account_records_nothing(static, capsys, broken):
    """Found by the fresh-user check: with another label's record (or accounts.json) corrupt,
    revoke-credential exited 1 but had already marked the key revoked, while the account (and
    so the broker) never carried it. The revocation is recorded only with the account signed."""
    assert mint(static, capsys, "--label", "bot")[0] == 0
    assert mint(static, capsys, "--label", "other")[0] == 0
    sp = static.paths.space(STATIC)
    target = record_path(sp, "other") if broken == "record" else sp.accounts_json
    target.write_text("{")
    code, _, err = static.run(capsys, "auth", "revoke-credential", "bot", "--space", STATIC)
    assert code == 1 and err.startswith("cotal: "), err
    assert load_record(sp, "bot").current.revoked_at is None


def test_an_agent_mint_and_a_renewal_need_the_broker_and_write_nothing_without_it(static_offline, capsys):
    """Issue 19 item 2: a static agent credential is an issuance (its evidence is written before its
    file), and a renewal reads that evidence; with no broker both are refused, nothing written."""
    root = static_offline.paths.root
    code, _, err = mint(static_offline, capsys, "--label", "bot")
    assert code == 1 and one_sentence(err) == (
        f"no broker answers for the root {root} - start it (`cotal up`), or pass --server nats://host:port: a static "
        "agent credential is an issuance, recorded in the space's issued stores before its file is written; nothing was written"
    )
    assert load_record(static_offline.paths.space(STATIC), "bot") is None
    assert not default_creds_path(static_offline.paths, STATIC, "bot").exists()
    code, _, err = static_offline.run(capsys, "auth", "renew", "bot", "--space", STATIC)
    assert code == 1 and one_sentence(err).endswith("a renewal reads its issuance's evidence; nothing was written")


def test_a_renewal_of_a_lost_file_names_a_fix_that_works(static, capsys):
    """Issue 19 item 2: a renewal keeps the key in the credential's file; with the file gone the
    refusal names the way out, and following it (revoke, then mint --replace) gives a new file.
    A bare `--replace` would be refused while the lost credential is live."""
    code, receipt, err = mint(static, capsys, "--label", "bot")
    assert code == 0, err
    os.unlink(receipt["path"])
    code, _, err = static.run(capsys, "auth", "renew", "bot", "--space", STATIC)
    assert code == 1
    assert one_sentence(err) == (
        f"credential bot's file {receipt['path']} cannot be read ([Errno 2] No such file or directory:"
        f" '{receipt['path']}') - a renewal keeps the key in it; put the file back, or revoke the credential"
        f" (`cotal auth revoke-credential bot --space {STATIC}`) and mint it again"
        f" (`cotal auth mint --label bot --space {STATIC} --replace`)"
    )
    assert static.run(capsys, "auth", "revoke-credential", "bot", "--space", STATIC)[0] == 0
    code, again, err = mint(static, capsys, "--label", "bot", "--replace")
    assert code == 0 and again["replaced"] and os.path.exists(again["path"]), err
