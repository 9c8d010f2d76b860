"""Leaf-node links to the root's broker, and which of them bypass the callout (issue 17 item 5).

docs/deploy.md "Leaf nodes" has the measurements this rests on (nats-server 2.15.1). The auth
account's callout runs on the server a client connects to: a connect made at a leaf node is
decided there, and never reaches a callout member connected to the hub. So a leaf whose link
binds one of a space's accounts lets its own clients into that account on whatever terms the
leaf sets. A leaf of the supported shape (``cotal broker leaf-config``) trusts the root's
operator and links the system account too: its clients can only be users the space's signing
keys signed, or sentinels its callout decides. A leaf that does not (a plain leaf whose link
carries a data-account user's creds) admits its clients with no callout at all: that is the
bypass ``cotal doctor auth`` warns about.

What tells the two apart is what the broker reports on its system account:

* ``$SYS.REQ.SERVER.PING.LEAFZ``: every server's leaf connections; on the server that accepted a
  link (``is_spoke`` false) each entry names the leaf (``name``, its ``server_name``) and the
  account the link binds.
* ``$SYS.REQ.SERVER.PING.VARZ``: every server that shares the system account answers, a leaf
  linked to it included, with its ``trusted_operators_claim`` and ``system_account``.

A leaf is **decided by the callout** when a server of that name answered VARZ trusting the
root's operator with the root's system account; otherwise each of its links that binds a space's
account is a bypass. :func:`classify` is that decision, pure; :func:`read_leaf_links` asks the
broker.

A decided leaf still needs a callout member connected to it, or every connect made there is
refused after the auth timeout: ``$SYS.REQ.SERVER.PING.SUBSZ`` filtered by the space's auth
account and ``test: $SYS.REQ.USER.AUTH`` counts each server's callout subscriptions
(:func:`callout_members`, :func:`read_callout_members`).
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import trio

from cotal_trio import natsio
from cotal_trio.broker.accounts import open_system_connection
from cotal_trio.core.errors import Unavailable
from cotal_trio.state import BrokerMaterial

__all__ = [
    "GATHER_S", "LEAFZ", "SUBSZ", "VARZ", "LeafLink", "callout_members", "classify", "read_callout_members",
    "read_leaf_links",
]

LEAFZ = "$SYS.REQ.SERVER.PING.LEAFZ"
VARZ = "$SYS.REQ.SERVER.PING.VARZ"
SUBSZ = "$SYS.REQ.SERVER.PING.SUBSZ"
AUTH_REQUEST = "$SYS.REQ.USER.AUTH"
# How long the replies of every server are gathered (seconds): a PING has no reply count, each
# server answers once, in milliseconds on a healthy broker.
GATHER_S = 1.0


@dataclass(frozen=True, slots=True, kw_only=True)
class LeafLink:
    """One leaf-node link as the server that accepted it reports it.

    Attributes:
        hub: the ``server_name`` of the node that accepted the link.
        leaf: the leaf's ``server_name``.
        account: the account (public key) the link binds.
        decided: the leaf answered on the root's system account trusting the root's operator:
            its clients' connects are decided by the account's own rules (the callout, for a
            space's auth account). False: the leaf sets its own terms (the bypass).
        url: the leaf's client URL as its VARZ gives it (``nats://host:port``), or None (not
            decided, or a wildcard listener).
    """

    hub: str
    leaf: str
    account: str
    decided: bool
    url: str | None = None


def _trusted(varz: Mapping[str, Any], operator: str, system_account: str) -> bool:
    claims = varz.get("trusted_operators_claim") or []
    operators = {c.get("sub") for c in claims if isinstance(c, Mapping)}
    return operator in operators and varz.get("system_account") == system_account


def classify(
    leafz: Sequence[Mapping[str, Any]], varz: Sequence[Mapping[str, Any]], *, operator: str, system_account: str
) -> list[LeafLink]:
    """Sync: every accepted leaf link in the LEAFZ replies, with whether its leaf is decided.

    Args:
        leafz, varz: the servers' replies to :data:`LEAFZ` and :data:`VARZ` (``{"server":
            {"name"}, "data": {...}}``, as nats-server sends them); a reply of another shape is
            skipped.
        operator, system_account: the root's operator and system account public keys.

    Returns:
        One :class:`LeafLink` per link a server accepted (``is_spoke`` false), in reply order.
    """
    trusted = {
        reply["data"].get("server_name"): _client_url(reply["data"])
        for reply in varz
        if isinstance(reply.get("data"), Mapping) and _trusted(reply["data"], operator, system_account)
    }
    links = []
    for reply in leafz:
        data, server = reply.get("data"), reply.get("server")
        if not isinstance(data, Mapping) or not isinstance(server, Mapping):
            continue
        for leaf in data.get("leafs") or []:
            if not isinstance(leaf, Mapping) or leaf.get("is_spoke"):
                continue  # the leaf's own view of its link: the hub's entry is the one to read
            name = str(leaf.get("name", ""))
            links.append(LeafLink(hub=str(server.get("name", "")), leaf=name, account=str(leaf.get("account", "")),
                                  decided=name in trusted, url=trusted.get(name)))  # fmt: skip
    return links


def _client_url(varz: Mapping[str, Any]) -> str | None:
    host, port = varz.get("host"), varz.get("port")
    if not isinstance(host, str) or not isinstance(port, int) or host in ("", "0.0.0.0", "::"):
        return None
    return f"nats://[{host}]:{port}" if ":" in host else f"nats://{host}:{port}"


def callout_members(subsz: Sequence[Mapping[str, Any]]) -> dict[str, int]:
    """Sync: server name -> its callout subscriptions, from the replies to :data:`SUBSZ` asked
    for one auth account with ``test`` :data:`AUTH_REQUEST` (a reply of another shape is skipped)."""
    members: dict[str, int] = {}
    for reply in subsz:
        data, server = reply.get("data"), reply.get("server")
        if not isinstance(data, Mapping) or not isinstance(server, Mapping):
            continue
        found = data.get("subscriptions_list") or []
        members[str(server.get("name", ""))] = sum(
            1 for sub in found if isinstance(sub, Mapping) and sub.get("subject") == AUTH_REQUEST
        )
    return members


async def read_callout_members(url: str, broker: BrokerMaterial, auth_account: str) -> dict[str, int]:
    """Trio: :func:`callout_members` of ``auth_account`` as every server sharing the system
    account reports them, asked as the root's system user. Opens its own
    :func:`~cotal_trio.natsio.open_loop`.

    Raises:
        Unavailable: the broker refused or did not answer the connect.
    """
    query = json.dumps({"account": auth_account, "subscriptions": True, "test": AUTH_REQUEST}).encode()
    async with natsio.open_loop(), open_system_connection(url, broker) as conn:
        return callout_members(await _gather(conn, SUBSZ, query))


async def _gather(conn: natsio.Connection, subject: str, payload: bytes = b"{}") -> list[dict[str, Any]]:
    """Trio: every reply to one PING within :data:`GATHER_S`; a reply that is not JSON is skipped."""
    inbox = f"_INBOX.cotal-leafz-{secrets.token_hex(8)}"
    replies: list[dict[str, Any]] = []

    def keep(msg: natsio.Message) -> None:
        try:
            replies.append(json.loads(msg.data))
        except ValueError:
            pass

    await conn.subscribe(inbox, on_message=keep)
    await conn.flush()
    conn.publish_nowait(subject, payload, reply=inbox)
    await trio.sleep(GATHER_S)
    return [r for r in replies if isinstance(r, dict)]


async def read_leaf_links(url: str, broker: BrokerMaterial) -> list[LeafLink]:
    """Trio: the leaf links of the broker at ``url`` (seed URLs), classified (:func:`classify`),
    asked as the root's system user. Opens its own :func:`~cotal_trio.natsio.open_loop`.

    Raises:
        Unavailable: the broker refused or did not answer the connect.
    """
    async with natsio.open_loop(), open_system_connection(url, broker) as conn:
        leafz = await _gather(conn, LEAFZ)
        varz = await _gather(conn, VARZ)
    if not leafz:
        raise Unavailable(f"no server at {url} answered {LEAFZ}")
    return classify(leafz, varz, operator=broker.operator.public_key, system_account=broker.system_account)
