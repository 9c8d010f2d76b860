"""The status page: ``GET /`` on the loopback face, a live view of ``/events`` (issue 7 item 3).

Served on the loopback faces only (``http/loopback.py`` adds :func:`status_routes` to its table,
and so does the process's operator face, ``http/ops.py``, issue 18 item 8; the public face never
does). A space's own face streams its space's traffic and every lane's state; the operator face
streams every space's events, so its hello names no space (``"space": null``) and the page shows
every space's traffic. The flow, for a browser on the host:

===========================  ========================================================================
``GET /?cap=<capability>``   the face's capability check (the same bad-capability window as its
                             doors). Right: ``303`` to ``/`` with ``Set-Cookie:
                             cotal_session_<port>=<session_token(cap)>; HttpOnly; SameSite=Strict;
                             Path=/`` (no ``Secure``: plain http on 127.0.0.1). Wrong or empty:
                             ``401`` (no cookie), counted; once the window is full, ``429`` with the
                             face's sentence. Both are short HTML pages.
``GET /`` + valid cookie     ``200`` the page (:data:`PAGE`): one self-contained HTML document that
                             opens ``ws://<location.host>/events`` (the cookie rides along)
anything else                ``401`` a short HTML page naming where the capability is (not
                             counted: no capability was presented); a presented value is never
                             echoed
===========================  ========================================================================

``<port>`` is the face's own port (the ASGI ``server`` address, :func:`face_port`). RFC 6265
section 8.5: cookies do not isolate ports, so every face on 127.0.0.1 (each space of a host)
shares the browser's cookie jar; one name per port keeps one face's session from replacing
another's. The same jar goes to every local port, so any local server the browser visits
receives these cookies (docs/status-page.md "Security").

Every answer carries ``Cache-Control: no-store`` and ``Referrer-Policy: no-referrer`` (the
capability sits in the first URL). The page's Content-Security-Policy (:data:`PAGE_CSP`) allows
nothing by default, its one inline ``<style>`` and one inline ``<script>`` by SHA-256 hash,
``connect-src 'self' ws://127.0.0.1:*``, and no framing.

The session token is ``HMAC-SHA256(key=capability, msg="cotal-status-session")`` in hex: it
needs no state, it dies with the capability, and a cookie never reveals the capability. The
capability is new at every lane start (``lane/run.py``): a service restart, a lane retry
(broker gap, lost store) or a fenced plane claim, so any of them ends the session. ``/events``
accepts it through :func:`cookie_ok`, under :func:`session_cookie_name` of its own port.

The page consumes the issue 7 event schema (:mod:`cotal_trio.core.events`): a
``hello`` first (``{"type": "hello", "space", "lanes": {space: {"state", "reason"}}, "seq"}``),
then ``callout`` / ``lane`` / ``manifest`` / ``exchange`` events keyed by ``seq`` (deduped).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import html
from collections.abc import Callable, Mapping

from quart import request

from cotal_trio.core.errors import RefusalCode, Refused
from cotal_trio.http.errors import REFUSAL_STATUS, Handler

__all__ = [
    "PAGE",
    "PAGE_CSP",
    "SESSION_COOKIE_PREFIX",
    "UNAUTHORIZED_PAGE",
    "CapabilityCheck",
    "cookie_ok",
    "face_port",
    "session_cookie_name",
    "session_token",
    "status_routes",
]

# A face's session cookie is this prefix plus its port (RFC 6265 section 8.5: no port isolation).
SESSION_COOKIE_PREFIX = "cotal_session_"
# The HMAC message that makes the session token a different value from the capability.
_SESSION_DOMAIN = b"cotal-status-session"

_HTML = "text/html; charset=utf-8"
_COMMON_HEADERS = {
    "Cache-Control": "no-store",
    "Referrer-Policy": "no-referrer",
    "X-Content-Type-Options": "nosniff",
}
_BARE_CSP = "default-src 'none'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"


CapabilityCheck = Callable[[str | None], None]
"""The face's capability check on a presented value (``None``: none presented): returns for the
right capability; else raises ``Refused`` BAD_CAPABILITY, counted in the face's bad-capability
window, or RATE_LIMITED (with the face's sentence) once that window is full. Sync, no I/O."""


def session_cookie_name(port: int) -> str:
    """The session cookie's name on the face listening on ``port``: ``cotal_session_<port>``."""
    return f"{SESSION_COOKIE_PREFIX}{port}"


def face_port(scope: Mapping[str, object]) -> int:
    """The face's own port from an ASGI scope's ``server`` address; ``0`` when the scope has
    none (hypercorn always sets it on a TCP listener; an in-memory test client may not)."""
    server = scope.get("server")
    if isinstance(server, (tuple, list)) and len(server) == 2 and isinstance(server[1], int):
        return server[1]
    return 0


def session_token(capability: str) -> str:
    """The status page's session cookie value for ``capability``: 64 lowercase hex characters.

    ``HMAC-SHA256`` keyed by the capability (UTF-8) over a fixed domain string; pure and
    deterministic, so the face and ``/events`` recompute it instead of storing sessions.
    """
    return hmac.new(capability.encode("utf-8"), _SESSION_DOMAIN, hashlib.sha256).hexdigest()


def cookie_ok(cookie_value: str | None, capability: str) -> bool:
    """Whether ``cookie_value`` (the face's :func:`session_cookie_name` cookie, or ``None``) is
    this capability's session token. Constant-time in the compared bytes; never raises."""
    if cookie_value is None:
        return False
    expected = session_token(capability).encode("ascii")
    return hmac.compare_digest(cookie_value.encode("utf-8", "replace"), expected)


def status_routes(
    capability: str, check_capability: CapabilityCheck, *, unauthorized: str | None = None
) -> dict[str, dict[str, Handler]]:
    """The status page's route table for a loopback face: ``{"/": {"GET": handler}}``.

    Args:
        capability: the face's exchange capability (``ExchangeContext.capability``), keying the
            session token.
        check_capability: the face's own check (:data:`CapabilityCheck`), so a wrong ``?cap``
            counts in the window every door of the face shares.
        unauthorized: the 401 page naming where the face's capability is; None:
            :data:`UNAUTHORIZED_PAGE` (a space's ``auth-service.json``). The operator face
            (``http/ops.py``) names its own file.

    Returns:
        A table for :func:`cotal_trio.http.errors.install_edge`; the handler takes no
        arguments, reads quart's ``request`` and answers ``(body, status, headers)``: for a
        ``?cap`` (even beside a valid cookie), 303 with the cookie
        ``session_cookie_name(face_port(scope))`` when the check passes, else the check's
        refusal as an HTML page (401 :data:`UNAUTHORIZED_PAGE`, 429 with the refusal's
        sentence); without one, 200 :data:`PAGE` for a valid cookie, else 401
        :data:`UNAUTHORIZED_PAGE`. It raises nothing of its own.
    """
    token = session_token(capability)
    unauthorized_page = UNAUTHORIZED_PAGE if unauthorized is None else unauthorized

    async def status_page() -> tuple[str, int, dict[str, str]]:
        name = session_cookie_name(face_port(request.scope))
        presented = request.args.get("cap")
        if presented is not None:
            try:
                check_capability(presented)
            except Refused as refused:
                return _refusal_page(refused, unauthorized_page)
            cookie = f"{name}={token}; HttpOnly; SameSite=Strict; Path=/"
            return "", 303, {**_COMMON_HEADERS, "Location": "/", "Set-Cookie": cookie}
        if cookie_ok(request.cookies.get(name), capability):
            return PAGE, 200, {**_COMMON_HEADERS, "Content-Type": _HTML, "Content-Security-Policy": PAGE_CSP}
        return _html(unauthorized_page, 401)

    return {"/": {"GET": status_page}}


def _refusal_page(refused: Refused, unauthorized_page: str) -> tuple[str, int, dict[str, str]]:
    """A refused ``?cap`` as HTML, its status from the one table (STYLE practice 18)."""
    status = REFUSAL_STATUS[refused.code]
    if refused.code is RefusalCode.BAD_CAPABILITY:
        return _html(unauthorized_page, status)
    return _html(_REFUSED_PAGE.format(sentence=html.escape(refused.detail)), status)


def _html(body: str, status: int) -> tuple[str, int, dict[str, str]]:
    return body, status, {**_COMMON_HEADERS, "Content-Type": _HTML, "Content-Security-Policy": _BARE_CSP}


UNAUTHORIZED_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>cotal status - capability needed</title></head>
<body><h1>cotal status: capability needed</h1>
<p>This page needs the space's exchange capability once. It is the <code>cap</code> field of the
space's <code>auth-service.json</code> (under the cotal root, in the space's folder; readable by
the service's user only). <code>cotal status</code> lists the serving spaces and their face URLs.</p>
<p>Open <code>http://127.0.0.1:&lt;port&gt;/?cap=&lt;capability&gt;</code> on this host; the page
then keeps a session cookie while the space's lane keeps its capability. The lane mints a new
capability every time it starts: when the service starts, after a lane retry (a broker gap, a
lost store) and after its plane claim is fenced; then open this URL again with the new one.</p>
</body></html>
"""

_REFUSED_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>cotal status - refused</title></head>
<body><h1>cotal status: refused</h1>
<p>{sentence}</p>
</body></html>
"""

# --- the page ---------------------------------------------------------------------------------
# Rendering uses textContent and setAttribute only (never innerHTML), so event strings (space
# names, denial reasons, close reasons) cannot inject markup.

_STYLE = """
body{font:14px/1.4 system-ui,sans-serif;margin:1.5em;background:#fafafa;color:#222}
header{display:flex;gap:1em;align-items:baseline}
h1{font-size:1.3em;margin:0}
#conn{font-weight:bold;padding:0 .5em;border-radius:3px;background:#c62828;color:#fff}
#conn.live{background:#2e7d32}
#conn-detail,#host,.note{color:#666}
main{display:flex;flex-wrap:wrap;gap:1em}
section{background:#fff;border:1px solid #ddd;border-radius:6px;padding:.8em 1em;min-width:30em}
h2{font-size:1.1em;margin:0 0 .4em}
dl{display:grid;grid-template-columns:max-content auto;gap:.1em 1em;margin:.4em 0}
dt{color:#666}dd{margin:0;font-variant-numeric:tabular-nums}
.state-serving{color:#2e7d32}.state-retrying,.state-fenced{color:#c62828}
ol{margin:.2em 0;padding-left:1.5em;color:#555}
.legend span{margin-right:1em}.legend i{display:inline-block;width:.8em;height:.8em;margin-right:.3em}
canvas{width:480px;height:120px;border:1px solid #eee}
"""

_SCRIPT = r"""
"use strict";
const OUTCOMES = ["minted", "denied", "timeout", "shed"];
const COLORS = {minted: "#2e7d32", denied: "#c62828", timeout: "#ef6c00", shed: "#6a1b9a"};
const CHART_S = 60, RATE_S = 10, REASONS = 5, SEEN_MAX = 4096, RETRY_MS = 2000, KEEP_SAMPLES = 1000;
const spaces = new Map();
const seen = new Set(), seenOrder = [];
let ownSpace = null, everySpace = false, maxSeq = 0, manifest = null, pending = false;

function node(tag, attrs, text) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) el.setAttribute(k, v);
  if (text !== undefined) el.textContent = text;
  return el;
}

function row(dl, label, field) {
  dl.append(node("dt", {}, label));
  const dd = node("dd", {"data-field": field}, "-");
  dl.append(dd);
  return dd;
}

function block(name) {
  const root = node("section", {"data-space": name});
  root.append(node("h2", {}, name));
  const dl = node("dl");
  const f = {state: row(dl, "lane", "state"), reason: row(dl, "reason", "reason")};
  for (const o of OUTCOMES) f[o + "-total"] = row(dl, o, o + "-total");
  f.limited = row(dl, "limit denials", "limited");
  f.rate = row(dl, "connects/s (10 s)", "rate");
  f.p50 = row(dl, "p50 total (60 s)", "p50");
  f.p99 = row(dl, "p99 total (60 s)", "p99");
  f.exchanges = row(dl, "exchanges", "exchanges");
  root.append(dl, node("div", {class: "note"}, "last denial reasons"));
  f.reasons = node("ol", {"data-field": "reasons"});
  f.canvas = node("canvas", {"data-field": "chart", width: "480", height: "120"});
  const legend = node("div", {class: "legend"});
  for (const o of OUTCOMES) {
    const swatch = node("i");
    swatch.style.background = COLORS[o];
    const item = node("span", {}, o);
    item.prepend(swatch);
    legend.append(item);
  }
  f.legend = legend;
  root.append(f.reasons, f.canvas, legend);
  document.getElementById("spaces").append(root);
  return {root, f, lane: {state: "unknown", reason: null}, traffic: false, totals: {minted: 0, denied: 0, timeout: 0, shed: 0},
          limited: 0, reasons: [], seconds: new Map(), exchanges: {ok: 0, refused: 0}};
}

function space(name) {
  if (!spaces.has(name)) spaces.set(name, block(name));
  return spaces.get(name);
}

function second(s, at) {
  const key = Math.floor(at);
  if (!s.seconds.has(key)) s.seconds.set(key, {minted: 0, denied: 0, timeout: 0, shed: 0, ms: [], n: 0});
  return s.seconds.get(key);
}

function keep(bucket, ms) {
  // Reservoir of at most KEEP_SAMPLES totalMs values per one-second bucket: percentiles stay bounded under a flood.
  bucket.n += 1;
  if (bucket.ms.length < KEEP_SAMPLES) bucket.ms.push(ms);
  else if (Math.random() < KEEP_SAMPLES / bucket.n) bucket.ms[Math.floor(Math.random() * KEEP_SAMPLES)] = ms;
}

const HANDLERS = {
  callout(ev) {
    const s = space(ev.space), outcome = OUTCOMES.includes(ev.outcome) ? ev.outcome : null;
    if (outcome === null) return;
    s.traffic = true;
    s.totals[outcome] += 1;
    const bucket = second(s, typeof ev.at === "number" ? ev.at : Date.now() / 1000);
    bucket[outcome] += 1;
    if (typeof ev.totalMs === "number") keep(bucket, ev.totalMs);
    if (outcome === "denied") {
      if (ev.limited === true) s.limited += 1;
      s.reasons.unshift({at: ev.at, reason: String(ev.reason || "-"), limited: ev.limited === true});
      s.reasons.length = Math.min(s.reasons.length, REASONS);
    }
  },
  lane(ev) { if (ev.space) space(ev.space).lane = {state: String(ev.state), reason: ev.reason || null}; },
  manifest(ev) { manifest = ev; },
  exchange(ev) {
    if (!ev.space) return;
    const s = space(ev.space);
    s.traffic = true;
    s.exchanges[ev.status >= 200 && ev.status < 300 ? "ok" : "refused"] += 1;
  },
};

function hello(ev) {
  // A hello below the highest seq seen is a restarted process: its seqs start again from 1.
  if (typeof ev.seq === "number" && ev.seq < maxSeq) { seen.clear(); seenOrder.length = 0; }
  if (typeof ev.seq === "number") maxSeq = ev.seq;
  ownSpace = ev.space || null;
  everySpace = ev.space === null;  // the operator face: every space's events come, so every space's traffic shows
  if (ownSpace) space(ownSpace);
  for (const [name, lane] of Object.entries(ev.lanes || {})) {
    space(name).lane = {state: String(lane.state), reason: lane.reason || null};
  }
}

function onEvent(ev) {
  if (!ev || typeof ev !== "object") return;
  if (ev.type === "hello") { hello(ev); schedule(); return; }
  if (typeof ev.seq === "number") {
    if (seen.has(ev.seq)) return;
    seen.add(ev.seq);
    seenOrder.push(ev.seq);
    if (seenOrder.length > SEEN_MAX) seen.delete(seenOrder.shift());
    maxSeq = Math.max(maxSeq, ev.seq);
  }
  const handler = HANDLERS[ev.type];
  if (handler) { handler(ev); schedule(); }
}

function percentile(sorted, p) {
  return sorted.length ? sorted[Math.max(0, Math.ceil(p / 100 * sorted.length) - 1)] : null;
}

function clock(at) { return typeof at === "number" ? new Date(at * 1000).toLocaleTimeString() : "-"; }

function render() {
  pending = false;
  const now = Math.floor(Date.now() / 1000);
  for (const [name, s] of spaces) renderSpace(name, s, now);
  const m = manifest;
  document.getElementById("host").textContent = (ownSpace ? "face of space " + ownSpace : everySpace ? "operator face: every space" : "") +
    (m ? " · manifest " + m.outcome + (m.outcome === "refused" ? ": " + (m.reason || "-") : " (" + (m.spaces || []).length + " spaces)") : "");
}

function renderSpace(name, s, now) {
  for (const key of s.seconds.keys()) if (key <= now - CHART_S) s.seconds.delete(key);
  const f = s.f, traffic = everySpace || name === ownSpace || s.traffic;
  f.state.textContent = s.lane.state;
  f.state.className = "state-" + s.lane.state;
  f.reason.textContent = s.lane.reason || "-";
  for (const o of OUTCOMES) f[o + "-total"].textContent = traffic ? String(s.totals[o]) : "-";
  f.limited.textContent = traffic ? String(s.limited) : "-";
  const recent = [...s.seconds].filter(([key]) => key > now - RATE_S).map(([, b]) => b);
  f.rate.textContent = traffic ? OUTCOMES.map((o) => o + " " + (recent.reduce((n, b) => n + b[o], 0) / RATE_S).toFixed(1)).join(" · ") : "-";
  const ms = [...s.seconds.values()].flatMap((b) => b.ms).sort((a, b) => a - b);
  const p50 = percentile(ms, 50), p99 = percentile(ms, 99);
  f.p50.textContent = p50 === null ? "-" : p50 + " ms";
  f.p99.textContent = p99 === null ? "-" : p99 + " ms";
  f.exchanges.textContent = traffic ? s.exchanges.ok + " ok, " + s.exchanges.refused + " refused" : "-";
  const reasons = s.reasons.map((r) => node("li", {}, clock(r.at) + " " + r.reason + (r.limited ? " (limit)" : "")));
  f.reasons.replaceChildren(...(!traffic ? [node("li", {}, "lane state only - open this space's own page, or the operator face, for its traffic")]
    : reasons.length ? reasons : [node("li", {}, "none yet")]));
  f.canvas.hidden = f.legend.hidden = !traffic;
  if (traffic) draw(f.canvas, s, now);
}

function draw(canvas, s, now) {
  const g = canvas.getContext("2d"), w = canvas.width, h = canvas.height, pad = 14;
  const series = OUTCOMES.map((o) => Array.from({length: CHART_S}, (_, i) => (s.seconds.get(now - CHART_S + 1 + i) || {})[o] || 0));
  const top = Math.max(1, ...series.flat());
  g.clearRect(0, 0, w, h);
  g.fillStyle = "#888";
  g.font = "10px sans-serif";
  g.fillText(top + "/s", 2, 10);
  g.fillText("-60 s", 2, h - 2);
  g.fillText("now", w - 22, h - 2);
  g.strokeStyle = "#ddd";
  g.beginPath(); g.moveTo(0, h - pad); g.lineTo(w, h - pad); g.stroke();
  series.forEach((points, k) => {
    g.strokeStyle = COLORS[OUTCOMES[k]];
    g.lineWidth = 1.5;
    g.beginPath();
    points.forEach((v, i) => {
      const x = i * (w - 1) / (CHART_S - 1), y = h - pad - v / top * (h - 2 * pad);
      if (i === 0) g.moveTo(x, y); else g.lineTo(x, y);
    });
    g.stroke();
  });
}

function schedule() {
  if (!pending) { pending = true; setTimeout(render, 100); }
}

function connected(live, detail) {
  const conn = document.getElementById("conn");
  conn.textContent = live ? "live" : "disconnected";
  conn.className = live ? "live" : "";
  document.getElementById("conn-detail").textContent = detail;
}

function connect() {
  const ws = new WebSocket("ws://" + location.host + "/events");
  ws.onopen = () => connected(true, "");
  ws.onmessage = (message) => {
    let ev;
    try { ev = JSON.parse(message.data); } catch (_) { return; }
    onEvent(ev);
  };
  ws.onclose = (close) => {
    connected(false, "retrying every 2 s" + (close.reason ? " - " + close.reason : "") +
      " (a lane start - service start, lane retry, fence - makes a new capability: then reopen with ?cap=<new capability>)");
    setTimeout(connect, RETRY_MS);
  };
}

setInterval(render, 1000);
connect();
"""


def _csp_hash(text: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode("utf-8")).digest()).decode("ascii") + "'"


PAGE_CSP = (
    f"default-src 'none'; script-src {_csp_hash(_SCRIPT)}; style-src {_csp_hash(_STYLE)}; "
    "connect-src 'self' ws://127.0.0.1:*; img-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
"""The page's Content-Security-Policy: the inline style and script by hash, the websocket to
this host, nothing else (no external resource, no framing)."""

PAGE = f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="referrer" content="no-referrer">
<title>cotal status</title><style>{_STYLE}</style></head>
<body><header><h1>cotal status</h1><span id="conn">disconnected</span><span id="conn-detail"></span></header>
<p id="host"></p><main id="spaces"></main>
<script>{_SCRIPT}</script></body></html>
"""
"""The status page: one HTML document, no external resources (the host may have no internet)."""
