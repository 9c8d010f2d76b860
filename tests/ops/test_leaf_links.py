"""Which leaf-node links bypass the callout, from the broker's LEAFZ and VARZ replies (issue 17 item 5).

The replies are the shapes nats-server 2.15.1 sent in the runs of docs/deploy.md "Leaf nodes"
(cut to the fields read): a hub ``hub`` with a leaf ``leaf1`` of the supported shape (its links
of the system account and the data account; it answers VARZ trusting the root's operator) and a
plain leaf ``bypass1`` (a data-account link, not on the system account, so it answers nothing).
``tests/service/test_leaf_live.py`` reads them from real servers.
"""

from __future__ import annotations

from cotal_trio.ops.leaf_links import LeafLink, callout_members, classify

OPERATOR, SYSTEM, DATA = "OD5TXETY", "ABIFVJQE", "ABVNH7AS"


def leafz(server: str, *leafs: tuple[str, str, bool]) -> dict:
    return {"server": {"name": server}, "data": {"leafs": [
        {"name": name, "account": account, "is_spoke": spoke} for name, account, spoke in leafs
    ]}}  # fmt: skip


def varz(server: str, operator: str = OPERATOR, system: str = SYSTEM, host: str = "127.0.0.1", port: int = 4225) -> dict:
    return {"server": {"name": server}, "data": {
        "server_name": server, "system_account": system, "trusted_operators_claim": [{"sub": operator}],
        "host": host, "port": port,
    }}  # fmt: skip


def test_a_leaf_trusting_the_root_is_decided_and_a_plain_one_is_not():
    replies = [
        leafz("hub", ("leaf1", SYSTEM, False), ("leaf1", DATA, False), ("bypass1", DATA, False)),
        leafz("leaf1", ("hub", DATA, True), ("hub", SYSTEM, True)),  # the leaf's own view: not a link it accepted
    ]
    assert classify(replies, [varz("hub"), varz("leaf1")], operator=OPERATOR, system_account=SYSTEM) == [
        LeafLink(hub="hub", leaf="leaf1", account=SYSTEM, decided=True, url="nats://127.0.0.1:4225"),
        LeafLink(hub="hub", leaf="leaf1", account=DATA, decided=True, url="nats://127.0.0.1:4225"),
        LeafLink(hub="hub", leaf="bypass1", account=DATA, decided=False),
    ]


def test_a_leaf_of_another_operator_or_system_account_is_not_decided():
    replies = [leafz("hub", ("other", DATA, False))]
    for answer in (varz("other", operator="OTHEROP"), varz("other", system="OTHERSYS")):
        assert [link.decided for link in classify(replies, [answer], operator=OPERATOR, system_account=SYSTEM)] == [False]


def test_no_leaf_and_replies_of_another_shape_give_no_link():
    odd = [{"server": "x"}, {"data": []}, {"server": {"name": "hub"}, "data": {"leafs": ["x", None]}}]
    assert classify([leafz("hub"), *odd], [{"data": "x"}], operator=OPERATOR, system_account=SYSTEM) == []


def test_a_wildcard_listener_gives_no_url():
    replies = [leafz("hub", ("leaf1", DATA, False))]
    links = classify(replies, [varz("leaf1", host="0.0.0.0")], operator=OPERATOR, system_account=SYSTEM)
    assert [(link.decided, link.url) for link in links] == [(True, None)]


def test_callout_members_count_each_servers_callout_subscriptions():
    """SUBSZ replies for one auth account with ``test: $SYS.REQ.USER.AUTH``: n1 has the full
    service's subscription, leaf1 none (its replica is down), and one reply of another shape."""
    def subsz(server: str, *subjects: str) -> dict:
        return {"server": {"name": server}, "data": {"subscriptions_list": [
            {"subject": s, "qgroup": "cotal-auth-callout"} for s in subjects
        ]}}  # fmt: skip

    replies = [subsz("n1", "$SYS.REQ.USER.AUTH"), subsz("leaf1"), subsz("n2", "other"), {"server": {"name": "x"}}]
    assert callout_members(replies) == {"n1": 1, "leaf1": 0, "n2": 0}
