"""A callout responder on virtual time: a lane's ports faked in memory, and the requests and answers it sees."""

from __future__ import annotations

import logging

import trio
import trio.testing

from cotal_trio.core import natsjwt
from cotal_trio.core.admission import CalloutLimits
from cotal_trio.core.limits import ConnectLimiter
from cotal_trio.core.nkeys import KeyPair, Prefix
from cotal_trio.lane.callout.ports import AnswerPorts, ConnectPorts
from cotal_trio.lane.callout.responder import CALLOUT_SUBJECT, CalloutResponder
from cotal_trio.stores.issuance import RowExpiries
from cotal_trio.natsio import Message
from tests.support.callout_requests import KEYS, NOW, SERVER, SERVER_X, VERIFIER, _bearer, _claims, _row, _sealed
from tests.support.callout_log import parse_callout_line
from tests.support.kv_fakes import FakeBucket

CEILING_S = 10
LIMITS = CalloutLimits(auth_timeout_s=1.25, max_in_flight=1)


BEARER = _bearer()


def _user(cid: int) -> str:
    return KeyPair.from_raw(Prefix.USER, (100 + cid).to_bytes(32, "big")).public_key


def _message(cid: int, *, token: str | None = BEARER, reply: str | None = "", sealed: bool = True,
             broker_timeout_s: int = 2, issued_at: int | None = None) -> Message:
    """A ``$SYS.REQ.USER.AUTH`` request as the broker sends it; ``cid`` names it everywhere.

    The broker stamps ``iat`` with its clock at sending, truncated to the second: by default the
    test's wall clock now (``NOW`` plus the virtual time, or ``NOW`` outside trio).
    """
    if issued_at is None:
        try:
            issued_at = NOW + int(trio.current_time())
        except RuntimeError:  # built outside trio (a parameter list)
            issued_at = NOW
    claims = _claims(exp=issued_at + broker_timeout_s)
    claims["nats"]["user_nkey"] = _user(cid)
    claims["nats"]["client_info"]["id"] = cid
    claims["nats"]["connect_opts"] = {"name": "ibx0123456789", **({"auth_token": token} if token else {})}
    payload, headers = _sealed(claims, iat=issued_at)
    return Message(CALLOUT_SUBJECT, f"_INBOX.r.{cid}" if reply == "" else reply, payload,
                   headers if sealed else None)


def _answer(payload: bytes) -> dict:
    """The broker's view of a response: unsealed with its xkey, signature checked."""
    claims = natsjwt.verify(SERVER_X.open(payload, KEYS.xkey.public_key))
    assert (claims["iss"], claims["aud"]) == (KEYS.auth_signer.public_key, SERVER.public_key)
    return claims


class Lane:
    """A responder on fake ports: the wall clock is ``NOW + trio.current_time()`` (STYLE 14).

    Args:
        clock: the test's ``autojump_clock``.
        ledger_s: virtual seconds each ledger read blocks for; a list gives one per read.
        connect_limits: the responder's connect limits (default: its own, at the spec's).
        store: the auth bucket issuance rows go to (default: an instant :class:`FakeBucket`).
        stuck_s: virtual seconds each first ledger read awaits, deaf to cancellation (a shielded
            wait, as for a bridged call that must settle): other tasks run meanwhile.
        recall: the rows the responder's ``recall_ledger`` remembers for every principal (None:
            no recall port, every mint reads the ledger first).
        waits: per first ledger read, in order, ``(seconds, shielded)``: the read awaits that
            long, deaf to cancellation when shielded (overrides ``stuck_s`` while it lasts).
        row_expiries: where the responder notes each row's expiry (None: nowhere).
    """

    def __init__(
        self, clock: trio.testing.MockClock, *, ledger_s: float | list[float] = 0.0,
        connect_limits: ConnectLimiter | None = None, store: FakeBucket | None = None,
        stuck_s: float = 0.0, recall: tuple | None = None, waits: list[tuple[float, bool]] | None = None,
        row_expiries: RowExpiries | None = None,
    ) -> None:
        self.clock, self.ledger_s, self.stuck_s, self.waits = clock, ledger_s, stuck_s, list(waits or [])
        self.store = FakeBucket() if store is None else store
        self.store.on_created = self._expect_recheck
        self.rechecks: list[float] = []  # times of the re-check reads after an issuance row
        self.recheck_rows = lambda: (_row(), None)  # what the re-check reads (a test may revoke)
        self._recheck_due = False
        self.published: list[tuple[str, bytes, float]] = []
        self.ledger_reads: list[tuple[float, object]] = []  # (time, statistics()) at each read
        self.wall_reads = 0
        self._changed = trio.Event()
        self.responder = CalloutResponder(
            AnswerPorts(keys=KEYS, limits=LIMITS, clock=self._wall, publish=self._publish),
            ConnectPorts(
                verifier=VERIFIER, read_ledger=self._read_ledger, connect_limits=connect_limits, store=self.store,
                recall_ledger=None if recall is None else (lambda owner, actor: recall), row_expiries=row_expiries,
            ),
        )

    def _wall(self) -> float:
        self.wall_reads += 1
        return NOW + trio.current_time()

    def _publish(self, reply: str, payload: bytes) -> None:
        self.published.append((reply, payload, trio.current_time()))
        self._changed.set()
        self._changed = trio.Event()

    def _expect_recheck(self) -> None:
        self._recheck_due = True  # max_in_flight is 1: the next read is this request's re-check

    async def _read_ledger(self, owner: str, actor: str):
        if self._recheck_due:
            self._recheck_due = False
            self.rechecks.append(trio.current_time())
            return self.recheck_rows()
        self.ledger_reads.append((trio.current_time(), self.responder.statistics()))
        seconds = self.ledger_s.pop(0) if isinstance(self.ledger_s, list) else self.ledger_s
        self.clock.jump(seconds)  # a blocking stat: the thread is held and trio's clock moves on
        wait_s, shielded = self.waits.pop(0) if self.waits else (self.stuck_s, True)
        if wait_s:
            with trio.CancelScope(shield=shielded):
                await trio.sleep(wait_s)
        return (_row(), None)

    async def wait_published(self, n: int) -> None:
        while len(self.published) < n:
            await self._changed.wait()

    def answers(self) -> list[tuple[str, str, float]]:
        """``(reply, "jwt" or the denial reason, time)`` per publish, in publish order."""
        return [(reply, _answer(p)["nats"].get("error", "jwt"), at) for reply, p, at in self.published]


def _lines(caplog) -> list[dict]:
    """The parsed ``auth callout:`` outcome lines, checking each record's logging level."""
    lines = []
    for record in caplog.records:
        text = record.getMessage()
        if record.name == "cotal.callout" and text.startswith("auth callout: level=") and "outcome=dropped" not in text:
            fields = parse_callout_line(text)
            assert record.levelno == (logging.WARNING if fields["level"] == "warn" else logging.INFO), text
            lines.append(fields)
    return lines
