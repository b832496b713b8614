"""The incident pages' way in and what they never do: the session cookie, the bearer token,
redirects, escaping of what alerts say, the notification link's redirect (real sockets)."""

from __future__ import annotations

import http.client
import json
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlencode

import pytest

from actions.api import ApiConfig, OperatorApi
from actions.incident_page import COOKIE
from actions.operator import MemoryCommands
from rocewatch.core.model import Alert
from storage import Store
from storage.outbox import incident_link

TOKEN = "page-operator-token-0123456"
T0 = 1_795_946_400_000_000_000


@pytest.fixture
def srv(tmp_path: Path) -> Iterator[OperatorApi]:
    store = Store(f"sqlite:///{tmp_path}/pages.db")
    store.create_schema()
    api = OperatorApi(ApiConfig(listen="127.0.0.1:0", token=TOKEN), MemoryCommands(), store)
    api.start()
    try:
        yield api
    finally:
        api.close()
        store.close()


def req(
    srv: OperatorApi, method: str, path: str, body: str | None = None, **headers: str
) -> http.client.HTTPResponse:
    c = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=10)
    h = dict(headers)
    if body is not None:
        h["Content-Type"] = "application/x-www-form-urlencoded"
    c.request(method, path, body, {k.replace("_", "-"): v for k, v in h.items()})
    r = c.getresponse()
    r.read()
    c.close()
    return r


def get_text(srv: OperatorApi, path: str, **headers: str) -> tuple[int, str]:
    c = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=10)
    c.request("GET", path, headers={k.replace("_", "-"): v for k, v in headers.items()})
    r = c.getresponse()
    out = r.status, r.read().decode()
    c.close()
    return out


def test_sign_in_sets_an_httponly_session_that_is_not_the_token(srv: OperatorApi) -> None:
    r = req(srv, "GET", "/incidents/3")
    assert r.status == 303 and r.getheader("Location") == "/login?next=/incidents/3"
    assert req(srv, "GET", "/login").status == 200  # the form needs no token
    bad = req(srv, "POST", "/login", urlencode({"token": "nope-nope-nope-nope"}))
    assert bad.status == 401 and bad.getheader("Set-Cookie") is None
    ok = req(srv, "POST", "/login", urlencode({"token": TOKEN, "next": "//evil.example/x"}))
    assert ok.status == 303 and ok.getheader("Location") == "/incidents"  # never off-site
    cookie = ok.getheader("Set-Cookie") or ""
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie and TOKEN not in cookie
    session = cookie.split(";", 1)[0]
    assert session.startswith(f"{COOKIE}=")
    code, page = get_text(srv, "/incidents", Cookie=session)
    assert code == 200 and "No incidents." in page
    # the JSON API takes the bearer token only: a browser's ambient cookie gets nothing there
    assert req(srv, "GET", "/api/v1/incidents", Cookie=session).status == 401
    assert req(srv, "GET", "/api/v1/incidents", Authorization=f"Bearer {TOKEN}").status == 200
    r = req(srv, "GET", "/incidents", Cookie=f"{COOKIE}=forged")
    assert r.status == 303  # to the sign-in form


def test_what_alerts_say_is_escaped_and_the_page_loads_nothing_from_elsewhere(
    srv: OperatorApi,
) -> None:
    assert srv.store is not None
    evil = Alert(
        {"alertname": "PortAnomaly", "severity": "warning", "switch": "leaf-0",
         "port": "<img src=x onerror=alert(1)>"},
        {"summary": "<script>alert(1)</script>", "evidence": "</pre><script>x()</script>"},
        T0,
    )  # fmt: skip
    srv.store.write_alerts([evil])
    (inc,) = srv.store.incidents()
    code, page = get_text(srv, f"/incidents/{inc['id']}", Authorization=f"Bearer {TOKEN}")
    assert code == 200
    assert "<script" not in page and "<img" not in page and "&lt;script&gt;" in page
    assert "src=" not in page.replace("&lt;img src=x", "")  # no external asset of any kind
    r = req(srv, "GET", f"/incidents/{inc['id']}", Authorization=f"Bearer {TOKEN}")
    assert "default-src 'none'" in (r.getheader("Content-Security-Policy") or "")
    # a notification's generatorURL leads to the incident page
    link = incident_link(srv.url, evil).removeprefix(srv.url)
    r = req(srv, "GET", link, Authorization=f"Bearer {TOKEN}")
    assert r.status == 303 and r.getheader("Location") == f"/incidents/{inc['id']}"
    assert req(srv, "GET", "/incidents/alert/nope/1", Authorization=f"Bearer {TOKEN}").status == 404
    code, body = get_text(srv, f"/api/v1/incidents/{inc['id']}", Authorization=f"Bearer {TOKEN}")
    assert code == 200 and json.loads(body)["title"] == "<script>alert(1)</script>"


def test_a_command_form_needs_the_csrf_field_with_the_cookie(srv: OperatorApi) -> None:
    ok = req(srv, "POST", "/login", urlencode({"token": TOKEN}))
    session = (ok.getheader("Set-Cookie") or "").split(";", 1)[0]
    form = urlencode({"command": "approve", "node": "gpu-01"})
    assert req(srv, "POST", "/incidents/1/command", form, Cookie=session).status == 403
    assert srv.queue.commands() == []
    r = req(srv, "POST", "/incidents/1/command", form, Authorization=f"Bearer {TOKEN}")
    assert r.status == 303 and r.getheader("Location") == "/incidents/1?queued=1"
    (cmd,) = srv.queue.commands()
    assert (cmd["command"], cmd["node"], cmd["status"]) == ("approve", "gpu-01", "pending")
    bad = urlencode({"command": "drain", "node": "gpu-01"})
    assert req(
        srv, "POST", "/incidents/1/command", bad, Authorization=f"Bearer {TOKEN}"
    ).status == (400)
