"""The exchange client (cotal_trio/http/client.py; upstream-notes 3.5 and 4.1).

``post_exchange`` runs against the real loopback face served by hypercorn on port 0, and
against a few raw trio servers for answers a real face never gives (a redirect, non-JSON).
It blocks, so tests call it through ``trio.to_thread.run_sync``.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import time

import pytest
import trio

from cotal_trio.core.bearer import validate_bearer
from cotal_trio.core.errors import AuthServiceError, ConfigError, Refused, Unavailable
from cotal_trio.core.identity import derive_owner
from cotal_trio.core.idp import parse_jwks
from cotal_trio.core.jose import BearerKeySet, IssuerKey
from cotal_trio.core.ledger import LedgerKind, LedgerRow
from cotal_trio.devidp import create_dev_idp, jwks, mint_dev_token
from cotal_trio.http import ExchangeContext, build_loopback_app, serve_app
from cotal_trio.http.client import ExchangeRefused, ServiceRecord, check_url, post_exchange, read_service
from cotal_trio.state import RootPaths, write_json

SPACE = "alpha"
CAP = "c" * 64
OWNER_SECRET = bytes(range(32, 64))
SUB = "dev-user-1"
CEILING_S = 10
DEV_IDP = create_dev_idp(lambda n: bytes(range(100, 100 + n)))
ISSUER_KEY = IssuerKey.generate(bytes(range(32)))
OWNER = derive_owner(OWNER_SECRET, DEV_IDP.issuer, SUB)
ROW = LedgerRow(
    kind=LedgerKind.INTERACTIVE, owner=OWNER, actor="cli", scope=("spawn",), allow_subscribe=(">",),
    allow_publish=(">",), lifecycle_uid="a" * 26, granted_at="2026-11-29T10:00:00.000Z",
)  # fmt: skip


def _context() -> ExchangeContext:
    def read_ledger(owner: str, actor: str):
        return (ROW if (owner, actor) == (OWNER, "cli") else None), None

    return ExchangeContext(
        space=SPACE, capability=CAP, issuer_key=ISSUER_KEY, owner_secret=OWNER_SECRET,
        idp_pin=DEV_IDP.pin(), idp_keys=lambda: parse_jwks(jwks(DEV_IDP)), read_ledger=read_ledger,
        clock=time.time,
    )  # fmt: skip


def _human_body(actor: str = "cli") -> dict:
    return {"idpToken": mint_dev_token(DEV_IDP, sub=SUB, now=int(time.time()), ttl_s=600), "actor": actor}


async def _serve_face(nursery: trio.Nursery) -> str:
    port = await nursery.start(functools.partial(serve_app, build_loopback_app(_context())))
    return f"http://127.0.0.1:{port}"


async def _post(url: str, cap: str | None, body: dict) -> dict:
    return await trio.to_thread.run_sync(functools.partial(post_exchange, url, cap, body, timeout_s=5))


# --- post_exchange against the loopback face -----------------------------------------------


async def test_a_mint_returns_the_answer_object(nursery):
    with trio.fail_after(CEILING_S):
        url = await _serve_face(nursery)
        answer = await _post(url, CAP, _human_body())
    assert sorted(answer) == ["exp", "owner", "token"] and answer["owner"] == OWNER
    bearer = validate_bearer(answer["token"], keys=BearerKeySet.from_keys([ISSUER_KEY]), space=SPACE, now=time.time())
    assert (bearer.owner, bearer.actor) == (OWNER, "cli")


async def test_a_trailing_slash_on_the_url_is_fine(nursery):
    with trio.fail_after(CEILING_S):
        url = await _serve_face(nursery)
        answer = await _post(url + "/", CAP, _human_body())
    assert answer["owner"] == OWNER


async def test_a_refusal_carries_the_status_and_the_sentence(nursery):
    with trio.fail_after(CEILING_S):
        url = await _serve_face(nursery)
        with pytest.raises(ExchangeRefused) as refused:
            await _post(url, CAP, _human_body("web"))
    assert refused.value.status == 401
    assert refused.value.error.startswith('actor "web" is not granted for this user')
    assert refused.value.body == {"error": refused.value.error}


async def test_a_missing_capability_is_refused_401(nursery):
    with trio.fail_after(CEILING_S):
        url = await _serve_face(nursery)
        with pytest.raises(ExchangeRefused) as refused:
            await _post(url, None, _human_body())
    assert (refused.value.status, str(refused.value)) == (
        401, "missing/invalid exchange capability - read it from the space's auth-service.json",
    )  # fmt: skip


async def test_nothing_listening_is_unavailable():
    with trio.socket.socket() as probe:
        await probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with trio.fail_after(CEILING_S), pytest.raises(Unavailable, match="nothing answers at http://127.0.0.1"):
        await _post(f"http://127.0.0.1:{port}", CAP, _human_body())


# --- answers a real face never gives -------------------------------------------------------


async def _read_request(stream: trio.SocketStream) -> None:
    data = b""
    while b"\r\n\r\n" not in data:
        data += await stream.receive_some()
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length"))
    while len(body) < length:
        body += await stream.receive_some()


async def _raw_server(nursery: trio.Nursery, status_line: str, headers: str, body: bytes) -> str:
    async def answer(stream: trio.SocketStream) -> None:
        async with stream:
            await _read_request(stream)
            head = f"HTTP/1.1 {status_line}\r\n{headers}Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
            await stream.send_all(head.encode() + body)

    listeners = await nursery.start(functools.partial(trio.serve_tcp, answer, 0, host="127.0.0.1"))
    return f"http://127.0.0.1:{listeners[0].socket.getsockname()[1]}"


async def test_a_redirect_is_not_followed(nursery):
    with trio.fail_after(CEILING_S):
        url = await _raw_server(nursery, "307 Temporary Redirect", "Location: http://127.0.0.1:9/x\r\n", b"")
        with pytest.raises(ExchangeRefused) as refused:
            await _post(url, CAP, _human_body())
    assert refused.value.status == 307 and refused.value.body == {}
    assert refused.value.error == "the auth service answered HTTP 307 without a reason"


async def test_an_answer_that_is_not_a_json_object_is_unavailable(nursery):
    with trio.fail_after(CEILING_S):
        url = await _raw_server(nursery, "200 OK", "Content-Type: application/json\r\n", b"[1, 2]")
        with pytest.raises(Unavailable, match="not a JSON object"):
            await _post(url, CAP, _human_body())


@pytest.mark.parametrize("url", ["http://auth.example.com", "ftp://127.0.0.1", "127.0.0.1:80", "https://"])
def test_credentials_go_only_to_https_or_loopback(url):
    with pytest.raises(ConfigError, match="neither https:// nor a loopback http://"):
        check_url(url)


@pytest.mark.parametrize("url", ["http://127.0.0.1:7450", "http://localhost:1", "http://[::1]:1/", "https://auth.example"])
def test_https_and_loopback_urls_pass(url):
    assert check_url(url) == url.rstrip("/")


# --- read_service ---------------------------------------------------------------------------


def _space(tmp_path):
    return RootPaths(tmp_path).space(SPACE)


def test_read_service_returns_the_record(tmp_path):
    space = _space(tmp_path)
    write_json(space.auth_service_json, {"ver": 1, "url": "http://127.0.0.1:7450", "pid": os.getpid(), "cap": CAP})
    assert read_service(space) == ServiceRecord(url="http://127.0.0.1:7450", cap=CAP, pid=os.getpid())
    assert CAP not in repr(read_service(space))


def test_no_readiness_file_means_not_running(tmp_path):
    with pytest.raises(ConfigError) as error:
        read_service(_space(tmp_path))
    assert str(error.value) == "the auth service for space alpha is not running - start `cotal up`, or host the space in a running one with `cotal space add alpha`"


def test_a_readiness_file_of_a_dead_process_means_not_running(tmp_path):
    space = _space(tmp_path)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, check=True)
    pid = int(dead.stdout)
    write_json(space.auth_service_json, {"ver": 1, "url": "http://127.0.0.1:7450", "pid": pid, "cap": CAP})
    with pytest.raises(ConfigError, match="the auth service for space alpha is not running"):
        read_service(space)


def test_a_readiness_file_whose_pid_another_process_took_means_not_running(tmp_path):
    """Issue 15 item 11: after a SIGKILL the file stays, and its pid may be reused by a process
    that started after the file was written (a reboot, pid 1 in a container): that process is
    not the auth service."""
    space = _space(tmp_path)
    with subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"]) as other:
        try:
            record = {"ver": 1, "url": "http://127.0.0.1:7450", "pid": other.pid, "cap": CAP}
            write_json(space.auth_service_json, record)
            written = time.time() - 60  # the file is a minute older than the process
            os.utime(space.auth_service_json, (written, written))
            with pytest.raises(ConfigError, match="the auth service for space alpha is not running"):
                read_service(space)
            os.utime(space.auth_service_json, None)  # written now, by a process that was running
            assert read_service(space).pid == other.pid
        finally:
            other.kill()


@pytest.mark.parametrize(
    ("record", "why"),
    [
        ({"ver": 1, "url": "http://127.0.0.1:1", "pid": 1, "cap": "short"}, "cap is not 64 lowercase hex"),
        ({"ver": 1, "url": "http://127.0.0.1:1", "pid": 0, "cap": CAP}, "pid is not a process id"),
        ({"ver": 1, "url": "nats://127.0.0.1:1", "pid": 1, "cap": CAP}, "url is not an http"),
        ({"ver": 1, "url": "http://127.0.0.1:1", "cap": CAP}, "pid is missing"),
        ({"ver": 2, "url": "http://127.0.0.1:1", "pid": 1, "cap": CAP}, "ver must be 1"),
    ],
)
def test_a_corrupt_readiness_file_names_the_file(tmp_path, record, why):
    space = _space(tmp_path)
    write_json(space.auth_service_json, record)
    with pytest.raises(ConfigError, match=f"{space.auth_service_json} is corrupt \\({why}"):
        read_service(space)


def test_refused_is_an_auth_service_error_with_its_sentence():
    refused = ExchangeRefused(429, "too many refused exchanges - wait a minute and retry", {})
    assert isinstance(refused, AuthServiceError) and not isinstance(refused, Refused)
    assert str(refused) == refused.error and json.dumps(refused.body) == "{}"


def test_a_lane_that_is_retrying_is_named_with_its_reason_not_as_not_running(tmp_path):
    """Found by the issue 15 fresh-user check: while the broker hung, `cotal exchange` and `cotal
    check` said the auth service was not running and told the operator to start `cotal up`,
    which then answered "already served". A live host's `.applied` that lists the space as
    retrying is what is true: the lane is not serving now, for its reason, and comes back."""
    from cotal_trio.core.manifest import LaneStatus, render_applied

    space = _space(tmp_path)
    reason = "the broker closed the callout connection (no PING answered within 4 s)"
    applied = render_applied(
        manifest_sha256=None, applied_at="2026-12-01T23:00:00Z", refused=None, pid=os.getpid(),
        spaces={SPACE: LaneStatus(state="retrying", reason=reason)},
    )
    (tmp_path / "spaces.json.applied").write_bytes(applied)
    with pytest.raises(ConfigError) as refused:
        read_service(space)
    assert str(refused.value) == (
        f"the auth service for space {SPACE} is not serving now (retrying: {reason}) - it comes back by"
        f" itself once the cause is gone; `cotal status --root {tmp_path}` shows it"
    )
    (tmp_path / "spaces.json.applied").unlink()
    with pytest.raises(ConfigError, match=f"the auth service for space {SPACE} is not running - start"):
        read_service(space)
