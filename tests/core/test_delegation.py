"""The delegation envelope and pattern containment (reference/upstream-notes.md 1.3)."""

from __future__ import annotations

import dataclasses
import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cotal_trio.core.delegation import Grant, check_within_spawner_grant, pattern_contains
from cotal_trio.core.errors import RefusalCode, Refused
from cotal_trio.core.ledger import LedgerRow

from tests.support.ledger_rows import OTHER_OWNER, OWNER, lookup_of, managed, row

# --- delegation envelope ---------------------------------------------------------------------

ROOT = row(actor="root", scope=("spawn", "run", "role:worker"), allow_subscribe=("team.>",), allow_publish=("team.*",))
ADMIN = row(actor="boss", scope=("admin",), allow_subscribe=("ops",), allow_publish=())


def child(**overrides) -> LedgerRow:
    fields = {"actor": "kid", "parent": f"{OWNER}.root", "scope": ("spawn",),
              "allow_subscribe": ("team.a.b",), "allow_publish": ("team.x",)}  # fmt: skip
    return managed(**{**fields, **overrides})


def test_a_ledger_row_is_a_grant():
    # The walk reads rows through the Grant protocol (no import of ledger.py, issue 16): every
    # field it reads is a LedgerRow field or property of the same value.
    fields = sorted(name for name in vars(Grant) if not name.startswith("_"))
    assert fields == ["allow_publish", "allow_subscribe", "owner", "parent", "principal", "role", "scope"]
    assert {name: getattr(ROOT, name) for name in fields} == {
        "allow_publish": ("team.*",), "allow_subscribe": ("team.>",), "owner": OWNER, "parent": None,
        "principal": f"{OWNER}.root", "role": None, "scope": ("spawn", "run", "role:worker"),
    }  # fmt: skip


def test_envelope_accepts_contained_chains():
    assert check_within_spawner_grant(ROOT, lookup_of()) == ROOT  # parentless: its own root
    assert check_within_spawner_grant(child(), lookup_of(ROOT)) == ROOT
    assert check_within_spawner_grant(child(role="worker"), lookup_of(ROOT)) == ROOT
    middle = child(actor="mid", scope=("spawn", "run"), allow_subscribe=("team.*.>",))
    leaf = child(actor="leaf", parent=f"{OWNER}.mid", allow_subscribe=("team.q.*",), allow_publish=())
    assert check_within_spawner_grant(leaf, lookup_of(ROOT, middle)) == ROOT


def test_envelope_admin_spawner_is_an_authority_root():
    wide = child(parent=f"{OWNER}.boss", scope=("spawn", "supervise"), allow_subscribe=(">",), role="any")
    assert check_within_spawner_grant(wide, lookup_of(ADMIN)) == ADMIN
    middle = child(actor="mid", parent=f"{OWNER}.boss", scope=("spawn",), allow_subscribe=("team.>",))
    assert check_within_spawner_grant(child(parent=f"{OWNER}.mid"), lookup_of(ADMIN, middle)) == ADMIN


def test_envelope_admin_in_the_row_itself_does_not_count():
    escalated = child(scope=("spawn", "admin"))
    with pytest.raises(Refused, match="holds scope admin its spawner lacks"):
        check_within_spawner_grant(escalated, lookup_of(ROOT))


ENVELOPE_REFUSALS = [
    (child(scope=("spawn", "supervise")), (ROOT,), "holds scope supervise its spawner lacks"),
    (child(allow_subscribe=("team",)), (ROOT,), "allowSubscribe team is outside its spawner's"),
    (child(allow_subscribe=(">",)), (ROOT,), "allowSubscribe > is outside"),
    (child(allow_publish=("team.x.y",)), (ROOT,), "allowPublish team.x.y is outside"),
    (child(allow_publish=("team.>",)), (ROOT,), "allowPublish team.> is outside"),
    (child(role="admin"), (ROOT,), "has role admin but its spawner lacks scope role:admin"),
    (child(parent=f"{OTHER_OWNER}.root"), (dataclasses.replace(ROOT, owner=OTHER_OWNER),),
     "names a spawner of another owner"),
    (child(), (), f"spawner {OWNER}.root of {OWNER}.kid is no longer granted"),
    (child(parent=f"{OWNER}.kid"), (), "loops at"),
    (child(), (dataclasses.replace(ROOT, parent=f"{OWNER}.kid"),), "loops at"),
    (child(), (dataclasses.replace(ROOT, parent=f"{OWNER}.mid"),
               child(actor="mid", parent=f"{OWNER}.root", scope=("spawn", "run", "role:worker"),
                     allow_subscribe=("team.>",), allow_publish=("team.*",))), "loops at"),
    (child(actor="leaf", parent=f"{OWNER}.mid"),
     (ROOT, child(actor="mid", scope=("spawn", "supervise"))), "mid holds scope supervise"),
]  # fmt: skip


@pytest.mark.parametrize(("value", "known", "fragment"), ENVELOPE_REFUSALS)
def test_envelope_refusals(value, known, fragment):
    with pytest.raises(Refused) as info:
        check_within_spawner_grant(value, lookup_of(*known))
    assert info.value.code is RefusalCode.NOT_GRANTED
    assert fragment in info.value.detail
    assert " - " in info.value.detail


# --- pattern containment ---------------------------------------------------------------------

CONTAINS = [
    (">", "a", True),
    (">", "a.b.c", True),
    (">", ">", True),
    (">", "*.>", True),
    ("a.>", "a.b", True),
    ("a.>", "a.>", True),
    ("a.>", "a.*.>", True),
    ("a.>", "a", False),
    ("a.>", "b.c", False),
    ("a.>", ">", False),
    ("a.>", "*.b", False),
    ("*", "a", True),
    ("*", "*", True),
    ("*", ">", False),
    ("*", "a.b", False),
    ("a.*", "a.b", True),
    ("a.*", "a.*", True),
    ("a.*", "a.>", False),
    ("a.*", "a.b.c", False),
    ("a", "a", True),
    ("a", "*", False),
    ("a", "b", False),
    ("a", "a.b", False),
    ("a.b", "a", False),
    ("*.>", "a.b", True),
    ("*.>", "a", False),
    ("*.b", "a.b", True),
    ("*.b", "a.*", False),
]


@pytest.mark.parametrize(("outer", "inner", "expected"), CONTAINS)
def test_pattern_contains(outer, inner, expected):
    assert pattern_contains(outer, inner) is expected


def _matches(pattern: str, subject: tuple[str, ...]) -> bool:
    """NATS matching of one concrete subject, written independently of the code under test."""
    tokens = pattern.split(".")
    if tokens[-1] == ">":
        head = tokens[:-1]
        return len(subject) > len(head) and all(p in ("*", s) for p, s in zip(head, subject))
    return len(subject) == len(tokens) and all(p in ("*", s) for p, s in zip(tokens, subject))


# Literals in patterns come from {a, b}; "z" is never a literal, so it witnesses a "*" or ">".
_SUBJECTS = [s for n in range(1, 5) for s in itertools.product("abz", repeat=n)]
_patterns = st.lists(st.sampled_from(["a", "b", "*"]), min_size=1, max_size=3).flatmap(
    lambda head: st.sampled_from([".".join(head), ".".join([*head, ">"]), ".".join(head[:-1] + [">"])])
)


@given(_patterns, _patterns)
def test_pattern_contains_agrees_with_matching(outer, inner):
    brute = all(_matches(outer, s) for s in _SUBJECTS if _matches(inner, s))
    assert pattern_contains(outer, inner) is brute
