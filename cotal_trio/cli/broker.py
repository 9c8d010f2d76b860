"""``cotal broker config``: one cluster node's nats-server config, rendered from the root.

Issue 17 item 4: the nodes of a cluster trust the root's operator and system account, as
``nsc generate config --nats-resolver`` makes every node trust its operator. The text comes from
:func:`cotal_trio.broker.config.render_node`, the renderer of ``cotal up``'s own broker, so a node
gets the same ``max_control_line``, resolver and preload lines. It prints the config: ``> n1.conf``
(then ``chmod 600``). The root's ``broker.json`` must exist (``cotal space add`` or ``cotal up``
create it). The text carries the operator and system account JWTs (public) and the root's route
secret (not public: :func:`~cotal_trio.broker.config.route_secret`, created once in
``<root>/broker/route.secret`` on first use), which authenticates the routes between nodes;
monitoring binds ``--http-host``, loopback by default, since it has no auth. The node's client
URL (``nats://--host:--port``; none for a wildcard ``--host``) is recorded in
``<root>/broker/seeds.json`` (:mod:`cotal_trio.state.seeds`): the default ``--server`` of the
root commands and ``cotal auth-service`` (issue 17 item 3).

``cotal broker leaf-config`` prints a leaf node's config (issue 17 item 5, the one supported
shape of docs/deploy.md "Leaf nodes"): the same trust, no JetStream, a link binding the system
account and one link per space binding its data account. It writes the links' creds files in
``--creds-dir`` (0600, created once: a second render reuses them): ``system.creds`` (the root's
system user) and ``leaf-<space>.creds`` (a data-account user of the space, named
``cotal-leaf:<node>``, minted by the space's service signing key, no expiry). A leaf is not
recorded in ``seeds.json``: the full service and the root commands talk to the hub.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import cyclopts
from cyclopts import Parameter

from ..broker import provision
from ..broker.config import (
    CLUSTER_NAME, LISTEN_HOST, Cluster, LeafRemote, Node, parse_hub_urls, parse_routes, render_node, route_secret,
)
from ..broker.spaces import list_spaces
from ..core.errors import ConfigError
from ..state import RootPaths, atomic_create, ensure_dir, load_broker, load_space
from ..state.seeds import record_seed
from .common import PortRange, Where, check_auth_timeout

__all__ = ["broker_app", "config", "leaf_config"]

broker_app = cyclopts.App(name="broker", help="Render the nats-server configs of a cluster's nodes from the root.")

DEFAULT_PORT = 4222
DEFAULT_CLUSTER_PORT = 6222


@Parameter(name="*")
@dataclass(frozen=True, kw_only=True)
class NodeFlags:
    """The node: its name, the cluster it joins and the listeners it binds."""

    node: Annotated[str, Parameter(help="The node's server_name, unique in the cluster (letters, digits, _ and -).")]
    cluster_routes: Annotated[str, Parameter(help="Every node's route URL, comma-separated: nats-route://host:port,...")]
    port: Annotated[int, Parameter(validator=PortRange(), help="The client port.")] = DEFAULT_PORT
    cluster_port: Annotated[int, Parameter(validator=PortRange(), help="The route port this node listens on.")] = DEFAULT_CLUSTER_PORT
    cluster_name: Annotated[str, Parameter(help="The cluster's name, the same on every node.")] = CLUSTER_NAME
    host: Annotated[str, Parameter(help="The address the client, route and leaf-node listeners bind.")] = LISTEN_HOST


@Parameter(name="*")
@dataclass(frozen=True, kw_only=True)
class MonitoringFlags:
    """nats-server's monitoring endpoint (no auth of its own)."""

    http_port: Annotated[int | None, Parameter(validator=PortRange(), help="Serve nats-server's monitoring (/varz, /routez, /jsz) on this port.")] = None
    http_host: Annotated[str, Parameter(help="The address monitoring binds; it has no auth, so keep it loopback or firewalled.")] = LISTEN_HOST


@Parameter(name="*")
@dataclass(frozen=True, kw_only=True)
class NodeFolders:
    """The node's own folders (default under ``<root>/nodes/<node>/``)."""

    jetstream_dir: Annotated[Path | None, Parameter(help="The node's JetStream folder (default `<root>/nodes/<node>/jetstream`).")] = None
    resolver_dir: Annotated[Path | None, Parameter(help="The node's account-JWT folder (default `<root>/nodes/<node>/resolver`).")] = None


@broker_app.command
def config(
    *,
    node: NodeFlags,
    monitoring: MonitoringFlags = MonitoringFlags(),
    leafnodes: Annotated[int | None, Parameter(validator=PortRange(), help="A hub: listen for leaf-node links on this port (leafnodes { listen }).")] = None,
    folders: NodeFolders = NodeFolders(),
    auth_timeout: Annotated[float | None, Parameter(help="authorization { timeout } in seconds (default: nats-server's 2); pass every service the same --auth-timeout.")] = None,
    root: Annotated[str | None, Parameter(help="State folder (default $COTAL_ROOT, else ./.cotal).")] = None,
) -> None:
    """Print the nats-server config of one cluster node (redirect it to the node's .conf).

    The node trusts the root's operator and system account (resolver full, system account
    preloaded), keeps JetStream and account JWTs in its own folders, and joins the cluster
    through --cluster-routes (the same list on every node), authenticated by the root's route
    secret (the text holds it: keep the .conf 0600). --leafnodes adds a hub's
    leafnodes { listen } block for leaf nodes rendered by `cotal broker leaf-config`
    (docs/deploy.md "Leaf nodes").
    """
    paths = Where(root=root).paths()
    if not paths.broker_json.exists():
        raise ConfigError(
            f"{paths.broker_json} is missing - provision the root first: cotal space add NAME --root {paths.root}"
        )
    node_dir = paths.root / "nodes" / node.node
    routes = parse_routes(node.cluster_routes)
    rendered = Node(
        name=node.node, host=node.host, port=node.port,
        resolver_dir=(folders.resolver_dir or node_dir / "resolver").absolute(),
        jetstream_dir=(folders.jetstream_dir or node_dir / "jetstream").absolute(),
        cluster=Cluster(name=node.cluster_name, port=node.cluster_port, routes=routes, secret=route_secret(paths)),
        leafnode_port=leafnodes, http_port=monitoring.http_port, http_host=monitoring.http_host,
        header=f"# Generated by `cotal broker config --node {node.node}` from {paths.broker_json}; render it again rather than edit it.",
    )
    print(render_node(load_broker(paths.broker_json), rendered, auth_timeout_s=check_auth_timeout(auth_timeout)), end="")
    url = client_url(node.host, node.port)
    if url is not None:  # the root commands' and auth-service's default --server (issue 17 item 3)
        record_seed(paths, node.node, url)


@broker_app.command(name="leaf-config")
def leaf_config(
    *,
    node: Annotated[str, Parameter(help="The leaf's server_name, unique among the hub's nodes and leaves.")],
    hub: Annotated[str, Parameter(help="The hub's leaf-node URLs, comma-separated: nats-leaf://host:port (the hub's --leafnodes port).")],
    port: Annotated[int, Parameter(validator=PortRange(), help="The leaf's client port.")] = DEFAULT_PORT,
    host: Annotated[str, Parameter(help="The address the leaf's client listener binds.")] = LISTEN_HOST,
    space: Annotated[tuple[str, ...], Parameter(help="Link this space's data account (repeat it; default: every space of the root).")] = (),
    monitoring: MonitoringFlags = MonitoringFlags(),
    resolver_dir: Annotated[Path | None, Parameter(help="The leaf's account-JWT folder (default `<root>/nodes/<node>/resolver`).")] = None,
    creds_dir: Annotated[Path | None, Parameter(help="Where the links' creds files are written (default `<root>/nodes/<node>`); copy them with the .conf.")] = None,
    auth_timeout: Annotated[float | None, Parameter(help="authorization { timeout } in seconds (default: nats-server's 2); pass the leaf's replica the same --auth-timeout.")] = None,
    root: Annotated[str | None, Parameter(help="State folder (default $COTAL_ROOT, else ./.cotal).")] = None,
) -> None:
    """Print the nats-server config of a leaf node linked to the hub (redirect it to the leaf's .conf).

    The leaf trusts the root's operator (resolver full, fed through its link of the system
    account), has no JetStream, and links each space's data account to the hub. Connects
    through the leaf are decided on the leaf, so run a callout replica there:
    `cotal service run callout-replica --space S --server <hub> --callout-server <leaf>`.
    Writes the links' creds files (secrets: keep them and the .conf 0600).
    """
    paths = Where(root=root).paths()
    if not paths.broker_json.exists():
        raise ConfigError(
            f"{paths.broker_json} is missing - provision the root first: cotal space add NAME --root {paths.root}"
        )
    urls = parse_hub_urls(hub)
    broker = load_broker(paths.broker_json)
    node_dir = paths.root / "nodes" / node
    folder = (creds_dir or node_dir).absolute()
    spaces = _leaf_spaces(paths, space)
    rendered = Node(
        name=node, host=host, port=port, resolver_dir=(resolver_dir or node_dir / "resolver").absolute(),
        jetstream_dir=None, http_port=monitoring.http_port, http_host=monitoring.http_host,
        header=f"# Generated by `cotal broker leaf-config --node {node}` from {paths.broker_json}; render it again rather than edit it.",
        leaf_remotes=(
            LeafRemote(urls=urls, account=broker.system_account, credentials=folder / "system.creds"),
            *(LeafRemote(urls=urls, account=load_space(paths.space(s).callout_json, s).data_account,
                         credentials=folder / f"leaf-{s}.creds") for s in spaces),
        ),
    )  # fmt: skip
    text = render_node(broker, rendered, auth_timeout_s=check_auth_timeout(auth_timeout))  # refuses bad flags first
    ensure_dir(folder)
    atomic_create(folder / "system.creds", broker.system_user_creds.encode())
    for name in spaces:
        material = load_space(paths.space(name).callout_json, name)
        creds = provision.mint_service_user(material, name=f"cotal-leaf:{node}", permissions={}, iat=int(time.time()), exp=None)
        atomic_create(folder / f"leaf-{name}.creds", creds.encode())  # created once: a re-render keeps the link's user
    print(text, end="")


def _leaf_spaces(paths: RootPaths, asked: tuple[str, ...]) -> tuple[str, ...]:
    """The spaces a leaf links: those asked (each must be a space of the root), else every one."""
    known = [row["space"] for row in list_spaces(paths)]
    for name in asked:
        if name not in known:
            raise ConfigError(f"--space {name}: the root {paths.root} has no space {name} - add it first: cotal space add {name} --root {paths.root}")
    chosen = tuple(dict.fromkeys(asked)) or tuple(known)
    if not chosen:
        raise ConfigError(f"the root {paths.root} has no space to link - add one first: cotal space add NAME --root {paths.root}")
    return chosen


def client_url(host: str, port: int) -> str | None:
    """The URL a client dials for a node listening on ``host:port``, or None for a wildcard
    listener (``0.0.0.0``, ``::``), whose dialable address the root cannot know."""
    if host in ("", "0.0.0.0", "::", "[::]"):
        return None
    return f"nats://[{host}]:{port}" if ":" in host else f"nats://{host}:{port}"
