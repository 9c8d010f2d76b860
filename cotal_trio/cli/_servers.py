"""Which broker a root command talks to: ``--server``, else the root's recorded nodes, else its
``cotal up`` broker.

Issue 17 items 3 and 6: on a cluster root (provisioned with ``cotal space add`` and served with
``cotal auth-service --server``) there is no ``policy.json``, which only ``cotal up`` writes, so
``connect-info``, ``check`` and ``status`` take ``--server``: one URL or every node's URL,
comma-separated. Without it they use the client URLs ``cotal broker config`` recorded for the
nodes it rendered (``<root>/broker/seeds.json``), else ``policy.json``'s loopback port.
"""

from __future__ import annotations

import errno
from typing import Annotated
from cyclopts import Parameter

from ..core.errors import ConfigError
from ..core.servers import parse_servers
from ..state import RootPaths, load_policy
from ..state.seeds import load_seeds, seeds_path

__all__ = ["Server", "parse_servers", "refused_connect", "resolve_servers"]

Server = Annotated[
    str | None,
    Parameter(help="The broker's seed URLs, comma-separated: nats://host:port, or every node of a cluster (default: the nodes `cotal broker config` rendered, else the root's `cotal up` broker)."),
]


def resolve_servers(paths: RootPaths, server: str | None) -> tuple[str, ...]:
    """The broker's seed URLs for ``paths``: ``--server`` parsed; else every node recorded in
    ``<root>/broker/seeds.json`` (``cotal broker config`` writes it); else ``policy.json``'s
    loopback broker (``cotal up``). Blocking file I/O.

    Raises:
        ConfigError: a bad ``--server``; none of the three (one sentence naming them and the
            fix); a corrupt ``seeds.json`` or ``policy.json``.
    """
    if server is not None:
        return parse_servers(server)
    seeds = load_seeds(paths)
    if seeds:
        return seeds
    if not paths.policy_json.exists():
        raise ConfigError(
            f"no broker address for root {paths.root}: --server is not given, no node is recorded in"
            f" {seeds_path(paths)} (`cotal broker config` records them) and {paths.policy_json} is missing"
            " (only `cotal up` writes it) - pass --server nats://host:port (a cluster: every node's URL,"
            " comma-separated)"
        )
    return (f"nats://127.0.0.1:{load_policy(paths.policy_json).port}",)


def refused_connect(exc: BaseException) -> bool:
    """Whether ``exc`` (an ``Unavailable``) came from a connect nothing accepted: its cause chain
    holds a refused (or unroutable) socket connect, also inside an exception group (trio's
    ``open_tcp_stream`` raises ``OSError("all attempts to connect ... failed")`` from a group of
    each address's error)."""
    link: BaseException | None = exc
    while link is not None:
        if isinstance(link, ConnectionRefusedError) or getattr(link, "errno", None) in _UNREACHABLE:
            return True
        if isinstance(link, BaseExceptionGroup) and any(refused_connect(inner) for inner in link.exceptions):
            return True
        link = link.__cause__
    return False


_UNREACHABLE = (errno.ECONNREFUSED, errno.EHOSTUNREACH, errno.ENETUNREACH)
