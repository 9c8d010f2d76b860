"""``cotal dev-idp token`` (cotal_trio/cli/devidp.py)."""

from __future__ import annotations

import json
import time

from cotal_trio.core.idp import IdpPin as CorePin
from cotal_trio.core.idp import parse_jwks, verify_idp_token
from cotal_trio.devidp import jwks
from cotal_trio.state import IdpPinRecord, save_idp_pin

from tests.support.cli_root import Root


def _identity(root: Root, token: str):
    pin = CorePin(issuer=root.idp.issuer, audience=root.idp.audience)
    return verify_idp_token(token, pin=pin, keys=parse_jwks(jwks(root.idp)), now=time.time())


def test_token_prints_a_dev_idp_jwt_for_the_subject(root, capsys):
    code, out, err = root.run(capsys, "dev-idp", "token", "--sub", "alice")
    identity = _identity(root, out.strip())
    assert (code, err) == (0, "")
    assert identity.sub == "alice" and identity.exp - identity.iat == 3600


def test_ttl_sets_the_lifetime(root, capsys):
    code, out, _ = root.run(capsys, "dev-idp", "token", "--sub", "alice", "--ttl", "60")
    identity = _identity(root, out.strip())
    assert code == 0 and identity.exp - identity.iat == 60


def test_json_prints_the_token_and_what_it_says(root, capsys):
    """Issue 18 item 7: a script reads the token and its expiry without decoding the JWT."""
    code, out, err = root.run(capsys, "dev-idp", "token", "--sub", "alice", "--ttl", "60", "--json")
    assert (code, err) == (0, "")
    printed = json.loads(out)
    identity = _identity(root, printed.pop("token"))
    assert printed == {"sub": "alice", "issuer": root.idp.issuer, "audience": root.idp.audience, "exp": identity.exp}
    assert identity.sub == "alice" and identity.exp - identity.iat == 60


def test_a_space_that_pins_the_dev_idp_is_accepted(root, capsys):
    code, out, _ = root.run(capsys, "dev-idp", "token", "--sub", "alice", "--space", "default")
    assert code == 0 and _identity(root, out.strip()).sub == "alice"


def test_a_root_without_a_dev_idp_names_cotal_up(root, capsys):
    root.paths.devidp_json.unlink()
    code, out, err = root.run(capsys, "dev-idp", "token", "--sub", "alice")
    assert (code, out) == (1, "")
    assert err == f"cotal: no development IdP in {root.paths.root} - run `cotal up` without --idp first\n"


def test_a_space_pinned_to_a_real_idp_refuses(root, capsys):
    pin = IdpPinRecord(kind="oidc", url="https://idp.example", issuer="https://idp.example",
                       audience="https://idp.example", jwks_uri="https://idp.example/jwks")  # fmt: skip
    save_idp_pin(root.space.idp_json, pin)
    code, out, err = root.run(capsys, "dev-idp", "token", "--sub", "alice", "--space", "default")
    assert (code, out) == (1, "")
    assert err == "cotal: space default pins a real IdP (https://idp.example); get a token from it\n"


def test_a_space_pinned_to_another_dev_idp_refuses(root, capsys):
    other = IdpPinRecord(kind="dev", url="", issuer="urn:cotal:dev-idp:000000000000", audience="cotal-dev", jwks_uri="")
    save_idp_pin(root.space.idp_json, other)
    code, _, err = root.run(capsys, "dev-idp", "token", "--sub", "alice", "--space", "default")
    assert code == 1 and err.startswith("cotal: space default pins another development IdP")


def test_a_non_positive_ttl_is_refused(root, capsys):
    code, _, err = root.run(capsys, "dev-idp", "token", "--sub", "alice", "--ttl", "0")
    assert code == 1 and err == "cotal: --ttl is a positive number of seconds, for example --ttl 3600\n"


def test_a_corrupt_dev_idp_file_is_one_sentence(root, capsys):
    root.paths.devidp_json.write_text("[]")
    code, _, err = root.run(capsys, "dev-idp", "token", "--sub", "alice")
    assert code == 1 and err.startswith("cotal: devidp.json is not a development IdP document")
    assert len(err.splitlines()) == 1
