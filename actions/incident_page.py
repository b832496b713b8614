"""Incident pages, served by the operator API (actions/api.py) from the store's incidents.

=====  ==================================  ========================================================
GET    /incidents                          open incidents, then recent ones
GET    /incidents/<id>                     one incident: its pause graph (inline SVG), timeline,
                                           each alert's evidence, and approve / reject / undrain
                                           for the drains it decided
GET    /incidents/alert/<fp>/<startsAt>    the incident of an alert event (a notification's
                                           ``generatorURL``): a redirect
POST   /incidents/<id>/command             ``command``, ``node`` (a form): queued on the same path
                                           as ``POST /api/v1/<command>``
GET    /api/v1/incidents[/<id>]            the same as JSON
GET    /login, POST /login, POST /logout   a browser's way in
=====  ==================================  ========================================================

Same authorisation as the API: ``Authorization: Bearer <api.token>``, or, for a browser, the
session cookie that ``/login`` sets once given the token (``HttpOnly``, ``SameSite=Strict``,
``Secure`` over HTTPS; its value is derived from the token, never the token itself, so a new
token ends every session). A form posted with the cookie must carry the page's CSRF field.
The JSON API under ``/api/`` takes the header only. Pages hold no external asset (no script,
font or style from elsewhere: they work in an air-gapped cluster) and are sent with a
Content-Security-Policy that allows nothing else.
"""

from __future__ import annotations

import hashlib
import hmac
import html
import logging
from collections import defaultdict
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs

from aiohttp import web

from actions.operator import COMMANDS
from rocewatch.core.model import rfc3339

if TYPE_CHECKING:
    from actions.api import OperatorApi

log = logging.getLogger(__name__)

COOKIE = "rocewatch_session"
CSP = (
    "default-src 'none'; style-src 'unsafe-inline'; img-src data:; form-action 'self'; "
    "frame-ancestors 'none'; base-uri 'none'"
)

COLORS = {  # node kinds: fill, stroke (Grafana's node graph gets the same from the SQL)
    "origin": ("#fde0dc", "#d62728"),
    "victim": ("#fff1db", "#ff7f0e"),
    "relay": ("#eeeeee", "#7f7f7f"),
    "job": ("#dbeafe", "#1f77b4"),
    "host": ("#ede4f7", "#9467bd"),
    "end": ("#fde0dc", "#d62728"),
    "entity": ("#fff1db", "#ff7f0e"),
}
EDGE_COLORS = {"pauses": "#d62728", "runs": "#1f77b4", "cable": "#d62728", "hosts": "#9467bd"}


def _derived(token: str, purpose: str) -> str:
    return hmac.new(token.encode(), f"rocewatch:{purpose}".encode(), hashlib.sha256).hexdigest()


def install(api: OperatorApi, app: web.Application) -> None:
    """Add the pages to the API's application."""
    pages = _Pages(api)
    r = app.router
    r.add_get("/", pages.root)
    r.add_get("/login", pages.login_form)
    r.add_post("/login", pages.login)
    r.add_post("/logout", pages.logout)
    r.add_get("/incidents", pages.list_page)
    r.add_get("/incidents/{id:\\d+}", pages.incident_page)
    r.add_get("/incidents/alert/{fp}/{starts:\\d+}", pages.for_alert)
    r.add_post("/incidents/{id:\\d+}/command", pages.command)
    r.add_get("/api/v1/incidents", pages.list_json)
    r.add_get("/api/v1/incidents/{id:\\d+}", pages.incident_json)
    api.public |= {"/login"}
    api.cookie_ok = pages.cookie_ok
    api.login_path = "/login"


class _Pages:
    def __init__(self, api: OperatorApi) -> None:
        self.api = api
        token = api.config.token or ""
        self.session = _derived(token, "session")
        self.csrf = _derived(token, "csrf")

    # --- authorisation -------------------------------------------------------------------------
    def cookie_ok(self, request: web.Request) -> bool:
        if request.path.startswith("/api/"):
            return False  # the JSON API takes the bearer token only
        got = request.cookies.get(COOKIE, "")
        return bool(got) and hmac.compare_digest(got.encode(), self.session.encode())

    def _csrf_ok(self, request: web.Request, form: dict[str, str]) -> bool:
        if request.headers.get("Authorization", "").startswith("Bearer "):
            return True  # not a browser's ambient credential
        got = str(form.get("csrf", ""))
        return hmac.compare_digest(got.encode(), self.csrf.encode())

    async def root(self, request: web.Request) -> web.StreamResponse:
        raise web.HTTPSeeOther("/incidents")

    async def login_form(self, request: web.Request) -> web.StreamResponse:
        return _page("Sign in", _login_body(request.query.get("next", ""), failed=False))

    async def _form(self, request: web.Request) -> dict[str, str]:
        """An urlencoded form, read within the API's body limits."""
        raw = await self.api.read_body(request)
        return {k: v[0] for k, v in parse_qs(raw.decode("utf-8", "replace")).items()}

    async def login(self, request: web.Request) -> web.StreamResponse:
        form = await self._form(request)
        token = str(form.get("token", ""))
        nxt = str(form.get("next", "")) or "/incidents"
        if not nxt.startswith("/") or nxt.startswith("//"):
            nxt = "/incidents"  # never a redirect off this site
        want = self.api.config.token or ""
        if not (want and hmac.compare_digest(token.encode(), want.encode())):
            log.warning("api: failed sign-in from %s", request.remote)
            return _page("Sign in", _login_body(nxt, failed=True), status=401)
        resp = web.HTTPSeeOther(nxt)
        resp.set_cookie(
            COOKIE, self.session, httponly=True, samesite="Strict",
            secure=self.api.scheme == "https", path="/", max_age=12 * 3600,
        )  # fmt: skip
        log.info("api: signed in from %s", request.remote)
        raise resp

    async def logout(self, request: web.Request) -> web.StreamResponse:
        resp = web.HTTPSeeOther("/login")
        resp.del_cookie(COOKIE, path="/")
        raise resp

    # --- pages ---------------------------------------------------------------------------------
    def _store(self) -> Any:
        if self.api.store is None:
            raise web.HTTPServiceUnavailable(reason="no store configured (storage.url)")
        return self.api.store

    async def list_page(self, request: web.Request) -> web.StreamResponse:
        store = self._store()
        incs = await self.api.run_blocking(store.incidents)
        return _page("Incidents", render_list(incs))

    async def incident_page(self, request: web.Request) -> web.StreamResponse:
        store = self._store()
        inc = await self.api.run_blocking(store.incident, int(request.match_info["id"]))
        if inc is None:
            return _page("No such incident", "<p>No such incident.</p>", status=404)
        try:
            pending = set(await self.api.pending_nodes())
        except web.HTTPException:
            pending = set()
        note = request.query.get("queued", "")
        return _page(inc["title"], render_incident(inc, pending, self.csrf, note))

    async def for_alert(self, request: web.Request) -> web.StreamResponse:
        store = self._store()
        fp, starts = request.match_info["fp"], int(request.match_info["starts"])
        iid = await self.api.run_blocking(store.incident_of_alert, fp, starts)
        if iid is None:
            iid = await self.api.run_blocking(store.incident_of_alert, fp)
        if iid is None:
            return _page("Not filed yet", "<p>This alert is not filed under an incident yet: "
                         "the store writes it within seconds.</p>", status=404)  # fmt: skip
        raise web.HTTPSeeOther(f"/incidents/{iid}")

    async def command(self, request: web.Request) -> web.StreamResponse:
        form = await self._form(request)
        if not self._csrf_ok(request, form):
            log.warning("api: command form without a valid CSRF field from %s", request.remote)
            raise web.HTTPForbidden(reason="the form's CSRF field is missing or wrong")
        command, node = form.get("command", ""), form.get("node", "")
        if command not in COMMANDS or not node or len(node) > 128:
            raise web.HTTPBadRequest(reason="command must be approve, reject or undrain, node set")
        iid = int(request.match_info["id"])
        row = await self.api.queue_command(command, node, f"page@{request.remote}")
        raise web.HTTPSeeOther(f"/incidents/{iid}?queued={row['id']}")

    async def list_json(self, request: web.Request) -> web.StreamResponse:
        return web.json_response(await self.api.run_blocking(self._store().incidents))

    async def incident_json(self, request: web.Request) -> web.StreamResponse:
        inc = await self.api.run_blocking(self._store().incident, int(request.match_info["id"]))
        if inc is None:
            raise web.HTTPNotFound(reason="no such incident")
        return web.json_response(inc)


# --- rendering (pure: data in, HTML out) ------------------------------------------------------
def _e(s: Any) -> str:
    return html.escape(str(s), quote=True)


def _t(ns: int | None) -> str:
    return rfc3339(ns) if ns else "-"


STYLE = """
body{font:14px/1.4 system-ui,sans-serif;margin:0;color:#222;background:#fafafa}
header{background:#263238;color:#fff;padding:8px 16px;display:flex;gap:16px;align-items:center}
header a{color:#fff} main{padding:16px} table{border-collapse:collapse;width:100%}
td,th{border-bottom:1px solid #ddd;padding:4px 8px;text-align:left;vertical-align:top}
.open{color:#d62728;font-weight:600} .resolved{color:#2ca02c}
.drain{border:1px solid #ff7f0e;background:#fff8ee;padding:8px;margin:8px 0}
button{padding:4px 12px;margin-right:6px} .note{background:#e8f5e9;padding:8px}
svg text{font:12px system-ui,sans-serif} pre{white-space:pre-wrap;margin:4px 0}
.graph{overflow:auto;border:1px solid #ddd;background:#fff}
"""


def _page(title: str, body: str, status: int = 200) -> web.Response:
    doc = (
        "<!DOCTYPE html><html lang=en><head><meta charset=utf-8>"
        f"<title>{_e(title)} - rocewatch</title><style>{STYLE}</style></head><body>"
        "<header><b>rocewatch</b><a href='/incidents'>incidents</a>"
        "<form method=post action='/logout' style='margin-left:auto'>"
        "<button>sign out</button></form></header>"
        f"<main>{body}</main></body></html>"
    )
    return web.Response(
        status=status, text=doc, content_type="text/html",
        headers={"Content-Security-Policy": CSP, "X-Frame-Options": "DENY",
                 "Referrer-Policy": "no-referrer", "Cache-Control": "no-store"},
    )  # fmt: skip


def _login_body(nxt: str, failed: bool) -> str:
    msg = "<p class=open>That token is not the API's.</p>" if failed else ""
    return (
        f"<h1>Sign in</h1>{msg}<form method=post action='/login'>"
        f"<input type=hidden name=next value='{_e(nxt)}'>"
        "<label>API token <input type=password name=token autocomplete=off></label> "
        "<button>sign in</button></form>"
        "<p>The token is <code>api.token</code> of the detector's configuration.</p>"
    )


def render_list(incs: list[dict[str, Any]]) -> str:
    if not incs:
        return "<h1>Incidents</h1><p>No incidents.</p>"
    rows = "".join(
        f"<tr class=incident data-id={i['id']}><td><a href='/incidents/{i['id']}'>#{i['id']}</a>"
        f"</td><td class={_e(i['status'])}>{_e(i['status'])}</td><td>{_e(i['kind'])}</td>"
        f"<td><a href='/incidents/{i['id']}'>{_e(i['title'])}</a></td>"
        f"<td>{_e(i['severity'])}</td><td>{_t(i['started_at'])}</td><td>{_t(i['ended_at'])}</td>"
        "</tr>"
        for i in incs
    )
    return (
        "<h1>Incidents</h1><table id=incidents><tr><th>#</th><th>status</th><th>kind</th>"
        f"<th>what</th><th>severity</th><th>started</th><th>ended</th></tr>{rows}</table>"
    )


def render_incident(inc: dict[str, Any], pending: set[str], csrf: str, note: str = "") -> str:
    iid = inc["id"]
    parts = [
        f"<h1 id=title>{_e(inc['title'])}</h1>",
        f"<p>#{iid} &middot; {_e(inc['kind'])} &middot; <span class={_e(inc['status'])} "
        f"id=status>{_e(inc['status'])}</span> &middot; started {_t(inc['started_at'])}"
        f" &middot; ended {_t(inc['ended_at'])}</p>",
    ]
    if note.isdigit():
        parts.append(f"<p class=note id=queued>command {int(note)} queued: the detector carries "
                     "it out within a poll; its result shows in the timeline.</p>")  # fmt: skip
    parts.append(_drains(inc, pending, csrf))
    parts.append("<h2>Pause graph</h2><div class=graph>" + svg_graph(inc) + "</div>")
    parts.append(_legend())
    parts.append("<h2>Timeline</h2>" + _timeline(inc))
    if inc["links"]:
        items = "".join(
            f"<li><a href='/incidents/{int(x['incident'])}'>{_e(x.get('title', ''))}</a></li>"
            for x in inc["links"]
            if isinstance(x, dict) and str(x.get("incident", "")).isdigit()
        )
        parts.append(f"<h2>Related</h2><ul id=links>{items}</ul>")
    return "".join(parts)


def _drains(inc: dict[str, Any], pending: set[str], csrf: str) -> str:
    """A waiting drain gets approve / reject; a drained node undrain."""
    last: dict[str, dict[str, Any]] = {}
    for t in inc["timeline"]:
        act = t["detail"].get("action") if t["kind"] == "action" else None
        if isinstance(act, dict) and act.get("node"):
            last[act["node"]] = act
    out = []
    buttons: tuple[str, ...]
    for node, act in sorted(last.items()):
        if node in pending:
            buttons, what = ("approve", "reject"), "waits for approval"
        elif act.get("action") == "drain" and act.get("outcome") == "done":
            buttons, what = ("undrain",), "drained by rocewatch"
        else:
            continue
        forms = "".join(
            f"<form method=post action='/incidents/{inc['id']}/command' style='display:inline'>"
            f"<input type=hidden name=csrf value='{csrf}'>"
            f"<input type=hidden name=command value='{b}'>"
            f"<input type=hidden name=node value='{_e(node)}'>"
            f"<button id='{b}-{_e(node)}' class={b}>{b} {_e(node)}</button></form>"
            for b in buttons
        )
        out.append(
            f"<div class=drain data-node='{_e(node)}'><b>drain of {_e(node)}</b> {what} "
            f"({_e(act.get('reason', ''))}) {forms}</div>"
        )
    return "".join(out)


def _legend() -> str:
    items = "".join(
        f"<span style='border:2px solid {s};background:{f};padding:0 6px;margin-right:6px'>"
        f"{k}</span>"
        for k, (f, s) in COLORS.items()
        if k not in ("end", "entity")
    )
    return f"<p>{items} edge thickness: pause share</p>"


def _timeline(inc: dict[str, Any]) -> str:
    rows = []
    for t in inc["timeline"]:
        detail = ""
        alert = t["detail"].get("alert") if isinstance(t["detail"], dict) else None
        if isinstance(alert, dict):
            ann = alert.get("annotations", {})
            labels = ", ".join(f"{k}={v}" for k, v in sorted(alert.get("labels", {}).items()))
            detail = (
                "<details class=evidence><summary>evidence</summary>"
                f"<pre>{_e(ann.get('evidence', ''))}</pre>"
                f"<pre>{_e(ann.get('description', ''))}</pre><pre>{_e(labels)}</pre></details>"
            )
        rows.append(
            f"<tr class='entry {_e(t['kind'])}'><td>{_t(t['time'])}</td><td>{_e(t['kind'])}</td>"
            f"<td>{_e(t['summary'])}{detail}</td></tr>"
        )
    return f"<table id=timeline><tr><th>time</th><th>what</th><th></th></tr>{''.join(rows)}</table>"


# --- the graph ----------------------------------------------------------------------------------
BOX_W, BOX_H, COL_W, ROW_H, PAD = 176, 46, 222, 56, 16


def layout(nodes: list[dict[str, Any]], edges: list[dict[str, Any]]) -> dict[str, tuple[int, int]]:
    """Columns by hops from the origin along the pause (and cable) edges; hosts beside what
    they host, jobs last; rows in each column by kind then name."""
    ids = {n["id"] for n in nodes}
    kind = {n["id"]: n["kind"] for n in nodes}
    out: dict[str, list[str]] = defaultdict(list)
    for e in edges:
        if e["kind"] in ("pauses", "cable") and e["source"] in ids and e["target"] in ids:
            out[e["source"]].append(e["target"])
    start = (
        sorted(i for i in ids if kind[i] == "origin")
        or sorted(i for i in ids if kind[i] == "end")[:1]
    )
    hosted = {e["target"] for e in edges if e["kind"] == "hosts"}
    first = 1 if hosted & set(start) else 0  # room for the host on the left
    col: dict[str, int] = {i: first for i in start}
    frontier = list(start)
    while frontier:
        nxt = []
        for s in frontier:
            for t in out[s]:
                if t not in col:
                    col[t] = col[s] + 1
                    nxt.append(t)
        frontier = nxt
    for e in edges:  # a host sits left of the NIC it hosts (the leftmost one)
        if e["kind"] == "hosts" and e["target"] in col and e["source"] not in start:
            c = max(0, col[e["target"]] - 1)
            col[e["source"]] = min(col.get(e["source"], c), c)
    deepest = max(col.values(), default=0)
    for i in ids:
        if i not in col:
            col[i] = {"job": deepest + 1, "host": 0}.get(kind[i], max(1, min(deepest, 1)))
    order = {"host": 0, "origin": 1, "end": 1, "relay": 2, "victim": 3, "entity": 3, "job": 4}
    by_col: dict[int, list[str]] = defaultdict(list)
    for i in sorted(ids, key=lambda i: (order.get(kind[i], 5), i)):
        by_col[col[i]].append(i)
    return {
        i: (PAD + c * COL_W, PAD + r * ROW_H)
        for c, members in by_col.items()
        for r, i in enumerate(members)
    }


def svg_graph(inc: dict[str, Any]) -> str:
    nodes, edges = inc["nodes"], inc["edges"]
    if not nodes:
        return "<p>No graph: the alerts named no entity.</p>"
    pos = layout(nodes, edges)
    w = max(x for x, _ in pos.values()) + BOX_W + PAD
    h = max(y for _, y in pos.values()) + BOX_H + PAD
    parts = [
        f"<svg id='graph' xmlns='http://www.w3.org/2000/svg' width='{w}' height='{h}' "
        f"viewBox='0 0 {w} {h}' role='img' aria-label='pause graph'><defs>"
    ]
    for k, c in EDGE_COLORS.items():
        parts.append(
            f"<marker id='arrow-{k}' viewBox='0 0 10 10' refX='10' refY='5' markerWidth='7' "
            f"markerHeight='7' orient='auto-start-reverse'><path d='M0,0L10,5L0,10z' "
            f"fill='{c}'></path></marker>"
        )
    parts.append("</defs>")
    for e in edges:
        if e["source"] not in pos or e["target"] not in pos:
            continue
        (x1, y1), (x2, y2) = pos[e["source"]], pos[e["target"]]
        sx, sy = (x1 + BOX_W, y1 + BOX_H // 2) if x2 > x1 else (x1 + BOX_W // 2, y1 + BOX_H)
        tx, ty = (x2, y2 + BOX_H // 2) if x2 > x1 else (x2 + BOX_W // 2, y2)
        if x2 == x1 and y2 < y1:
            sy, ty = y1, y2 + BOX_H
        share = e.get("share")
        width = 1 + 5 * float(share) if share is not None else 1.5
        color = EDGE_COLORS.get(e["kind"], "#999")
        dash = " stroke-dasharray='4 3'" if e["kind"] in ("runs", "hosts") else ""
        label = f"{e['kind']}" + (f" {float(share):.0%}" if share is not None else "")
        parts.append(
            f"<line class='edge {_e(e['kind'])}' data-source='{_e(e['source'])}' "
            f"data-target='{_e(e['target'])}' x1='{sx}' y1='{sy}' x2='{tx}' y2='{ty}' "
            f"stroke='{color}' stroke-width='{width:.1f}'{dash} "
            f"marker-end='url(#arrow-{_e(e['kind'])})'><title>{_e(label)}</title></line>"
        )
    for n in nodes:
        x, y = pos[n["id"]]
        fill, stroke = COLORS.get(n["kind"], ("#fff", "#999"))
        sub = n["subtitle"]
        if n["share"] is not None:
            sub = f"{sub} · paused {float(n['share']):.1%}" if sub else f"{float(n['share']):.1%}"
        pending = n["kind"] == "host" and "pending" in sub
        dash = " stroke-dasharray='6 3'" if pending else ""
        thick = 3 if n["kind"] in ("origin", "host") else 1.5
        tip = [n["id"]]
        if n["first_paused"]:
            tip.append(f"first paused {_t(n['first_paused'])}")
        tip += [f"{k}: {_detail(v)}" for k, v in sorted(n["detail"].items())]
        parts.append(
            f"<g class='node {_e(n['kind'])}' data-id='{_e(n['id'])}' data-kind='{_e(n['kind'])}'>"
            f"<rect x='{x}' y='{y}' width='{BOX_W}' height='{BOX_H}' rx='6' fill='{fill}' "
            f"stroke='{stroke}' stroke-width='{thick}'{dash}></rect>"
            f"<text x='{x + 8}' y='{y + 18}' font-weight='600'>{_e(_cut(n['title'], 24))}</text>"
            f"<text x='{x + 8}' y='{y + 36}' fill='#555'>{_e(_cut(sub, 26))}</text>"
            f"<title>{_e(chr(10).join(tip))}</title></g>"
        )
    parts.append("</svg>")
    return "".join(parts)


def _detail(v: Any) -> str:
    return ", ".join(map(str, v)) if isinstance(v, list) else str(v)


def _cut(s: str, n: int) -> str:
    return s if len(s) <= n else s[: n - 1] + "…"


__all__ = ["install", "render_incident", "render_list", "svg_graph"]
