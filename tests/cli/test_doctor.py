"""``cotal doctor auth`` (cotal_trio/cli/doctor.py; issue 6 item 4; docs/static-credentials.md).

No broker runs here (nothing listens on the root's policy port): the broker comparison is a note.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
import time


from cotal_trio.broker.process import free_port
from cotal_trio.cli import main
from cotal_trio.state import IdpPinRecord, save_idp_pin
from cotal_trio.state.credentials import creds_dir, load_record, save_record

from tests.support.cli_root import Root
from tests.support.static_mint import STATIC, add_static, mint, static  # noqa: F401 - the fixture (its broker runs)

NO_BROKER = "note: no broker running: its accounts were not compared with the root"


def flags(root: Root) -> str:
    """What the named commands carry: the space, and the --root the doctor was given."""
    return f"--space {STATIC} --root {root.paths.root}"


def doctor(root: Root, capsys, *argv: str) -> tuple[int, list[str]]:
    code, out, err = root.run(capsys, "doctor", "auth", *argv)
    assert err == "", err
    return code, out.splitlines()


def doctor_json(root: Root, capsys, *argv: str) -> tuple[int, dict]:
    code, out, err = root.run(capsys, "doctor", "auth", "--json", *argv)
    assert err == "", err
    return code, json.loads(out)


def test_a_fresh_root_with_a_live_credential_is_healthy(static, capsys):
    code, receipt, _ = mint(static, capsys, "--label", "bot")
    assert code == 0
    code, lines = doctor(static, capsys)
    assert code == 0
    assert lines[0] == "space default (user-auth): 0 managed credentials"
    at = lines.index(f"space {STATIC} (static): 1 managed credentials")  # after the broker's store lines of default
    assert lines[at + 1].split()[:4] == ["bot", "agent", "healthy", "expires"]
    assert lines[at + 1].endswith(receipt["principal"])
    assert lines[-1] == "healthy" and NO_BROKER not in lines  # its broker runs: the accounts were compared
    code, report = doctor_json(static, capsys, "--space", STATIC)
    assert (code, report["healthy"], report["next"], report["findings"]) == (0, True, None, [])
    [row] = report["spaces"][0]["credentials"]
    assert (row["label"], row["health"], row["userKey"], row["expiresAt"]) == ("bot", "healthy", receipt["userKey"], receipt["expiresAt"])


def test_a_no_expiry_credential_is_a_warning(static, capsys):
    assert mint(static, capsys, "--label", "keeper", "--no-expiry")[0] == 0
    code, lines = doctor(static, capsys, "--space", STATIC)
    assert code == 0
    assert f"warning: credential keeper (space {STATIC}): minted with --no-expiry: it connects until its key is revoked - cotal auth revoke-credential keeper {flags(static)}" in lines
    assert lines[1].split()[:4] == ["keeper", "agent", "no-expiry", "never"]
    assert lines[-1] == "healthy"
    code, report = doctor_json(static, capsys, "--space", STATIC)
    assert [(f["severity"], f["subject"]) for f in report["findings"]] == [("warning", f"credential keeper (space {STATIC})")]
    assert report["healthy"] is True


def _age(root: Root, label: str, *, issued_at: int, expires_at: int) -> None:
    sp = root.paths.space(STATIC)
    record = load_record(sp, label)
    save_record(sp, dataclasses.replace(record, current=dataclasses.replace(record.current, issued_at=issued_at, expires_at=expires_at)))


def test_expired_and_near_expiry_name_the_next_command(static, capsys):
    now = int(time.time())
    assert mint(static, capsys, "--label", "old", "--allow-publish", "team.news")[0] == 0
    _age(static, "old", issued_at=now - 1000, expires_at=now - 5)
    code, lines = doctor(static, capsys, "--space", STATIC)
    mint_again = f"cotal auth mint {flags(static)} --profile agent --label old --allow-publish team.news --expires-in 995 --replace"
    assert code == 1 and lines[-1] == f"next: {mint_again}"
    assert lines[1].split()[:3] == ["old", "agent", "expired"]
    # The command it names works, and then the root is healthy.
    assert main(shlex.split(mint_again)[1:]) == 0
    assert doctor(static, capsys, "--space", STATIC)[1][-1] == "healthy"  # a fresh short credential is healthy
    _age(static, "old", issued_at=now - 900, expires_at=now + 95)  # under 10 % of its lifetime left
    renew = f"cotal auth renew old {flags(static)} --expires-in 995"  # an issued agent: renewed, its generation kept
    assert doctor(static, capsys, "--space", STATIC)[1][-1] == f"next: {renew}"
    generation = load_record(static.paths.space(STATIC), "old").current.generation
    assert main(shlex.split(renew)[1:]) == 0
    renewed = load_record(static.paths.space(STATIC), "old").current
    assert renewed.generation == generation and renewed.expires_at - renewed.issued_at == 995
    assert doctor(static, capsys, "--space", STATIC)[1][-1] == "healthy"
    # One minted before static issuance (no generation) is revoked and minted again with its identity.
    record = load_record(static.paths.space(STATIC), "old")
    legacy = dataclasses.replace(record.current, generation=None, accepted_token=None, issued_at=now - 900, expires_at=now + 95)
    save_record(static.paths.space(STATIC), dataclasses.replace(record, current=legacy))
    assert doctor(static, capsys, "--space", STATIC)[1][-1] == "next: " + (
        f"cotal auth revoke-credential old {flags(static)} && {mint_again.removesuffix(' --replace')} "
        f"--identity {legacy.path} --replace"
    )
    assert mint(static, capsys, "--label", "fresh")[0] == 0
    _age(static, "old", issued_at=now, expires_at=now + 30 * 86400)
    code, lines = doctor(static, capsys, "--space", STATIC)
    assert (code, lines[0], lines[-1]) == (0, f"space {STATIC} (static): 2 managed credentials", "healthy")
    assert [line.split()[:3] for line in lines[1:3]] == [["fresh", "agent", "healthy"], ["old", "agent", "healthy"]]


def test_a_replaced_unbounded_credential_is_a_finding_until_revoked(static, capsys):
    code, first, _ = mint(static, capsys, "--label", "keeper", "--no-expiry")
    assert mint(static, capsys, "--label", "keeper", "--replace")[0] == 0
    code, report = doctor_json(static, capsys, "--space", STATIC)
    revoke = f"cotal auth revoke-credential keeper {flags(static)} --key {first['userKey']}"
    assert (code, report["next"]) == (1, revoke)
    assert report["findings"][0]["problem"] == "has no expiry and was never revoked: it still connects"
    assert main(shlex.split(revoke)[1:]) == 0
    assert doctor(static, capsys, "--space", STATIC)[1][-1] == "healthy"


def test_file_modes_are_findings(static, capsys):
    assert mint(static, capsys, "--label", "bot")[0] == 0
    creds = creds_dir(static.paths, STATIC) / "bot.creds"
    os.chmod(creds, 0o644)
    os.chmod(static.paths.space(STATIC).dir, 0o755)
    code, report = doctor_json(static, capsys)
    assert code == 1
    assert [(f["subject"], f["problem"], f["next"]) for f in report["findings"]] == [
        (str(static.paths.space(STATIC).dir), "mode 0755 lets other users in", f"chmod 700 {static.paths.space(STATIC).dir}"),
        (str(creds), "mode 0644 lets other users in", f"chmod 600 {creds}"),
    ]


def test_a_write_in_progress_and_the_public_applied_file_are_not_findings(static, capsys):
    """`.applied` is 0644 on purpose (service/host.py), and so is the temporary file of its atomic
    rewrite while a running host writes it: a doctor run at that moment once reported it."""
    for name in ("spaces.json.applied", ".spaces.json.applied.k2j4.tmp"):
        (static.paths.root / name).write_text("{}")
        os.chmod(static.paths.root / name, 0o644)
    assert doctor(static, capsys)[0] == 0


def test_a_corrupt_key_file_is_a_finding(static, capsys):
    static.paths.space(STATIC).callout_json.write_text("{}")
    os.chmod(static.paths.space(STATIC).callout_json, 0o600)
    code, lines = doctor(static, capsys)
    assert code == 1
    assert any(line.startswith(f"finding: space {STATIC}: {static.paths.space(STATIC).callout_json} is corrupt (ver is missing)") for line in lines)
    assert lines[-1] == "next: restore it from a backup or move the root aside and run `cotal up` again"


def test_an_unreachable_oidc_pin_is_a_finding(static, capsys):
    uri = f"http://127.0.0.1:{free_port()}/jwks"
    pin = IdpPinRecord(kind="oidc", url=uri.removesuffix("/jwks"), issuer="https://idp.test", audience="a", jwks_uri=uri)
    save_idp_pin(static.space.idp_json, pin)
    code, report = doctor_json(static, capsys)
    assert code == 1
    [finding] = report["findings"]
    assert finding["subject"] == "space default" and finding["problem"].startswith(f"could not read the IdP JWKS at {uri}: ")
    assert finding["next"] == f"check that {uri} answers, then run `cotal doctor auth` again"


def test_an_unrecorded_unbounded_file_in_the_root_is_a_finding(static, capsys):
    assert mint(static, capsys, "--label", "stray", "--no-expiry")[0] == 0
    stray = creds_dir(static.paths, STATIC) / "stray.creds"
    copy = stray.with_name("copy.creds")
    os.link(stray, copy)
    (static.paths.space(STATIC).dir / "credentials" / "stray.json").unlink()
    code, report = doctor_json(static, capsys, "--space", STATIC)
    assert code == 1
    assert [(f["subject"], f["next"]) for f in report["findings"]] == [
        (str(copy), f"rm {copy} (and every copy of it)"), (str(stray), f"rm {stray} (and every copy of it)"),
    ]


def test_an_unknown_space_or_root_is_one_sentence(static, capsys, tmp_path):
    code, out, err = static.run(capsys, "doctor", "auth", "--space", "nope")
    assert code == 1 and err == f"cotal: space nope is not in the root {static.paths.root} - see `cotal space list`\n"
    capsys.readouterr()
    assert main(["doctor", "auth", "--root", str(tmp_path / "none")]) == 1
    assert capsys.readouterr().err == f"cotal: there is no root at {tmp_path / 'none'} - pass the --root of one (`cotal up` makes one)\n"


def test_a_broker_that_does_not_answer_is_a_note_and_the_verdict_still_comes(static, capsys):
    from cotal_trio.broker.process import free_port

    dead = f"nats://127.0.0.1:{free_port()}"  # nothing listens there
    code, lines = doctor(static, capsys, "--space", STATIC, "--server", dead)
    assert lines[-1] == "healthy" and code == 0
    assert any(line.startswith(f"note: the broker at {dead} did not answer (connect {dead}:") for line in lines), lines


def test_a_corrupt_dev_idp_that_cotal_up_refuses_is_one_finding(static, capsys):
    """Issue 18 item 9: the doctor called this root healthy while `cotal up` refused to start on it.
    It loads devidp.json as a lane pinned to it does; two spaces pinning it give one finding."""
    assert main(["space", "add", "second", "--root", str(static.paths.root)]) == 0  # pinned to the same dev IdP
    static.paths.devidp_json.write_text('{"ver": 1, "devOnly": true, "privateJwk": {}}')
    os.chmod(static.paths.devidp_json, 0o600)
    code, report = doctor_json(static, capsys)
    problem = "devidp.json is not a development IdP document (privateJwk is not a consistent Ed25519 key)"
    fix = ("restore it from a backup; to start over instead, remove it and every space's idp.json pinned to it, run "
           "`cotal up`, and grant the actors again (a new development IdP gives every user a new owner)")
    assert code == 1 and report["next"] == fix
    assert [(f["subject"], f["problem"], f["next"]) for f in report["findings"]] == [
        (str(static.paths.devidp_json), problem, fix),
    ]
    code, lines = doctor(static, capsys)
    assert [line for line in lines if fix in line] == [f"finding: {static.paths.devidp_json}: {problem} - {fix}", f"next: {fix}"]


def test_a_missing_dev_idp_a_space_pins_is_a_finding(static, capsys):
    static.paths.devidp_json.unlink()
    code, report = doctor_json(static, capsys)
    assert code == 1
    assert [(f["subject"], f["problem"]) for f in report["findings"]] == [
        (str(static.paths.devidp_json), f"{static.paths.devidp_json} is missing"),
    ]
