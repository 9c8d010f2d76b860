"""The IdP bridge and its two mandatory hooks (cotal_trio/core/bridge.py; spec "Bridge contract")."""

from __future__ import annotations

import pytest

from cotal_trio.core.bearer import BearerVerifier
from cotal_trio.core.bridge import ConnectCredentialRequest, IdpBridge, no_root_credential
from cotal_trio.core.errors import ConfigError, Refused
from cotal_trio.core.identity import derive_owner
from cotal_trio.core.idp import parse_jwks
from cotal_trio.core.jose import BearerKeySet, IssuerKey
from cotal_trio.core.ledger import LedgerKind, LedgerRow
from cotal_trio.devidp import create_dev_idp, jwks, mint_dev_token

SPACE = "alpha"
NOW = 1_800_000_000
SECRET = bytes(range(32, 64))
SUB = "person-7"
DEV_IDP = create_dev_idp(lambda n: bytes(range(100, 100 + n)))
KEY = IssuerKey.generate(bytes(range(32)))
OWNER = derive_owner(SECRET, DEV_IDP.issuer, SUB)
LIFECYCLE = "b" * 26


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def _row(actor: str = "cli", owner: str = OWNER, **fields) -> LedgerRow:
    base = {
        "kind": LedgerKind.INTERACTIVE, "owner": owner, "actor": actor, "scope": ("spawn", "role:ops"),
        "allow_subscribe": (">",), "allow_publish": (), "lifecycle_uid": LIFECYCLE,
        "parent": None, "granted_at": "2026-11-29T10:00:00.000Z",
    }  # fmt: skip
    return LedgerRow(**{**base, **fields})


def _bridge(clock: Clock, *, authorize=None, mint=None) -> IdpBridge:
    return IdpBridge(
        space=SPACE, idp_pin=DEV_IDP.pin(), idp_keys=lambda: parse_jwks(jwks(DEV_IDP)), owner_secret=SECRET,
        issuer_key=KEY, authorize_actor=authorize or (lambda owner, actor: _row(actor, owner)),
        mint_connect_credential=mint or no_root_credential, clock=clock,
    )  # fmt: skip


def _claims(token: str, now: float):
    return BearerVerifier(BearerKeySet.from_keys([KEY])).validate(token, space=SPACE, now=now)


def _token(ttl_s: int = 600) -> str:
    return mint_dev_token(DEV_IDP, sub=SUB, now=NOW - 10, ttl_s=ttl_s)


@pytest.mark.parametrize("hook", ["authorize_actor", "mint_connect_credential"])
def test_both_hooks_are_mandatory(hook):
    fields = {"authorize_actor": lambda o, a: _row(a, o), "mint_connect_credential": no_root_credential, hook: None}
    with pytest.raises(ConfigError, match=f"needs its {hook} hook - both hooks are mandatory"):
        IdpBridge(
            space=SPACE, idp_pin=DEV_IDP.pin(), idp_keys=dict, owner_secret=SECRET, issuer_key=KEY,
            clock=Clock(NOW), **fields,
        )  # fmt: skip


def test_the_authorize_hook_is_the_only_source_of_scope_and_parent():
    parent = f"{OWNER}.spawner"
    bridge = _bridge(Clock(NOW), authorize=lambda owner, actor: _row(actor, owner, scope=("run",), parent=parent))
    minted = bridge.exchange(_token(), "cli", ttl_s=300)
    bearer = _claims(minted.token, NOW)
    assert (bearer.owner, bearer.actor, bearer.scope, bearer.parent) == (OWNER, "cli", ("run",), parent)
    assert bearer.lifecycle_uid == LIFECYCLE and minted.exp == NOW + 300


def test_the_credential_hook_is_asked_for_the_incarnation_and_its_id_is_bound():
    asked: list[ConnectCredentialRequest] = []

    def mint(request: ConnectCredentialRequest) -> str:
        asked.append(request)
        return f"root.{request.lifecycle_uid}"

    minted = _bridge(Clock(NOW), mint=mint).exchange(_token(), "cli")
    assert asked == [ConnectCredentialRequest(owner=OWNER, actor="cli", lifecycle_uid=LIFECYCLE)]
    assert _claims(minted.token, NOW).credential_id == f"root.{LIFECYCLE}"


def test_time_spent_in_the_hooks_shortens_the_bearer():
    clock = Clock(NOW)
    proof_exp = NOW - 10 + 600

    def slow_mint(request: ConnectCredentialRequest) -> None:
        clock.now += 400  # the host took 400 s to finalize its authority
        return None

    minted = _bridge(clock, mint=slow_mint).exchange(_token(), "cli", ttl_s=900)
    assert minted.exp == proof_exp  # not NOW + 400 + 900: the proof's exp read at signing
    assert _claims(minted.token, clock.now).iat == NOW + 400


def test_a_proof_that_expires_inside_a_hook_is_refused():
    clock = Clock(NOW)

    def slow_authorize(owner: str, actor: str) -> LedgerRow:
        clock.now += 600
        return _row(actor, owner)

    with pytest.raises(Refused, match="IdP token expired"):
        _bridge(clock, authorize=slow_authorize).exchange(_token(), "cli")


def test_a_hook_row_for_another_principal_mints_nothing():
    bridge = _bridge(Clock(NOW), authorize=lambda owner, actor: _row("other", owner))
    with pytest.raises(Refused, match='actor "cli" is not granted'):
        bridge.exchange(_token(), "cli")


def test_verify_then_admit_is_authenticate_split_around_the_hook():
    """A trio shell runs the hook in a worker thread between the two pure steps (issue 15 item 7)."""
    bridge = _bridge(Clock(NOW), authorize=lambda owner, actor: pytest.fail("verify must not call the hook"))
    proven = bridge.verify(_token(), "cli", now=NOW)
    assert (proven.owner, proven.actor) == (OWNER, "cli")
    auth = bridge.admit(proven, _row("cli", OWNER))
    assert (auth.owner, auth.row.actor, auth.identity) == (OWNER, "cli", proven.identity)
    with pytest.raises(Refused, match='actor "cli" is not granted'):
        bridge.admit(proven, _row("other", OWNER))
