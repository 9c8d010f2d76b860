"""Issue 15 item 8: a face's graceful stop (``http/serve.py``, ``serve_app``'s shutdown trigger).

Once the trigger fires, the listener stops at once (a new connect is refused), a request already
in flight is answered in full, and ``serve_app`` returns after it. Real sockets on 127.0.0.1; a
route that waits on an event holds the request in flight.
"""

from __future__ import annotations

import trio
from quart_trio import QuartTrio

from cotal_trio.http.errors import install_edge
from cotal_trio.http.serve import serve_app

CEILING_S = 10


async def _get(port: int) -> bytes:
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    async with stream:
        await stream.send_all(b"GET /slow HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        answer = b""
        while chunk := await stream.receive_some():
            answer += chunk
    return answer


async def test_a_triggered_face_refuses_new_connects_and_answers_the_one_in_flight():
    entered, release, stop = trio.Event(), trio.Event(), trio.Event()

    async def slow() -> dict[str, object]:
        entered.set()
        await release.wait()
        return {"ok": True}

    app = QuartTrio("test")
    install_edge(app, routes={"/slow": {"GET": slow}}, unknown_path="unknown path")
    answers: list[bytes] = []
    returned = trio.Event()

    async def serve(task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
        await serve_app(app, shutdown_trigger=stop.wait, task_status=task_status)
        returned.set()

    with trio.fail_after(CEILING_S):
        async with trio.open_nursery() as nursery:
            port = await nursery.start(serve)
            nursery.start_soon(lambda: _collect(port, answers))
            await entered.wait()  # the request is in flight
            stop.set()
            refused = False
            while not refused:  # the listener stops within a scheduling step or two
                try:
                    await (await trio.open_tcp_stream("127.0.0.1", port)).aclose()
                    await trio.sleep(0.01)
                except OSError:
                    refused = True
            assert not returned.is_set()  # still answering the request in flight
            release.set()
    assert returned.is_set()
    assert answers[0].startswith(b"HTTP/1.1 200") and answers[0].endswith(b'{"ok":true}\n'), answers


async def _collect(port: int, answers: list[bytes]) -> None:
    answers.append(await _get(port))
