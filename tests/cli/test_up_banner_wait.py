"""``cotal up``'s start banner waits for every lane's first start, but not for ever.

A lane whose start hangs (a broker that accepts and never answers holds a connect up to its
caps, again and again) must not hold the banner, the operator's sign that ``cotal up`` is up:
after ``BANNER_WAIT_S`` the banner comes with that lane named as still starting, never counted
as serving. Trio's autojump clock stands in for the wait; the host is a stand-in whose first
start never ends (the live banner is tests/cli/test_up_banner_live.py).
"""

from __future__ import annotations

import dataclasses
import trio
import trio.testing

from cotal_trio.cli import up
from cotal_trio.core.manifest import LaneStatus


class _Host:
    """A host whose lanes never end their first start (first_outcomes never returns)."""

    retry_s = 5.0

    def __init__(self, states: dict[str, LaneStatus]) -> None:
        self._states = states

    async def first_outcomes(self) -> dict[str, LaneStatus]:
        await trio.sleep_forever()
        raise AssertionError("unreachable")  # pragma: no cover

    def current_states(self) -> dict[str, LaneStatus]:
        return dict(self._states)


@dataclasses.dataclass
class _Info:
    host: _Host | None


def test_a_lane_still_starting_past_the_wait_is_named_as_starting():
    states = {"alpha": LaneStatus(state="serving"), "beta": LaneStatus(state="starting"),
              "gamma": LaneStatus(state="retrying", reason="gamma's issuer.json is missing")}  # fmt: skip
    info = _Info(host=_Host(states))

    async def main() -> tuple[dict[str, LaneStatus], float]:
        start = trio.current_time()
        got = await up._first_states(info)
        return got, trio.current_time() - start

    got, waited = trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    assert waited == up.BANNER_WAIT_S
    assert got == states
    assert up._retrying(info, got) == [
        "  space beta is still starting (its state: <root>/spaces.json.applied, cotal status)",
        "  retrying space gamma every 5 s: gamma's issuer.json is missing",
    ]


def test_without_a_host_the_banner_names_nothing():
    assert trio.run(up._first_states, _Info(host=None)) == {}
