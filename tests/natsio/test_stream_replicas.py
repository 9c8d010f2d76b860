"""A stream the operator scaled is not drifted (``StreamShape.drift``; docs/deploy.md, issue 7 item 4).

Our stores are created R1; on a cluster the operator scales them to R3 (`nats stream edit
--replicas 3`). A lane restarted afterwards must accept the scaled stream, and still refuse a
stream whose other fields differ. Verified on a 3-node nats-server cluster: before this rule a
restarted lane failed with "num_replicas is 3, not 1".
"""

from __future__ import annotations

import json

import pytest

from cotal_trio.stores.issued import issued_shapes
from cotal_trio.stores.streams import admission_shape


@pytest.mark.parametrize("replicas", [1, 3, 5])
def test_any_replica_count_matches(replicas):
    for shape in (*issued_shapes("alpha"), admission_shape("alpha")):
        assert shape.drift({**shape.config(), "num_replicas": replicas}) == ()


def test_other_drift_is_still_refused_on_a_scaled_stream():
    issued, _ = issued_shapes("alpha")
    scaled = {**issued.config(), "num_replicas": 3, "deny_delete": False}
    assert issued.drift(scaled) == ("deny_delete is false, not true",)


@pytest.mark.parametrize("replicas", [0, None, "3"])
def test_a_missing_or_odd_replica_count_is_drift(replicas):
    issued, _ = issued_shapes("alpha")
    assert issued.drift({**issued.config(), "num_replicas": replicas}) == (f"num_replicas is {json.dumps(replicas)}, not 1",)
