"""``cotal auth mint --endpoint``'s flag refusals (cotal_trio/cli/auth.py; spec "Standalone callers";
docs/static_offline-credentials.md). No broker: each refusal comes before any connection, exits 1 with one
sentence, and writes nothing (no file, no record; no intent, as nothing connected)."""

from __future__ import annotations

import pytest

from cotal_trio.state.credentials import load_record

from tests.support.static_mint import STATIC, mint, one_sentence, static_offline  # noqa: F401  (the fixture)

OUT = "caller.creds"


@pytest.mark.parametrize(("argv", "sentence"), [
    (["--no-expiry"], "--no-expiry is refused with --endpoint: an issuance with no lifecycle gate must carry an expiry - "
                      "pass --expires-in or --expires-at, or neither for 24 h"),
    (["--identity", "some.creds"], "--identity does not combine with --endpoint: another file is not reinterpreted as a "
                                   "standalone caller - drop --identity (the mint makes a fresh key)"),
    (["--allow-publish", "a"], "--allow-publish does not combine with --endpoint - use --channels (read and post), a "
                               "standalone caller has no role"),
    (["--allow-subscribe", "a", "--role", "r"], "--allow-subscribe, --role do not combine with --endpoint"),
    (["--profile", "observer"], "--endpoint mints an agent footprint; profile observer does not combine with it - drop --profile"),
    (["--endpoint", "v1"], "--endpoint v1 is not an endpoint name - pass 1 to 64 letters, digits, _ and - (not v1)"),
    (["--endpoint", "a.b"], "--endpoint a.b is not an endpoint name"),
    (["--channels", "a..b"], "a channel pattern is dot-separated segments"),
    (["--no-provision"], "--no-provision does not combine with --endpoint: a standalone caller's footprint is part of its mint"),
])  # fmt: skip
def test_flags_that_do_not_combine_with_endpoint_are_refused_before_anything(static_offline, capsys, tmp_path, argv, sentence):  # noqa: F811
    out = tmp_path / OUT
    first = [] if "--endpoint" in argv else ["--endpoint", "weather"]
    code, _, err = mint(static_offline, capsys, "--label", "caller", *first, "--out", str(out), *argv)
    assert code == 1 and one_sentence(err).startswith(sentence), err
    assert not out.exists() and load_record(static_offline.paths.space(STATIC), "caller") is None


def test_endpoint_needs_out(static_offline, capsys):  # noqa: F811
    code, _, err = mint(static_offline, capsys, "--endpoint", "weather")
    assert code == 1 and one_sentence(err) == (
        "--endpoint needs --out PATH: a standalone caller file is private and handed out by you - pass --out"
    )
    assert not (static_offline.paths.root / "auth").exists()


def test_channels_need_endpoint(static_offline, capsys):  # noqa: F811
    code, _, err = mint(static_offline, capsys, "--channels", "a")
    assert code == 1 and one_sentence(err).startswith("--channels goes with --endpoint (a standalone caller)")


@pytest.mark.parametrize("flag", [["--server", "nats://127.0.0.1:1"], ["--no-provision"]])
def test_broker_flags_need_an_agent_or_endpoint(static_offline, capsys, flag):  # noqa: F811
    code, _, err = mint(static_offline, capsys, "--profile", "observer", *flag)
    assert code == 1 and one_sentence(err) == (
        f"{flag[0]} goes with an agent or --endpoint; profile observer is minted without the broker - drop {flag[0]}")


def test_a_user_auth_space_refuses_a_standalone_caller(root, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, out, err = root.run(capsys, "auth", "mint", "--space", "default", "--endpoint", "weather", "--out", str(tmp_path / OUT))
    assert (code, out) == (1, "")
    assert one_sentence(err).startswith("space default is a user-auth space: its agents join under a logged-in user")
    assert not (tmp_path / OUT).exists() and not (root.paths.root / "auth").exists()


def test_no_broker_is_refused_naming_the_fix(static_offline, capsys, tmp_path):  # noqa: F811
    # The root's policy port (4333) has nothing listening: nothing to ask the surface of.
    code, _, err = mint(static_offline, capsys, "--label", "caller", "--endpoint", "weather", "--out", str(tmp_path / OUT))
    assert code == 1 and one_sentence(err) == (
        f"no broker answers for the root {static_offline.paths.root} - start it (`cotal up`), or pass --server nats://host:port: "
        "--endpoint asks the endpoint itself"
    )
    assert load_record(static_offline.paths.space(STATIC), "caller") is None


def test_the_caller_path_is_its_own_module_and_mint_stays_one_command():
    """Issue 16: the mint's I/O is ops/ (static_credentials, caller_mint); cli/auth.py is its skin."""
    from cotal_trio.cli import auth
    from cotal_trio.ops import caller_mint, static_credentials

    assert caller_mint.mint_caller.__module__ == "cotal_trio.ops.caller_mint"
    assert static_credentials.mint_native.__module__ == "cotal_trio.ops.static_credentials"
    assert auth.mint_caller is caller_mint.mint_caller and auth.mint_native is static_credentials.mint_native
    assert "mint" in auth.auth_app and "recreate-issued-stores" in auth.auth_app


def test_recreate_on_a_user_auth_space_names_cotal_up(root, capsys, tmp_path, monkeypatch):
    """Found by the fresh-user check: it answered with mint's refusal ("never with a handed-out
    credential file"); a user-auth space's stores are recreated by `cotal up`."""
    monkeypatch.chdir(tmp_path)
    code, out, err = root.run(capsys, "auth", "recreate-issued-stores", "--space", "default", str(tmp_path / "backup"))
    assert (code, out) == (1, "")
    assert one_sentence(err) == (
        "space default is a user-auth space: its issued stores belong to its auth service - stop it, its callout "
        "replicas and managers, then run `cotal up --space default --recreate-issued-stores <backup-dir>`"
    )
    assert not (tmp_path / "backup").exists()


def test_an_unreachable_server_is_refused_naming_the_fix(static_offline, capsys, tmp_path):  # noqa: F811
    """Found by the fresh-user check: `--server nats://127.0.0.1:1` printed the socket error alone."""
    out = tmp_path / OUT
    code, _, err = mint(static_offline, capsys, "--label", "caller", "--endpoint", "weather", "--out", str(out),
                        "--server", "nats://127.0.0.1:1")  # fmt: skip
    assert code == 1
    sentence = one_sentence(err)
    assert sentence.startswith("cannot reach the broker at nats://127.0.0.1:1 (") and sentence.endswith(
        ") - start the root's broker (`cotal up`), or pass --server nats://host:port of a running one that trusts the "
        "space's account"), sentence
    assert not out.exists() and load_record(static_offline.paths.space(STATIC), "caller") is None
