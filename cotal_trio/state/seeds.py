"""``<root>/broker/seeds.json``: the client URL of each cluster node rendered from this root.

Issue 17 item 3 ("the same is read from the root's broker record"): ``cotal broker config
--node NAME`` records the client URL of the node it renders, so the root commands and
``cotal auth-service`` default their ``--server`` to every node's URL. One entry per node name,
in the order first rendered; rendering a node again replaces its entry. ``broker.json`` (the
root's keys) is not rewritten for it: a render must never risk the operator keys.

Shape: ``{"ver": 1, "nodes": {"n1": "nats://127.0.0.1:4222", ...}}``. Blocking file I/O.
"""

from __future__ import annotations

from pathlib import Path

from ..core.errors import ConfigError
from ..core.servers import parse_servers
from .files import VERSION, read_fields, write_json
from .layout import RootPaths

__all__ = ["SEEDS_FILE", "load_seeds", "record_seed", "seeds_path"]

SEEDS_FILE = "seeds.json"


def seeds_path(paths: RootPaths) -> Path:
    """Where the root records its nodes' client URLs."""
    return paths.broker_dir / SEEDS_FILE


def load_seeds(paths: RootPaths) -> tuple[str, ...]:
    """The recorded client URLs, in node order; ``()`` when no node was rendered.

    Raises:
        ConfigError: the file is corrupt (not JSON, wrong ``ver``, a URL that is not one).
    """
    path = seeds_path(paths)
    if not path.exists():
        return ()
    fields = read_fields(path)
    nodes = fields.get("nodes", dict)
    urls = []
    for name, url in nodes.items():
        if not isinstance(url, str) or "," in url:
            raise fields.bad(f"nodes.{name} is not one URL")
        try:
            urls.extend(parse_servers(url, flag=f"nodes.{name}"))
        except ConfigError as exc:
            raise fields.bad(str(exc)) from None
    return tuple(dict.fromkeys(urls))


def record_seed(paths: RootPaths, node: str, url: str) -> None:
    """Record (or replace) ``node``'s client URL ``url`` (``nats://host:port``); atomic, 0600.

    Raises:
        ConfigError: the existing file is corrupt (one sentence naming it), or ``url`` is not a
            broker URL.
    """
    parse_servers(url, flag=f"node {node}'s client URL")
    path = seeds_path(paths)
    nodes: dict[str, str] = {}
    if path.exists():
        nodes = dict(read_fields(path).get("nodes", dict))
    nodes[node] = url
    write_json(path, {"ver": VERSION, "nodes": nodes})
