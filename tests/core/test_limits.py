"""Connect limits (cotal_trio/core/limits.py; spec "Connect limits"): tables and properties.

Time is plain numbers (seconds). The spec's defaults are used wherever a boundary is named in
the spec (the 61st connect in a minute, the 601st across an owner's actors); smaller limits
make the refill arithmetic visible (2 a minute: one connect every 30 s).
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cotal_trio.core.errors import ConfigError, RateLimited, RefusalCode, Refused
from cotal_trio.core.limits import (
    DEFAULT_LIMITS,
    BucketTable,
    ConnectLimiter,
    ConnectLimits,
    Limit,
    Limited,
)
from tests.support.callout_requests import OWNER

OTHER = "u_" + "b" * 26
HOST = "198.51.100.7"


def _drain(limiter: ConnectLimiter, n: int, *, owner: str = OWNER, actor: str = "cli", at: float = 0.0) -> list:
    return [limiter.charge_principal(owner, actor, at) for _ in range(n)]


# --- configuration ----------------------------------------------------------------------------


def test_the_defaults_are_the_specs():
    assert (DEFAULT_LIMITS.actor_per_minute, DEFAULT_LIMITS.owner_per_minute, DEFAULT_LIMITS.host_per_minute) == (60, 600, 60)
    assert DEFAULT_LIMITS == ConnectLimits() and DEFAULT_LIMITS.max_buckets > 0


@pytest.mark.parametrize(
    "bad",
    [{"actor_per_minute": 0}, {"owner_per_minute": -1}, {"host_per_minute": 1.5}, {"max_buckets": True}],
    ids=["zero", "negative", "float", "bool"],
)
def test_limits_must_be_positive_whole_numbers(bad):
    [(name, value)] = bad.items()
    with pytest.raises(ConfigError, match=f"connect limits: {name} must be a positive whole number, got {value!r}"):
        ConnectLimits(**bad)


# --- the actor bucket: exact boundaries -------------------------------------------------------


def test_the_61st_connect_in_a_minute_is_refused():
    limiter = ConnectLimiter()
    assert _drain(limiter, 60) == [None] * 60
    limited = limiter.charge_principal(OWNER, "cli", 0.0)
    assert limited == Limited(limit=Limit.ACTOR, retry_after_s=1, per_minute=60, owner=OWNER, actor="cli")
    assert limited.reason() == (
        f"RATE_LIMITED retry-after 1s actor=cli owner={OWNER} limit=actor: this actor connected more than"
        " 60 times a minute - stop its reconnect loop and retry after 1s"
    )
    assert limiter.level(Limit.ACTOR, f"{OWNER}.cli", 0.0) == 0.0
    assert limiter.level(Limit.OWNER, OWNER, 0.0) == 540.0


def test_one_connect_refills_every_second_at_the_default():
    limiter = ConnectLimiter()
    _drain(limiter, 60)
    assert limiter.charge_principal(OWNER, "cli", 0.999) is not None
    assert limiter.charge_principal(OWNER, "cli", 1.0) is None
    assert limiter.charge_principal(OWNER, "cli", 1.0) is not None
    assert limiter.level(Limit.ACTOR, f"{OWNER}.cli", 31.0) == 30.0
    assert limiter.level(Limit.ACTOR, f"{OWNER}.cli", 10_000.0) == 60.0  # never above capacity


@pytest.mark.parametrize(
    ("at", "retry_after_s"),
    [(0.0, 30), (10.0, 20), (28.5, 2), (29.0, 1), (29.5, 1), (29.999, 1)],
)
def test_retry_after_is_the_whole_seconds_until_a_connect_is_back(at, retry_after_s):
    """2 a minute: a connect every 30 s; drained at 0, the next one is back at 30."""
    limiter = ConnectLimiter(ConnectLimits(actor_per_minute=2))
    assert _drain(limiter, 2) == [None, None]
    limited = limiter.charge_principal(OWNER, "cli", at)
    assert limited is not None and limited.retry_after_s == retry_after_s
    assert limited.reason().startswith(f"RATE_LIMITED retry-after {retry_after_s}s actor=cli owner={OWNER} ")
    assert limiter.charge_principal(OWNER, "cli", 30.0) is None


def test_a_clock_that_steps_back_refills_nothing_and_takes_nothing_back():
    limiter = ConnectLimiter(ConnectLimits(actor_per_minute=2))
    _drain(limiter, 1, at=100.0)
    assert limiter.level(Limit.ACTOR, f"{OWNER}.cli", 50.0) == 1.0
    assert limiter.charge_principal(OWNER, "cli", 50.0) is None
    assert limiter.charge_principal(OWNER, "cli", 50.0).retry_after_s == 30  # counted from 100 s
    assert limiter.charge_principal(OWNER, "cli", 130.0) is None


# --- the owner bucket, and all or nothing -----------------------------------------------------


def test_the_601st_connect_across_an_owners_actors_is_refused_and_names_the_owner():
    limiter = ConnectLimiter()
    for n in range(10):
        assert _drain(limiter, 60, actor=f"a{n}") == [None] * 60
    limited = limiter.charge_principal(OWNER, "fresh", 0.0)
    assert (limited.limit, limited.retry_after_s, limited.per_minute) == (Limit.OWNER, 1, 600)  # 0.1 s, rounded up
    assert limited.reason() == (
        f"RATE_LIMITED retry-after 1s actor=fresh owner={OWNER} limit=owner: this owner's actors connected"
        " more than 600 times a minute - stop their reconnect loops and retry after 1s"
    )
    assert limiter.level(Limit.ACTOR, f"{OWNER}.fresh", 0.0) == 60.0  # spent nothing
    assert limiter.charge_principal(OTHER, "fresh", 0.0) is None  # another owner is not affected
    assert limiter.charge_principal(OWNER, "fresh", 0.1) is None  # 600 a minute: one each 0.1 s


def test_a_connect_refused_by_its_actor_leaves_its_owner_untouched():
    limiter = ConnectLimiter()
    _drain(limiter, 60)
    assert limiter.charge_principal(OWNER, "cli", 0.0).limit is Limit.ACTOR
    assert limiter.level(Limit.OWNER, OWNER, 0.0) == 540.0
    assert limiter.statistics().denied == {"actor": 1, "owner": 0, "host": 0}


@pytest.mark.parametrize(
    ("actor_per_minute", "owner_per_minute", "limit", "retry_after_s"),
    [(6, 6, Limit.OWNER, 10), (6, 12, Limit.ACTOR, 10), (2, 6, Limit.ACTOR, 30), (6, 3, Limit.OWNER, 20)],
    ids=["tie: the owner", "actor only", "actor waits longer", "owner waits longer"],
)
def test_when_both_run_out_the_longer_wait_is_named(actor_per_minute, owner_per_minute, limit, retry_after_s):
    limits = ConnectLimits(actor_per_minute=actor_per_minute, owner_per_minute=owner_per_minute)
    limiter = ConnectLimiter(limits)
    _drain(limiter, min(actor_per_minute, owner_per_minute))
    limited = limiter.charge_principal(OWNER, "cli", 0.0)
    assert (limited.limit, limited.retry_after_s) == (limit, retry_after_s)


# --- the host bucket ----------------------------------------------------------------------------


def test_the_61st_unverified_connect_from_a_host_is_refused_and_no_actor_is_charged():
    limiter = ConnectLimiter()
    assert [limiter.charge_host(HOST, 0.0) for _ in range(60)] == [None] * 60
    limited = limiter.charge_host(HOST, 0.0)
    assert limited.reason() == (
        f"RATE_LIMITED retry-after 1s host={HOST} limit=host: more than 60 connects a minute from this host"
        " with a bearer that does not verify - exchange a fresh bearer from this space's auth service and"
        " retry after 1s"
    )
    assert limiter.charge_host("198.51.100.8", 0.0) is None
    assert limiter.statistics().buckets == {"actor": 0, "owner": 0, "host": 2}


# --- peeking (the exchange) ---------------------------------------------------------------------


def test_a_peek_spends_and_counts_nothing_and_answers_as_a_charge_would():
    limiter = ConnectLimiter()
    assert limiter.peek_principal(OWNER, "cli", 0.0) is None
    assert limiter.statistics().buckets == {"actor": 0, "owner": 0, "host": 0}
    _drain(limiter, 60)
    peeked = limiter.peek_principal(OWNER, "cli", 0.5)
    assert peeked == limiter.charge_principal(OWNER, "cli", 0.5)
    assert [limiter.peek_principal(OWNER, "cli", 0.5) for _ in range(5)] == [peeked] * 5
    assert limiter.statistics().denied == {"actor": 1, "owner": 0, "host": 0}
    assert limiter.level(Limit.ACTOR, f"{OWNER}.cli", 0.5) == 0.5


# --- the typed refusal --------------------------------------------------------------------------


def test_the_error_carries_the_429_body_and_the_callout_reason():
    error = Limited(limit=Limit.OWNER, retry_after_s=7, per_minute=600, owner=OWNER, actor="cli").error()
    assert isinstance(error, RateLimited) and isinstance(error, Refused) and error.code is RefusalCode.RATE_LIMITED
    assert error.reason().startswith(f"RATE_LIMITED retry-after 7s actor=cli owner={OWNER} limit=owner: ")
    assert error.body() == {
        "code": "RATE_LIMITED", "retryAfterSeconds": 7, "limit": "owner",
        "error": f'the actors of owner {OWNER} connected more than 600 times in the last minute, actor "cli"'
                 " included - stop their reconnect loops and retry after 7s",
    }  # fmt: skip
    assert (error.owner, error.actor, error.retry_after_s) == (OWNER, "cli", 7)


# --- bounded tables -----------------------------------------------------------------------------


def test_a_full_table_refuses_a_new_key_until_its_oldest_bucket_has_refilled():
    """Two buckets at most: a and b spent once each; c waits for a (59 of 60) to be full again."""
    table = BucketTable(per_minute=60, max_buckets=2)
    table.spend("a", 0.0)
    table.spend("b", 0.5)
    assert table.wait_s("c", 0.0) == (1.0, True)
    assert table.wait_s("c", 1.0) == (0.0, False)
    table.spend("c", 1.0)
    assert ("a" in table, "b" in table, "c" in table, len(table)) == (False, True, True, 2)


def test_a_drained_bucket_is_never_evicted_and_handed_a_fresh_allowance():
    limiter = ConnectLimiter(ConnectLimits(max_buckets=1))
    _drain(limiter, 60, actor="a")
    limited = limiter.charge_principal(OWNER, "b", 1.0)
    assert (limited.limit, limited.table_full, limited.retry_after_s) == (Limit.ACTOR, True, 59)
    assert limited.reason() == (
        f"RATE_LIMITED retry-after 59s actor=b owner={OWNER} limit=actor: every actor bucket this auth"
        " service keeps was spent within the last minute - retry after 59s"
    )
    assert limiter.charge_principal(OWNER, "a", 1.0) is None  # a kept its level: one refilled
    assert limiter.charge_principal(OWNER, "a", 1.0) is not None
    assert limiter.charge_principal(OWNER, "b", 60.0).retry_after_s == 1  # a was spent again at 1 s
    assert limiter.charge_principal(OWNER, "b", 61.0) is None  # a is full: forgetting it loses nothing


def test_only_the_least_recently_spent_bucket_is_looked_at():
    """The documented price of O(1): b (spent once, refilled at 1.5 s) is not evicted while a,
    drained earlier, still refills; c waits for a."""
    table = BucketTable(per_minute=60, max_buckets=2)
    for _ in range(60):
        table.spend("a", 0.0)
    table.spend("b", 0.5)
    assert table.level("b", 2.0) == 60.0
    assert table.wait_s("c", 2.0) == (58.0, True)


# --- properties ---------------------------------------------------------------------------------

OWNERS = (OWNER, OTHER)
ACTORS = ("a", "b", "c")
HOSTS = ("h1", "h2", "h3")
DTS = (0.0, 0.0, 0.25, 1.0, 7.5, 30.0, 61.0)

limits_st = st.builds(
    ConnectLimits,
    actor_per_minute=st.integers(1, 4), owner_per_minute=st.integers(1, 6),
    host_per_minute=st.integers(1, 3), max_buckets=st.integers(1, 3),
)  # fmt: skip
ops_st = st.lists(
    st.tuples(st.sampled_from(("principal", "host", "peek")), st.integers(0, 5), st.sampled_from(DTS)),
    max_size=60,
)


def _keys() -> list[tuple[Limit, str]]:
    return (
        [(Limit.ACTOR, f"{o}.{a}") for o in OWNERS for a in ACTORS]
        + [(Limit.OWNER, o) for o in OWNERS]
        + [(Limit.HOST, h) for h in HOSTS]
    )


def _levels(limiter: ConnectLimiter, now: float) -> dict:
    return {(limit, key): limiter.level(limit, key, now) for limit, key in _keys()}


def _apply(limiter: ConnectLimiter, kind: str, n: int, now: float) -> Limited | None:
    owner, actor = OWNERS[n % 2], ACTORS[n % 3]
    if kind == "host":
        return limiter.charge_host(HOSTS[n % 3], now)
    if kind == "peek":
        return limiter.peek_principal(owner, actor, now)
    return limiter.charge_principal(owner, actor, now)


def _run(limits, ops):
    """Yield ``(limiter, op, now, before, answer, after)`` for each op in order."""
    limiter, now = ConnectLimiter(limits), 0.0
    for kind, n, dt in ops:
        now += dt
        before = _levels(limiter, now)
        answer = _apply(limiter, kind, n, now)
        yield limiter, (kind, n), now, before, answer, _levels(limiter, now)


@settings(max_examples=300)
@given(limits_st, ops_st)
def test_tokens_stay_between_zero_and_capacity_and_tables_stay_bounded(limits, ops):
    for limiter, _, now, _, _, after in _run(limits, ops):
        for (limit, _key), level in after.items():
            assert 0.0 <= level <= limits.per_minute(limit)
        assert all(n <= limits.max_buckets for n in limiter.statistics().buckets.values())


@settings(max_examples=300)
@given(limits_st, ops_st)
def test_refusals_and_peeks_spend_nothing_and_a_charge_takes_one_from_each_bucket_or_none(limits, ops):
    for _, (kind, n), _, before, answer, after in _run(limits, ops):
        changed = {key: before[key] - after[key] for key in before if after[key] != before[key]}
        if answer is not None or kind == "peek":
            assert changed == {}
            continue
        drawn = {(Limit.HOST, HOSTS[n % 3])} if kind == "host" else {
            (Limit.ACTOR, f"{OWNERS[n % 2]}.{ACTORS[n % 3]}"), (Limit.OWNER, OWNERS[n % 2])
        }  # fmt: skip
        assert set(changed) == drawn
        assert all(spent == pytest.approx(1.0) for spent in changed.values())


@settings(max_examples=300)
@given(limits_st, ops_st)
def test_eviction_never_resets_a_drained_bucket(limits, ops):
    """A bounded limiter holds exactly what an unbounded one holds after the same admitted
    connects: evicting only full buckets never hands back allowance; it only refuses more."""
    unbounded = ConnectLimiter(ConnectLimits(
        actor_per_minute=limits.actor_per_minute, owner_per_minute=limits.owner_per_minute,
        host_per_minute=limits.host_per_minute, max_buckets=1000,
    ))  # fmt: skip
    for _, (kind, n), now, _, answer, after in _run(limits, ops):
        if kind == "peek":
            continue
        if answer is None:  # admitted: the unbounded limiter admits the same connect
            assert _apply(unbounded, kind, n, now) is None
        elif kind == "principal" and not answer.table_full:
            assert _apply(unbounded, "peek", n, now) is not None
        assert _levels(unbounded, now) == pytest.approx(after)


def test_the_buckets_know_no_bearer():
    """Issue 16: core/limits.py is the buckets only; the connect check (bearer + buckets) is
    core/callout.py's ``check_connect``, so limits imports neither the bearer nor the callout."""
    import ast
    import inspect

    from cotal_trio.core import limits

    tree = ast.parse(inspect.getsource(limits))
    imported = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.level == 1}
    assert imported == {"errors", "identity", "jose", "natsjwt"}
    assert not hasattr(limits, "check_connect") and "check_connect" not in limits.__all__
