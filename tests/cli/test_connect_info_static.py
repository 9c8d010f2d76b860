"""``cotal connect-info`` on a static space, and the server in ``cotal auth mint``'s receipt
(issue 18 item 5; docs/static-credentials.md).

A static space has no exchange, no sentinel and no IdP pin: its clients connect with a minted
``.creds`` file. connect-info names the server(s) and, per label, the file and inbox prefix from
the records ``cotal auth mint`` writes. The server is ``policy.json``'s port (its broker runs: a
static agent mint is an issuance) or ``--server``.
"""

from __future__ import annotations

import json

from cotal_trio.state import load_policy, remove_quietly

from tests.support.cli_root import Root
from tests.support.static_mint import STATIC, mint, static  # noqa: F401 - the fixture


def server_of(root: Root) -> str:
    """The root's broker, as ``policy.json`` names it (the fixture's running one)."""
    return f"nats://127.0.0.1:{load_policy(root.paths.policy_json).port}"


def test_connect_info_of_a_static_space_lists_each_credential(static: Root, capsys):
    _, bot, _ = mint(static, capsys, "--label", "bot", "--allow-publish", "team.>")
    _, obs, _ = mint(static, capsys, "--profile", "observer", "--label", "watcher", "--no-expiry")
    SERVER = server_of(static)  # noqa: N806
    code, out, err = static.run(capsys, "connect-info", "--space", STATIC, "--json")
    assert (code, err) == (0, "")
    assert json.loads(out) == {
        "space": STATIC, "mode": "static", "server": SERVER, "servers": [SERVER],
        "credentials": [
            {"label": "bot", "profile": "agent", "principal": bot["principal"], "path": bot["path"],
             "inboxPrefix": bot["inboxPrefix"], "expiresAt": bot["expiresAt"], "state": "healthy"},
            {"label": "watcher", "profile": "observer", "principal": obs["principal"], "path": obs["path"],
             "inboxPrefix": obs["inboxPrefix"], "expiresAt": None, "state": "no-expiry"},
        ],
    }  # fmt: skip
    code, out, err = static.run(capsys, "connect-info", "--space", STATIC)
    assert (code, err) == (0, "")
    assert out.splitlines() == [
        f"space: {STATIC}",
        "mode: static (a client connects with its minted .creds file)",
        f"server: {SERVER}",
        f"credential.bot: {bot['path']} (inbox prefix {bot['inboxPrefix']}, agent, healthy)",
        f"credential.watcher: {obs['path']} (inbox prefix {obs['inboxPrefix']}, observer, no-expiry)",
    ]


def test_a_static_space_with_no_credential_names_the_mint(static: Root, capsys):
    code, out, err = static.run(capsys, "connect-info", "--space", STATIC, "--server", "nats://a:4222, nats://b:4222")
    assert (code, err) == (0, "")
    assert out.splitlines() == [
        f"space: {STATIC}", "mode: static (a client connects with its minted .creds file)",
        "server: nats://a:4222,nats://b:4222", f"credentials: none minted - run `cotal auth mint --space {STATIC}`",
    ]  # fmt: skip


def test_a_revoked_credential_is_listed_as_revoked(static: Root, capsys):
    _, bot, _ = mint(static, capsys, "--label", "bot")
    code, _, err = static.run(capsys, "auth", "revoke-credential", "bot", "--space", STATIC)
    assert code == 0, err
    code, out, _ = static.run(capsys, "connect-info", "--space", STATIC, "--json")
    assert code == 0 and [(c["label"], c["state"]) for c in json.loads(out)["credentials"]] == [("bot", "revoked")]


def test_a_static_space_without_policy_or_server_names_both(static: Root, capsys):
    remove_quietly(static.paths.policy_json)
    code, out, err = static.run(capsys, "connect-info", "--space", STATIC)
    assert (code, out) == (1, "") and "--server is not given" in err and len(err.splitlines()) == 1


def test_the_mint_receipt_names_the_server(static: Root, capsys):
    code, receipt, err = mint(static, capsys, "--label", "bot")
    assert code == 0, err
    SERVER = server_of(static)  # noqa: N806
    assert receipt["server"] == SERVER
    code, out, err = static.run(capsys, "auth", "mint", "--space", STATIC, "--label", "bot2")
    assert code == 0, err
    assert f"  server    {SERVER}" in out.splitlines()


def test_the_mint_receipt_without_a_known_server_says_to_pass_it(static: Root, capsys):
    remove_quietly(static.paths.policy_json)  # an observer: minted without the broker (an agent needs one)
    code, receipt, err = mint(static, capsys, "--label", "bot", "--profile", "observer")
    assert (code, receipt["server"]) == (0, None), err
    code, out, _ = static.run(capsys, "auth", "mint", "--space", STATIC, "--label", "bot2", "--profile", "observer")
    assert code == 0 and "  server    your broker's URL (this root has no policy.json; `cotal connect-info --server` takes it)" in out.splitlines()
