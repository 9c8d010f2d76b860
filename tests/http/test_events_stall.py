"""A consumer that stops reading ``/events`` never holds the face's shutdown (issue 7 item 1:
"slow consumers are dropped"; http/serve.py ``TCP_USER_TIMEOUT``).

hypercorn shields its socket writes from cancellation, so a send to a peer whose receive window
stays shut cannot be cancelled; the face's connections carry ``TCP_USER_TIMEOUT``, which cuts
such a peer, so a cancelled face exits within about that timeout. No broker: the real loopback
app with an event bus, served by :func:`~cotal_trio.http.serve.serve_app`, and a real TCP peer.
"""

from __future__ import annotations

import socket

import trio
import trio_websocket

from cotal_trio.core.events import lane_event
from cotal_trio.http.loopback import build_loopback_app
from cotal_trio.http.serve import serve_app
from cotal_trio.lane.events import EventBus
from tests.support.loopback import CAP, _context

USER_TIMEOUT_S = 1.0


async def _stalled_face_exit_s(user_timeout_s: float, wait_s: float) -> float | None:
    """Seconds from cancelling a face with a stalled ``/events`` consumer to its exit, or None
    when it has not exited within ``wait_s``."""
    bus = EventBus(buffer=64)
    app = build_loopback_app(_context(), events=bus)
    exited, face_scope = trio.Event(), trio.CancelScope()

    async def face(task_status: trio.TaskStatus[int]) -> None:
        with face_scope:
            await serve_app(app, port=0, user_timeout_s=user_timeout_s, task_status=task_status)
        exited.set()

    async with trio.open_nursery() as nursery:
        port = await nursery.start(face)
        sock = trio.socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        await sock.connect(("127.0.0.1", port))
        async with trio.SocketStream(sock) as stream, trio.open_nursery() as client:
            headers = [(b"Authorization", f"Bearer {CAP}".encode())]
            await trio_websocket.wrap_client_stream(client, stream, f"127.0.0.1:{port}", "/events", extra_headers=headers)
            for i in range(3000):  # about 6 MB the consumer never reads: its window shuts
                bus.publish(lane_event("alpha", "retrying", f"{i:06d}" + "x" * 2000))
                if i % 50 == 0:
                    await trio.sleep(0.01)
            assert bus.statistics().dropped == 1  # the bus let it go at once ...
            start = trio.current_time()
            face_scope.cancel()  # ... and the face must still be able to stop
            with trio.move_on_after(wait_s):
                await exited.wait()
            took = trio.current_time() - start if exited.is_set() else None
            client.cancel_scope.cancel()
        nursery.cancel_scope.cancel()
    return took


async def test_a_cancelled_face_exits_although_an_events_consumer_stopped_reading():
    with trio.fail_after(30):
        took = await _stalled_face_exit_s(USER_TIMEOUT_S, wait_s=10)
    assert took is not None and took < USER_TIMEOUT_S + 3, took


async def test_without_the_user_timeout_the_stalled_consumer_would_hold_the_face():
    """The bug this guards against, shown: with a 60 s timeout the face is still running 3 s
    after its cancellation (hypercorn's shielded write to the stalled peer)."""
    with trio.fail_after(90):
        assert await _stalled_face_exit_s(60.0, wait_s=3) is None
