"""A log line of the service is one line, whatever a client put in it.

The exchange's refusals name the body's unknown keys, the callout line a client's names: text a
client chose. A newline in it would let a client write a line of its own into the operator's
log (a forged ``outcome=minted``). So what a message holds that is not printable is written as
its escape; a traceback, which the formatter adds after the message, keeps its lines.
"""

from __future__ import annotations

import io
import json
import logging

import pytest

from cotal_trio.broker.process import free_port
from cotal_trio.cli import configure_logging
from cotal_trio.http.face_routes import LOGGER as FACE_LOGGER
from tests.support.stack import _post
from tests.support.up_process import _space_dir, _start, _stop, _wait_ready


def _line(message: str, *args: object, exc_info: object = None) -> str:
    stream = io.StringIO()
    configure_logging()
    handler = logging.getLogger("cotal").handlers[0]
    handler.setStream(stream)
    FACE_LOGGER.warning(message, *args, exc_info=exc_info)
    return stream.getvalue()


def test_a_newline_a_client_sent_stays_inside_its_line():
    out = _line("auth-service: refused an exchange: an agent exchange does not take %s", "x\nlevel=info outcome=minted")
    assert out == "auth-service: refused an exchange: an agent exchange does not take x\\nlevel=info outcome=minted\n"


def test_a_lone_surrogate_and_other_unprintable_characters_are_escaped():
    out = _line("does not take %s", "i\ud808\x1b[2J\t\u2028")
    assert out == "does not take i\\ud808\\x1b[2J\\t\\u2028\n"
    assert out.encode("utf-8")  # a UTF-8 log file takes it


def test_printable_text_is_written_as_it_is():
    assert _line("space=a owner=%s", "Zoë 山田 🙂") == "space=a owner=Zoë 山田 🙂\n"


def test_a_traceback_keeps_its_lines():
    try:
        raise ValueError("boom")
    except ValueError as exc:
        out = _line("auth callout: space=%s failed on one request", "a\nb", exc_info=exc)
    first, *rest = out.splitlines()
    assert first == "auth callout: space=a\\nb failed on one request"
    assert rest[0] == "Traceback (most recent call last):" and rest[-1] == "ValueError: boom"


@pytest.mark.broker
def test_a_client_cannot_write_a_line_into_a_running_services_log(tmp_path):
    """`cotal up` on a real nats-server: an exchange body with a newline in a key is refused,
    and its refusal is one line of the service's stderr, the newline as ``\\n``."""
    root = tmp_path / "root"
    proc = _start(root, "--port", str(free_port()), "--http-port", str(free_port()))
    try:
        _wait_ready(proc)
        service = json.loads((_space_dir(root) / "auth-service.json").read_text())
        forged = "x\nlevel=info outcome=minted"
        status, answer = _post(service["url"] + "/exchange", service["cap"], {"actorToken": "t", "actor": "a", forged: 1})
        assert status == 400, answer
    finally:
        code, err = _stop(proc)
    assert code == 0, err
    refusals = [line for line in err.splitlines() if "does not take" in line]
    assert len(refusals) == 1 and "does not take x\\nlevel=info outcome=minted - allowed keys:" in refusals[0], err
    assert not [line for line in err.splitlines() if line.startswith("level=info outcome=minted")], err
