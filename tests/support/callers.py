"""A caller's signed intent, for the pure caller tests and the ops caller-order tests."""

from __future__ import annotations

from cotal_trio.core import caller_checks, callers, natsjwt
from cotal_trio.core import credentials as rules
from cotal_trio.core.callers import Intent, Surface
from cotal_trio.core.nkeys import KeyPair, Prefix

SPACE, ENDPOINT = "st", "weather"
OWNER, ACTOR, UID, NONCE = "u_" + "a" * 26, "bot", "c" * 26, "nonce1234"
SIGNER, OTHER_SIGNER = KeyPair.generate(Prefix.ACCOUNT), KeyPair.generate(Prefix.ACCOUNT)
ACCOUNT = KeyPair.generate(Prefix.ACCOUNT).public_key
USER = KeyPair.generate(Prefix.USER)
IAT, EXP = 1_760_000_000, 1_760_086_400
GOOD = Surface(endpoint=ENDPOINT, verbs=("invoke", "forecast"), targeted=False, synchronous=True, ephemeral=True,
               journaled=False, action=False)  # fmt: skip


def caller_permissions(**change):
    args = {"space": SPACE, "owner": OWNER, "actor": ACTOR, "channels": ("team.>", "ops"), "inbox_nonce": NONCE,
            "endpoint": ENDPOINT, "verbs": ("invoke", "describe", "forecast")} | change  # fmt: skip
    return callers.standalone_caller_permissions(**args)


def make_intent(**change) -> Intent:
    fields = {"space": SPACE, "endpoint": ENDPOINT, "owner": OWNER, "actor": ACTOR, "uid": UID, "user_key": USER.public_key,
              "surface": GOOD.digest, "ceiling": callers.ceiling_digest(caller_permissions(verbs=GOOD.verbs).to_nats()),
              "issued_at": IAT, "expires_at": EXP} | change  # fmt: skip
    return Intent(**fields)


def caller_jwt(*, signer=SIGNER, user=USER, perms=None, exp=EXP, iat=IAT, principal=f"{OWNER}.{ACTOR}", uid=UID) -> str:
    """A caller JWT as the mint writes it (rules.credential_claims' tags), for ``principal``."""
    perms = perms or caller_permissions(verbs=GOOD.verbs).to_nats()
    owner, actor = principal.split(".")
    tags = rules.credential_tags(owner=owner, actor=actor, profile="agent", uid=uid, label="caller")
    claims = natsjwt.user_claims(user=user.public_key, name=f"{owner}-{actor}", issuer_account=ACCOUNT, permissions=perms,
                                 exp=exp, tags=tags)  # fmt: skip
    return natsjwt.encode(claims, signer, iat=iat)


DATA = caller_checks.DataAccount(key=ACCOUNT, signers=frozenset({SIGNER.public_key}))
