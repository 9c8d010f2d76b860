"""A static agent credential is an issuance (issue 19 item 2; spec credential-authority "Issued
authority"; docs/issued-authority.md "Static agents").

``cotal auth mint --profile agent`` on a static space records the credential's final permission
ceiling as evidence keyed by a fresh generation before the file is written. What that takes, pure:

* the **horizon**: 30 days after the mint (:func:`~cotal_trio.core.issued.static_agent_horizon`),
  carried in the generation's first 8 hex digits;
* the **source**: the credential's ledger family, ``{space, bucket: cotal_auth_<S>, key:
  cred.<lifecycleUid>}`` (:func:`ledger_family`; upstream names a static incarnation's credential
  ledger family so), which ``cotal auth revoke-credential``, the lifecycle terminal, retires;
* the **rows** on the ``ep.v1`` rail with the generation pinned beside the caller triple
  (:func:`static_plan`, :func:`~cotal_trio.core.connect_authority.authority_rows`): the
  registry's ``endpoints`` request, its reply row, and the per-key read of the credential's own
  accepted row ``accepted.v1.<token>``, under a token chosen at mint time (printed in the
  receipt), from which the agent learns its generation;
* the **ceiling**: the whole credential's permissions, those rows included
  (:func:`issued_agent_permissions`, :func:`static_evidence`);
* **renewal** (:func:`renewal_keeps`): the generation is kept only for a byte-identical ceiling,
  and renewals stop at the horizon (:func:`check_renewable`);
* the **consumers** ``cotal auth provision`` makes for a static credential (:func:`footprint_of`,
  issue 19 item 4 for static credentials): an agent's bind-only durables (:func:`durables_of`)
  and two watch readers, an observer's or admin's ``hist__<nonce>`` history readers
  (:func:`readers_of`).

Pure and synchronous: time, generations and tokens come in as values.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .connect_authority import LISTING_REQUEST, AuthorityPlan, authority_rows, widen
from .credentials import Credential
from .errors import ConfigError
from .issued import Evidence, IssuedRef, Source, ceiling_from_native, horizon_of
from .profiles import Permissions, agent_permissions, issuer_permissions, provisioner_permissions
from .wire import (
    USER_INFO_SUBJECT,
    Durable,
    accepted_bucket,
    auth_bucket,
    dm_durable,
    history_reader,
    issued_bucket,
    js_stream_create,
    kv_stream,
    task_durable,
    watch_durable,
)

__all__ = [
    "STATIC_REQUESTS",
    "check_renewable",
    "durables_of",
    "footprint_of",
    "issued_agent_permissions",
    "ledger_family",
    "readers_of",
    "ref_of",
    "renewal_keeps",
    "static_evidence",
    "static_minter_permissions",
    "static_plan",
]

# What a static agent's generation reaches on the ep.v1 rail: the registry's listing question
# (spec "User-auth manager callers": an agent a manager spawns on a static mesh carries the
# `endpoints` row from its first issuance). A static mint grants no `run` capability.
STATIC_REQUESTS = (LISTING_REQUEST,)
LEDGER_KEY_PREFIX = "cred."
# The streams an observer's and an admin's history readers read (spec "Profiles": the observer's
# chat history, the admin's chat and DM history).
HISTORY_KINDS = {"observer": ("chat",), "admin": ("chat", "dm")}


def ledger_family(space: str, uid: str) -> Source:
    """The credential ledger family of lifecycle ``uid``: ``{space, cotal_auth_<space>, cred.<uid>}``.

    The source a static agent's evidence depends on; retiring it (``cotal auth revoke-credential``)
    retires every issuance that names it.

    Raises:
        CodecError: a malformed space or UID.
    """
    return Source(space=space, bucket=auth_bucket(space), key=LEDGER_KEY_PREFIX + uid)


def ref_of(cred: Credential) -> IssuedRef:
    """The issued reference of a static agent's credential (its generation must be set).

    Raises:
        ValueError: ``cred`` carries no generation (not an issued static agent).
    """
    if cred.generation is None:
        raise ValueError(f"credential {cred.label} carries no issued generation")
    return IssuedRef(space=cred.space, owner=cred.owner, actor=cred.actor, uid=cred.lifecycle_uid, generation=cred.generation)


def static_plan(cred: Credential) -> AuthorityPlan:
    """The ``ep.v1`` rows' plan of an issued static agent: its caller triple, the horizon its
    generation carries, the accepted token chosen at its mint and :data:`STATIC_REQUESTS`.

    Raises:
        ValueError: ``cred`` carries no generation.
    """
    ref = ref_of(cred)
    return AuthorityPlan(
        kind="static-agent", space=ref.space, owner=ref.owner, actor=ref.actor, uid=ref.uid,
        horizon=horizon_of(ref.generation), token=cred.accepted_token or "", requests=STATIC_REQUESTS,
    )  # fmt: skip


def issued_agent_permissions(cred: Credential) -> Permissions:
    """The NATS permissions of an issued static agent: the ``agent`` profile with its DM inbox
    keyed by its lifecycle UID (``dm-<o>-<a>-<uid>``; spec "Provisioning"), widened with its
    generation's ``ep.v1`` rows (:func:`static_plan`).

    Raises:
        ValueError: ``cred`` carries no generation.
        Refused: BAD_REQUEST, an input breaks its grammar.
    """
    base = agent_permissions(
        space=cred.space, owner=cred.owner, actor=cred.actor, allow_publish=cred.allow_publish,
        allow_subscribe=cred.allow_subscribe, inbox_nonce=cred.inbox_nonce, role=cred.role,
        inbox_uid=cred.lifecycle_uid,
    )  # fmt: skip
    plan = static_plan(cred)
    return widen(base, authority_rows(plan, cred.generation or ""))


def static_evidence(cred: Credential, fragment: Mapping[str, Any]) -> Evidence:
    """The evidence of ``cred``'s issuance: its reference, its ledger family as the one source,
    the ceiling of ``fragment`` (the NATS ``{pub, sub}`` the credential's JWT carries: its complete
    permissions), and no ``expiresAt`` (the horizon bounds it: a renewal that keeps the generation
    outlives the first file's expiry).

    Raises:
        ValueError: ``cred`` carries no generation. CodecError: a malformed subject.
    """
    ref = ref_of(cred)
    return Evidence(ref=ref, sources=(ledger_family(ref.space, ref.uid),), permissions=ceiling_from_native(fragment))


def renewal_keeps(evidence: Evidence, fragment: Mapping[str, Any]) -> bool:
    """Whether a renewal keeps the generation: the renewed credential's ceiling (its JWT's
    ``{pub, sub}`` built on the same generation and token) is byte-identical to the evidence's
    (spec "Issued authority").

    Raises:
        CodecError: ``fragment`` is not the NATS shape.
    """
    return evidence.permissions.canonical() == ceiling_from_native(fragment).canonical()


def durables_of(cred: Credential) -> tuple[Durable, ...]:
    """The bind-only durables a static agent's credential binds (spec "Provisioning"): its DM
    inbox (keyed by its lifecycle UID when it is issued, by its principal for a credential minted
    before) and, with a role, its role's task queue ``task-<role>`` (shared by the role's agents:
    each task goes to one of them).

    Raises:
        Refused: BAD_REQUEST, a malformed name.
    """
    inbox = dm_durable(cred.space, cred.owner, cred.actor, cred.lifecycle_uid if cred.generation else None)
    return (inbox,) if cred.role is None else (inbox, task_durable(cred.space, cred.role))


def readers_of(cred: Credential) -> tuple[Durable, ...]:
    """The pull-only readers ``cred``'s profile reads and never creates (spec "Profiles";
    docs/wire-layout.md "Watches and history readers"): an agent's two watch readers
    ``watch-presence-<o>-<a>`` and ``watch-channels-<o>-<a>``; an observer's history reader
    ``hist__<nonce>`` on chat; an admin's on chat and on DM (``<nonce>``: its inbox nonce).

    Raises:
        Refused: BAD_REQUEST, a malformed name.
    """
    if cred.profile == "agent":
        return tuple(watch_durable(cred.space, kind, cred.owner, cred.actor) for kind in ("presence", "channels"))
    return tuple(history_reader(cred.space, kind, cred.inbox_nonce) for kind in HISTORY_KINDS[cred.profile])


def footprint_of(cred: Credential) -> tuple[Durable, ...]:
    """Every consumer a static mint or ``cotal auth provision`` makes for ``cred``, in that
    order: an agent's bind-only durables (:func:`durables_of`) then its watch readers; an
    observer's or admin's history readers (:func:`readers_of`).

    Raises:
        Refused: BAD_REQUEST, a malformed name.
    """
    return (*(durables_of(cred) if cred.profile == "agent" else ()), *readers_of(cred))


def check_renewable(cred: Credential, *, now: float) -> None:
    """Refuse a renewal of ``cred`` that cannot keep its issuance: not an issued static agent,
    revoked, or at or after its horizon (spec: renewals stop at the horizon, then the agent is
    respawned).

    Raises:
        ConfigError: the sentence names the fix (a fresh mint with ``--identity --replace``).
    """
    respawn = f"mint it again: `cotal auth mint --label {cred.label} --space {cred.space} --identity {cred.path} --replace`"
    if cred.generation is None:
        raise ConfigError(f"credential {cred.label} carries no issued generation (minted before static issuance, or not an agent) - {respawn}")
    if cred.revoked_at is not None:
        raise ConfigError(f"credential {cred.label} was revoked at {cred.revoked_at} and is not renewed - {respawn}")
    horizon = horizon_of(cred.generation)
    if now >= horizon:
        raise ConfigError(f"credential {cred.label}'s generation reached its horizon (unix {horizon}): renewals stop there - {respawn}")


def static_minter_permissions(*, space: str, inbox_nonce: str) -> Permissions:
    """A static mint's temporary connection: the ``provisioner`` profile (the space's streams and
    the bind-only durables), the ``issuer`` profile (evidence, attempt, source index and accepted
    rows) and ``STREAM.CREATE`` of both issued stores (a static space has no lane to create them).

    Raises:
        Refused: BAD_REQUEST for a bad space or nonce.
    """
    create = [js_stream_create(kv_stream(bucket)) for bucket in (issued_bucket(space), accepted_bucket(space))]
    parts = (provisioner_permissions(space=space, inbox_nonce=inbox_nonce), issuer_permissions(space=space, inbox_nonce=inbox_nonce))
    pub = [s for part in parts for s in part.pub_allow if s != USER_INFO_SUBJECT]
    return Permissions(pub_allow=tuple(dict.fromkeys([*pub, *create, USER_INFO_SUBJECT])), sub_allow=parts[0].sub_allow)
