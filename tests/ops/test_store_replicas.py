"""``cotal status``'s one-line summary of a space's stores (issue 17 item 1; ops/store_replicas.py)."""

from __future__ import annotations

from cotal_trio.ops.store_replicas import SpaceStores, summary
from cotal_trio.stores.replicas import StoreReplicas, space_stream_names


def store(stream: str, replicas: int, leader: str | None) -> StoreReplicas:
    return StoreReplicas(stream=stream, replicas=replicas, leader=leader, current=replicas - 1)


def test_one_count_and_one_leader():
    found = SpaceStores(space="a", wanted=3, stores=(store("KV_x", 3, "n2"), store("KV_y", 3, "n2")))
    assert summary(found) == "stores R3 (leader n2)"


def test_mixed_counts_leaders_and_stores_below_the_wanted_count():
    found = SpaceStores(space="a", wanted=3, stores=(store("KV_x", 1, "n1"), store("KV_y", 3, None), store("KV_z", 3, "n3")))
    assert summary(found) == "stores R1/R3 (leaders n1, n3, none), 1 below replicas 3"
    assert [s.stream for s in found.below] == ["KV_x"]


def test_no_wanted_count_finds_nothing_below():
    found = SpaceStores(space="a", wanted=None, stores=(store("KV_x", 1, "n1"),))
    assert found.below == [] and summary(found) == "stores R1 (leader n1)"


def test_none_yet_and_unread():
    assert summary(SpaceStores(space="a", wanted=1)) == "stores: none"
    assert summary(SpaceStores(space="a", wanted=1, error="no answer")) == "stores: unread (no answer)"


def test_a_space_has_twelve_streams_in_name_order():
    names = space_stream_names("alpha")
    assert names == (
        "COTAL_CHAT_alpha", "COTAL_DM_alpha", "COTAL_RUN_alpha", "COTAL_TASK_alpha", "KV_cotal_accepted_alpha",
        "KV_cotal_admission_alpha", "KV_cotal_auth_alpha", "KV_cotal_channels_alpha", "KV_cotal_issued_alpha",
        "KV_cotal_presence_alpha", "KV_cotal_records_alpha", "KV_cotal_sessions_alpha",
    )  # fmt: skip
