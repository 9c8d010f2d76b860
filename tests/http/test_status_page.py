"""The status page's HTTP contract (cotal_trio/http/status_page.py; issue 7 item 3).

Runs the route table through quart's test client on a bare app given the one error edge
(``install_edge``) and a stand-in capability check, without cookie jar so that every cookie is
sent by hand, each request from a face on :data:`PORT` (the ASGI ``server`` address). The
per-port cookie names and the shared bad-capability window are checked on the real loopback
face (``build_loopback_app``) too. The page's rendering is checked in a browser by
``test_status_page_browser.py``.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
from dataclasses import replace

import pytest
from quart_trio import QuartTrio

from cotal_trio.core.errors import RefusalCode, Refused
from cotal_trio.http import build_loopback_app
from cotal_trio.http.errors import install_edge
from cotal_trio.http.status_page import (
    PAGE,
    PAGE_CSP,
    UNAUTHORIZED_PAGE,
    cookie_ok,
    session_cookie_name,
    session_token,
    status_routes,
)
from tests.support.loopback import CAP, _context, ceiling
from tests.support.public_face import _app as _public_app

WRONG_CAPS = ["wrong-capability-XYZZY", CAP + "0", CAP[:-1], "", "c\u00e7" * 10]
PORT = 8101  # the face's own port, as hypercorn puts it in the ASGI scope
OTHER_PORT = 8102
OTHER_CAP = "e" * 64
TOO_MANY = "too many invalid-capability attempts - wait a minute and retry"  # the loopback face's sentence
BAD_CAPABILITY_WINDOW = 30  # the face's bad-capability window: 30 per 60 s


class StandIn:
    """A capability check like the loopback face's, counting the values it was shown; it
    answers RATE_LIMITED once ``limit`` wrong values were shown."""

    def __init__(self, limit: int = BAD_CAPABILITY_WINDOW) -> None:
        self.shown: list[str | None] = []
        self._limit = limit

    def __call__(self, presented: str | None) -> None:
        self.shown.append(presented)
        if presented == CAP:
            return
        if len([value for value in self.shown if value != CAP]) <= self._limit:
            raise Refused(RefusalCode.BAD_CAPABILITY, "bad capability (stand-in)")
        raise Refused(RefusalCode.RATE_LIMITED, "too many (stand-in)")


def _status_client(check: StandIn | None = None):
    app = QuartTrio("test_status_page")
    install_edge(app, routes=status_routes(CAP, check or StandIn()), unknown_path="unknown path")
    return _OnPort(app.test_client(use_cookies=False), PORT)


class _OnPort:
    """A test client whose requests arrive on the face's ``port`` (ASGI ``server``)."""

    def __init__(self, client, port: int) -> None:
        self._client, self.port = client, port

    async def get(self, path: str = "/", **kwargs):
        return await self._client.get(path, scope_base={"server": ("127.0.0.1", self.port)}, **kwargs)

    async def post(self, path: str, **kwargs):
        return await self._client.post(path, scope_base={"server": ("127.0.0.1", self.port)}, **kwargs)


def _with_cookie(value: str, port: int = PORT) -> dict[str, str]:
    return {"Cookie": f"{session_cookie_name(port)}={value}"}


def _directives(csp: str) -> dict[str, str]:
    return dict(part.strip().partition(" ")[::2] for part in csp.split(";"))


def _inline_hash(tag: str) -> str:
    (text,) = re.findall(rf"<{tag}>(.*?)</{tag}>", PAGE, flags=re.S)
    return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode()).digest()).decode() + "'"


# --- the token ----------------------------------------------------------------------------------


def test_the_session_token_is_hmac_sha256_keyed_by_the_capability_over_a_fixed_domain():
    token = session_token(CAP)
    assert token == hmac.new(CAP.encode(), b"cotal-status-session", hashlib.sha256).hexdigest()
    assert re.fullmatch(r"[0-9a-f]{64}", token) and CAP not in token
    assert session_token(CAP + "x") != token


@pytest.mark.parametrize(
    "value, ok",
    [(session_token(CAP), True), (None, False), ("", False), (session_token(CAP)[:-1], False),
     (session_token("another-capability"), False), (CAP, False), ("\u00e7" * 64, False)],
)  # fmt: skip
def test_cookie_ok_accepts_only_this_capabilitys_token(value, ok):
    assert cookie_ok(value, CAP) is ok


# --- the routes ---------------------------------------------------------------------------------


def test_the_cookie_name_carries_the_faces_port():
    # RFC 6265 section 8.5: cookies do not provide isolation by port, so every face on
    # 127.0.0.1 shares one jar; the name is what keeps two faces' sessions apart.
    assert session_cookie_name(PORT) == f"cotal_session_{PORT}"
    assert session_cookie_name(PORT) != session_cookie_name(OTHER_PORT)


@ceiling
async def test_the_right_cap_is_a_303_to_root_with_the_session_cookie():
    response = await _status_client().get("/", query_string={"cap": CAP})
    assert response.status_code == 303
    assert response.headers["Location"] == "/"
    assert response.headers.get_all("Set-Cookie") == [
        f"cotal_session_{PORT}={session_token(CAP)}; HttpOnly; SameSite=Strict; Path=/"
    ]
    assert "Secure" not in response.headers["Set-Cookie"]
    assert response.headers["Cache-Control"] == "no-store"
    assert response.headers["Referrer-Policy"] == "no-referrer"


@ceiling
async def test_the_cookie_from_the_303_opens_the_page():
    client = _status_client()
    issued = (await client.get("/", query_string={"cap": CAP})).headers["Set-Cookie"]
    name, _, value = issued.split(";")[0].partition("=")
    response = await client.get("/", headers={"Cookie": f"{name}={value}"})
    assert response.status_code == 200
    assert response.headers["Content-Type"] == "text/html; charset=utf-8"
    assert response.headers["Cache-Control"] == "no-store"
    body = await response.get_data(as_text=True)
    assert body == PAGE
    assert '"ws://" + location.host + "/events"' in body


@ceiling
async def test_the_page_csp_allows_only_its_own_inline_code_and_the_loopback_websocket():
    response = await _status_client().get("/", headers=_with_cookie(session_token(CAP)))
    csp = response.headers["Content-Security-Policy"]
    assert csp == PAGE_CSP
    directives = _directives(csp)
    assert directives["default-src"] == "'none'"
    assert directives["script-src"] == _inline_hash("script")
    assert directives["style-src"] == _inline_hash("style")
    assert directives["connect-src"] == "'self' ws://127.0.0.1:*"
    assert directives["frame-ancestors"] == "'none'"
    assert "unsafe" not in csp


def test_the_page_loads_nothing_from_elsewhere():
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", PAGE)
    assert "http://" not in PAGE and "https://" not in PAGE
    assert "innerHTML" not in PAGE  # event strings are set as text only


@ceiling
@pytest.mark.parametrize("wrong", WRONG_CAPS)
async def test_a_wrong_cap_is_a_401_page_without_cookie_or_echo(wrong):
    response = await _status_client().get("/", query_string={"cap": wrong})
    assert response.status_code == 401
    assert "Set-Cookie" not in response.headers
    assert response.headers["Content-Type"] == "text/html; charset=utf-8"
    body = await response.get_data(as_text=True)
    assert "auth-service.json" in body and "cotal status" in body
    if len(wrong) > 2:
        assert wrong not in body


@ceiling
@pytest.mark.parametrize(
    "headers", [{}, _with_cookie("forged-session-QWERTY"), _with_cookie(CAP), _with_cookie(session_token("old-cap"))]
)
async def test_without_a_valid_cookie_root_is_a_401_page(headers):
    response = await _status_client().get("/", headers=headers)
    assert response.status_code == 401
    body = await response.get_data(as_text=True)
    assert "auth-service.json" in body
    assert "QWERTY" not in body and CAP not in body
    assert response.headers["Cache-Control"] == "no-store"


@ceiling
@pytest.mark.parametrize("name", ["cotal_session", f"cotal_session_{OTHER_PORT}", f"cotal_session_{PORT}0"])
async def test_the_token_under_another_name_does_not_open_the_page(name):
    response = await _status_client().get("/", headers={"Cookie": f"{name}={session_token(CAP)}"})
    assert response.status_code == 401


@ceiling
async def test_every_presented_cap_goes_through_the_faces_check_and_only_those():
    check = StandIn()
    client = _status_client(check)
    for query in ({"cap": CAP}, {"cap": "wrong"}, {"cap": ""}, {}, {"other": "x"}):
        await client.get("/", query_string=query)
    await client.get("/", headers=_with_cookie(session_token(CAP)))
    await client.get("/", headers=_with_cookie("forged"))
    assert check.shown == [CAP, "wrong", ""]  # a missing ?cap or a bad cookie is no capability attempt


@ceiling
async def test_a_rate_limited_cap_is_a_429_page_with_the_checks_sentence():
    client = _status_client(StandIn(limit=1))
    first = await client.get("/", query_string={"cap": "wrong"})
    response = await client.get("/", query_string={"cap": "wrong"})
    assert (first.status_code, response.status_code) == (401, 429)
    assert "Set-Cookie" not in response.headers
    assert response.headers["Content-Type"] == "text/html; charset=utf-8"
    assert response.headers["Cache-Control"] == "no-store"
    body = await response.get_data(as_text=True)
    assert "too many (stand-in)" in body and "cotal status" in body and "wrong" not in body
    assert (await client.get("/", query_string={"cap": CAP})).status_code == 303  # the right one still opens


@ceiling
async def test_a_wrong_cap_is_refused_even_beside_a_valid_cookie():
    response = await _status_client().get("/", query_string={"cap": "wrong"}, headers=_with_cookie(session_token(CAP)))
    assert response.status_code == 401
    assert "Set-Cookie" not in response.headers


@ceiling
async def test_only_get_is_served_on_root():
    response = await _status_client().post("/", headers=_with_cookie(session_token(CAP)))
    assert response.status_code == 405
    assert response.headers["Allow"] == "GET"


@ceiling
@pytest.mark.parametrize("query", [{}, {"cap": CAP}])
async def test_the_public_face_does_not_serve_the_status_page(query):
    response = await _public_app().test_client().get("/", query_string=query, headers=_with_cookie(session_token(CAP)))
    assert response.status_code == 404
    assert "Set-Cookie" not in response.headers
    assert "<html" not in await response.get_data(as_text=True)


# --- on the loopback face ---------------------------------------------------------------------


def _face(capability: str, port: int) -> _OnPort:
    app = build_loopback_app(replace(_context(), capability=capability))
    return _OnPort(app.test_client(use_cookies=False), port)


def _set_cookie(response) -> tuple[str, str]:
    name, _, value = response.headers["Set-Cookie"].split(";")[0].partition("=")
    return name, value


@ceiling
async def test_two_faces_on_one_host_keep_both_sessions():
    """A browser keeps one cookie jar for 127.0.0.1 across ports: opening the second face's
    page must not replace the first face's session."""
    alpha, beta = _face(CAP, PORT), _face(OTHER_CAP, OTHER_PORT)
    jar: dict[str, str] = {}  # a browser's jar for host 127.0.0.1: one value per name
    for face, cap in ((alpha, CAP), (beta, OTHER_CAP)):
        response = await face.get("/", query_string={"cap": cap})
        assert response.status_code == 303
        name, value = _set_cookie(response)
        jar[name] = value
    assert sorted(jar) == [f"cotal_session_{PORT}", f"cotal_session_{OTHER_PORT}"]
    cookie = "; ".join(f"{name}={value}" for name, value in jar.items())
    for face in (alpha, beta):
        assert (await face.get("/", headers={"Cookie": cookie})).status_code == 200
    assert (await alpha.get("/", headers=_with_cookie(session_token(OTHER_CAP), OTHER_PORT))).status_code == 401


async def _bad_exchange(face: _OnPort) -> tuple[int, dict]:
    headers = {"Content-Type": "application/json", "Authorization": "Bearer wrong"}
    response = await face.post("/exchange", data=b"{}", headers=headers)
    return response.status_code, await response.get_json()


@ceiling
async def test_wrong_caps_count_in_the_faces_bad_capability_window():
    face = _face(CAP, PORT)
    statuses = [(await face.get("/", query_string={"cap": f"wrong-{i}"})).status_code for i in range(BAD_CAPABILITY_WINDOW)]
    assert statuses == [401] * BAD_CAPABILITY_WINDOW
    response = await face.get("/", query_string={"cap": "wrong-again"})
    assert response.status_code == 429
    assert response.headers["Content-Type"] == "text/html; charset=utf-8"
    body = await response.get_data(as_text=True)
    assert TOO_MANY in body and "wrong-again" not in body
    assert await _bad_exchange(face) == (429, {"error": TOO_MANY})  # the same window as the doors
    assert (await face.get("/")).status_code == 401  # no ?cap: no attempt, the plain 401 page
    assert (await face.get("/", query_string={"cap": CAP})).status_code == 303  # the right cap still opens


@ceiling
async def test_bad_bearers_on_the_doors_fill_the_window_for_the_page_too():
    face = _face(CAP, PORT)
    for _ in range(BAD_CAPABILITY_WINDOW):
        assert (await _bad_exchange(face))[0] == 401
    response = await face.get("/", query_string={"cap": "wrong"})
    assert response.status_code == 429 and TOO_MANY in await response.get_data(as_text=True)


# --- the page's words -------------------------------------------------------------------------


def test_the_pages_ms_constants_are_milliseconds():
    """STYLE practice 23: a ``_MS`` name is a duration in milliseconds (a timer's delay)."""
    script = re.search(r"<script>(.*?)</script>", PAGE, flags=re.S).group(1)
    for name in re.findall(r"\b([A-Z][A-Z0-9_]*_MS)\s*=", script):
        assert re.search(rf"setTimeout\([^)]*\b{name}\b", script), name
    assert re.search(r"\bKEEP_SAMPLES = 1000\b", script)


def test_the_pages_say_what_ends_a_session():
    """The capability is new at every lane start, not only when the service restarts."""
    for text in (UNAUTHORIZED_PAGE, PAGE):
        assert "service restart" not in text
        assert "lane" in text and "capability" in text
    assert "retry" in UNAUTHORIZED_PAGE and "fence" in UNAUTHORIZED_PAGE
