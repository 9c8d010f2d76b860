"""A full lane and a replica are two specs (lane/spec.py; issue 16; spec "Callout replicas"):
a replica has no field of a full lane's, and the host's lane factory makes one or the other."""

from __future__ import annotations

import pytest

from cotal_trio.core.errors import ConfigError
from cotal_trio.core.limits import DEFAULT_LIMITS, ConnectLimits
from cotal_trio.core.manifest import SpaceEntry
from cotal_trio.lane.spec import FullLane, LaneCommon, PublicFace, ReplicaLane
from cotal_trio.service.hosting import FullLanes, ReplicaLanes, lane_factory
from cotal_trio.state import RootPaths

COMMON = LaneCommon(server_url="nats://127.0.0.1:4222")


@pytest.mark.parametrize("field", [
    {"public": PublicFace(port=8443)}, {"service_endpoints": True}, {"connect_limits": ConnectLimits()},
    {"http_port": 8080}, {"idp_keys": dict}, {"holder": "h"}, {"tool_result_consent": True},
])
def test_a_replica_spec_cannot_carry_a_full_lanes_field(tmp_path, field):
    with pytest.raises(TypeError, match=next(iter(field))):
        ReplicaLane(space="a", paths=RootPaths(tmp_path).space("a"), common=COMMON, **field)


def test_the_factory_makes_full_lanes_with_the_entrys_fields(tmp_path):
    root = RootPaths(tmp_path)
    start = lane_factory(root=root, common=COMMON, lanes=FullLanes(http_ports={"a": 8080}, dev_idp_url="http://idp"))
    entry = SpaceEntry(space="a", service_endpoints=True, tool_result_consent=True, exchange_public_port=8443)
    spec = start(entry).args[0]
    assert isinstance(spec, FullLane)
    assert (spec.space, spec.paths, spec.common, spec.http_port, spec.dev_idp_url) == ("a", root.space("a"), COMMON, 8080, "http://idp")
    assert (spec.service_endpoints, spec.tool_result_consent, spec.public) == (True, True, PublicFace(port=8443))
    assert spec.holder is not None and start(entry).args[0].holder == spec.holder  # one holder across restarts
    assert start(SpaceEntry(space="b")).args[0].http_port == 0


def test_the_factory_makes_replicas_and_refuses_an_entry_naming_a_full_lanes_field(tmp_path):
    start = lane_factory(root=RootPaths(tmp_path), common=COMMON, lanes=ReplicaLanes())
    spec = start(SpaceEntry(space="a")).args[0]
    assert spec == ReplicaLane(space="a", paths=RootPaths(tmp_path).space("a"), common=COMMON)
    assert spec.connect_limits == DEFAULT_LIMITS
    with pytest.raises(ConfigError, match="^space a: a callout-only replica has no HTTP face - "):
        start(SpaceEntry(space="a", exchange_public_port=8443))
    with pytest.raises(ConfigError, match="^space a: a callout-only replica cannot open service endpoints - "):
        start(SpaceEntry(space="a", service_endpoints=True))
