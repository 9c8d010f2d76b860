"""A lane's callout on a live broker: the connect that it refuses."""

from __future__ import annotations

import pytest

from cotal_trio.core.errors import Unavailable


def refused():
    """A refused connect: ``Unavailable`` from nats-py's 'Authorization Violation', raised
    through the client's ``open_loop`` nursery (so inside an exception group)."""
    return pytest.RaisesGroup(
        pytest.RaisesExc(Unavailable, match="Authorization Violation"), flatten_subgroups=True
    )
