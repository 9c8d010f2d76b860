"""An in-memory auth bucket for tests that drive the issuance store without a broker.

:class:`FakeBucket` is a fake of our own port (:class:`~cotal_trio.stores.issuance.RowStore`), not
of nats: it keeps the JetStream KV rules the withdrawal relies on, so the tests can put a write
in flight and let the deadline cancel it.

* Writes (create, delete) land in the order they were sent, each ``latency_s[op]`` after it was
  sent and never before an earlier write: a stream stores one connection's publishes in order.
  A write whose caller was cancelled still lands (its publish had left).
* A create refuses a key with a live value (natsio's ``kv_create`` retries on top of a marker).
* Reads (get, keys) answer ``latency_s[op]`` after they were sent, with the writes landed by
  then: JetStream orders them with nothing.
* A message written with a TTL is gone ``ttl_s`` after it landed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import trio

from cotal_trio.natsio import KeyExists, KvEntry, WrongRevision


@dataclass(slots=True)
class _Message:
    seq: int
    value: bytes
    live: bool
    landed: float
    ttl_s: int | None


@dataclass(slots=True)
class _Write:
    land_t: float
    apply: Callable[[float], object]  # landing time -> result or exception
    result: object = None


@dataclass
class FakeBucket:
    """An in-memory ``cotal_auth_<space>`` behind one connection (see the module docstring).

    Attributes:
        latency_s: seconds per operation name (``create``, ``delete``, ``get``, ``keys``).
        fail: raised at once by every operation (a store that is down or missing).
        on_created: called when a create's acknowledgement reaches its (still waiting) caller.
        events: ``(landing time, op, key, outcome)`` per write, in landing order.
    """

    latency_s: dict[str, float] = field(default_factory=dict)
    fail: Exception | None = None
    on_created: Callable[[], None] | None = None
    events: list[tuple[float, str, str, str]] = field(default_factory=list)
    _messages: dict[str, _Message] = field(default_factory=dict)
    _pending: list[_Write] = field(default_factory=list)
    _seq: int = 0
    _last_land: float = 0.0

    # -- the port ----------------------------------------------------------------------------

    async def create(self, key: str, value: bytes, *, ttl_s: int) -> int:
        def apply(t: float) -> object:
            last = self._last(key, t)
            if last is not None and last.live:
                self.events.append((t, "create", key, "refused"))
                return KeyExists(key)
            self.events.append((t, "create", key, "stored"))
            return self._store(key, value, live=True, t=t, ttl_s=ttl_s)

        revision = await self._write("create", apply)
        if self.on_created is not None:
            self.on_created()
        return revision

    async def get(self, key: str) -> KvEntry | None:
        t = await self._read("get")
        last = self._last(key, t)
        return None if last is None or not last.live else KvEntry(key=key, value=last.value, revision=last.seq)

    async def delete(self, key: str, *, last_revision: int, ttl_s: int) -> int:
        def apply(t: float) -> object:
            last = self._last(key, t)
            if (0 if last is None else last.seq) != last_revision:
                self.events.append((t, "delete", key, f"refused at {last_revision}"))
                return WrongRevision(key, last_revision)
            self.events.append((t, "delete", key, f"marker at {last_revision}"))
            return self._store(key, b"", live=False, t=t, ttl_s=ttl_s)

        return await self._write("delete", apply)

    async def keys(self, prefix: str) -> list[str]:
        t = await self._read("keys")
        return sorted(k for k in list(self._messages) if k.startswith(prefix) and self._last(k, t) is not None)

    # -- what a test looks at ----------------------------------------------------------------

    def put(self, key: str, value: bytes, *, ttl_s: int | None = None) -> None:
        """Store a live value now, as another writer would."""
        self._store(key, value, live=True, t=trio.current_time(), ttl_s=ttl_s)

    def live(self) -> dict[str, bytes]:
        """The live values once every write sent so far has landed (no time passes)."""
        self._land(float("inf"))
        now = trio.current_time()
        return {k: m.value for k in list(self._messages) if (m := self._last(k, now)) is not None and m.live}

    def held(self) -> dict[str, bool]:
        """Every key holding a message (live or a marker) at the current time: key -> live."""
        now = trio.current_time()
        self._land(now)
        return {k: m.live for k in list(self._messages) if (m := self._last(k, now)) is not None}

    # -- the model ---------------------------------------------------------------------------

    def _store(self, key: str, value: bytes, *, live: bool, t: float, ttl_s: int | None) -> int:
        self._seq += 1
        self._messages[key] = _Message(self._seq, value, live, t, ttl_s)
        return self._seq

    def _last(self, key: str, t: float) -> _Message | None:
        message = self._messages.get(key)
        if message is not None and message.ttl_s is not None and t >= message.landed + message.ttl_s:
            del self._messages[key]  # the server removes a message whose TTL ended
            return None
        return message

    def _land(self, t: float) -> None:
        while self._pending and self._pending[0].land_t <= t:
            write = self._pending.pop(0)
            write.result = write.apply(write.land_t)

    async def _write(self, op: str, apply: Callable[[float], object]) -> int:
        if self.fail is not None:
            raise self.fail
        write = _Write(max(trio.current_time() + self.latency_s.get(op, 0.0), self._last_land), apply)
        self._last_land = write.land_t
        self._pending.append(write)
        await trio.sleep_until(write.land_t)  # cancelled, the publish had left: it lands all the same
        self._land(trio.current_time())
        if isinstance(write.result, Exception):
            raise write.result
        assert isinstance(write.result, int)
        return write.result

    async def _read(self, op: str) -> float:
        if self.fail is not None:
            raise self.fail
        await trio.sleep(self.latency_s.get(op, 0.0))
        self._land(trio.current_time())
        return trio.current_time()
