"""A stream at another replica count is not drifted (``StreamShape.drift``; issue 7 item 4, issue 17 item 1).

A lane creates its stores at the space's ``replicas`` and scales them up; a store may also keep
more copies than asked (never scaled down, or scaled by hand with `nats stream edit --replicas
3`). A lane must accept such a stream, and still refuse a stream whose other fields differ.
Verified on a 3-node nats-server cluster: before this rule a restarted lane failed with
"num_replicas is 3, not 1". The count itself is checked by ``check_replicas`` (1..5).
"""

from __future__ import annotations

import json

import pytest

from cotal_trio.natsio import check_replicas
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


@pytest.mark.parametrize("replicas", [1, 3, 5])
def test_a_replica_count_from_one_to_five_is_taken(replicas):
    assert check_replicas(replicas) == replicas


@pytest.mark.parametrize("replicas", [0, 6, -1, True, 3.0, "3", None])
def test_another_replica_count_is_a_value_error(replicas):
    with pytest.raises(ValueError, match=f"replicas must be a whole number from 1 to 5, got {replicas!r}"):
        check_replicas(replicas)
