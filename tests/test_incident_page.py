"""The incident pages in a real browser: Debian's headless Chromium, driven over the DevTools
protocol, opens the pages of a replayed scenario (a NIC-originated PFC storm, a flaky cable and
a PCIe straggler, the golden `storm` case) served by the operator API, and the test reads the
DOM Chromium rendered. Screenshots are saved to ``$ROCEWATCH_TEST_ARTIFACTS`` (default
``build/test-artifacts``) for a person to look at.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from actions import DrainPolicy, PolicyConfig
from actions.api import ApiConfig, OperatorApi
from actions.operator import apply_pending
from rocewatch.config import Config
from rocewatch.core.model import Alert
from rocewatch.core.topology import Topology
from rocewatch.replay import replay
from storage import Store

if TYPE_CHECKING:
    from tests.conftest import SimCache

pytestmark = pytest.mark.slow  # a replay and a browser

CHROMIUM = "/usr/bin/chromium"
TOKEN = "page-operator-token-0123456"
ARTIFACTS = Path(os.environ.get("ROCEWATCH_TEST_ARTIFACTS", Path(__file__).parents[1] / "build"
                                / "test-artifacts"))  # fmt: skip


class Recorder:
    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []

    def drain(self, node: str, scheduler: str, reason: str) -> str:
        self.calls.append(("drain", node))
        return "done"

    def resume(self, node: str, scheduler: str) -> str:
        self.calls.append(("resume", node))
        return "done"


class Browser:
    """Headless Chromium over the DevTools protocol (one page, one websocket)."""

    def __init__(self, profile: Path) -> None:
        import websocket  # websocket-client (a dependency of the kubernetes client)

        self.proc = subprocess.Popen(
            [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu",
             "--disable-background-networking", "--no-first-run", "--no-default-browser-check",
             "--disable-dev-shm-usage", f"--user-data-dir={profile}",
             "--remote-debugging-address=127.0.0.1", "--remote-debugging-port=0",
             "--window-size=1400,1000", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        port_file = profile / "DevToolsActivePort"
        deadline = time.monotonic() + 30
        while not port_file.exists() or not port_file.read_text().strip():
            assert self.proc.poll() is None, "chromium exited"
            assert time.monotonic() < deadline, "chromium did not open its DevTools port"
            time.sleep(0.1)
        port = int(port_file.read_text().split()[0])
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10) as r:
            pages = [t for t in json.loads(r.read()) if t["type"] == "page"]
        self.ws = websocket.create_connection(
            pages[0]["webSocketDebuggerUrl"], timeout=30, suppress_origin=True
        )
        self.ids = 0
        self.events: list[dict[str, Any]] = []
        self.call("Page.enable")
        self.call("Runtime.enable")

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        self.ids += 1
        me = self.ids
        self.ws.send(json.dumps({"id": me, "method": method, "params": params}))
        while True:
            msg = json.loads(self.ws.recv())
            if msg.get("id") == me:
                assert "error" not in msg, msg
                return dict(msg.get("result", {}))
            self.events.append(msg)

    def wait_load(self) -> None:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if any(e.get("method") == "Page.loadEventFired" for e in self.events):
                self.events.clear()
                return
            self.events.append(json.loads(self.ws.recv()))
        raise AssertionError("the page did not load")

    def goto(self, url: str) -> None:
        self.events.clear()
        self.call("Page.navigate", url=url)
        self.wait_load()

    def js(self, expr: str) -> Any:
        r = self.call("Runtime.evaluate", expression=expr, returnByValue=True)
        assert "exceptionDetails" not in r, r
        return r["result"].get("value")

    def act(self, expr: str) -> None:
        """Run something that navigates (a click, a submit) and wait for the new page."""
        self.events.clear()
        self.js(expr)
        self.wait_load()

    def screenshot(self, name: str) -> Path:
        import base64

        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        self.call("Emulation.setDeviceMetricsOverride", width=1400, height=1000,
                  deviceScaleFactor=1, mobile=False)  # fmt: skip
        data = self.call("Page.captureScreenshot", format="png", captureBeyondViewport=True)
        out = ARTIFACTS / name
        out.write_bytes(base64.b64decode(data["data"]))
        return out

    def close(self) -> None:
        self.ws.close()
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)


@pytest.fixture(scope="module")
def replayed(
    recordings: SimCache, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Store, Path]]:
    scenario = recordings.scenario("default", 8, 20, 5)  # tests/golden/storm
    d = tmp_path_factory.mktemp("incident-page")
    store = Store(f"sqlite:///{d}/rocewatch.db")
    store.create_schema()
    cfg = Config(policy=dataclasses.replace(PolicyConfig(), mode="approval"))
    replay(scenario, d / "out", cfg, store=store)
    yield store, scenario
    store.close()


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[Browser]:
    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} missing: bash scripts/services.sh install")
    b = Browser(tmp_path / "profile")
    try:
        yield b
    finally:
        b.close()
        shutil.rmtree(tmp_path / "profile", ignore_errors=True)


@pytest.fixture
def api(replayed: tuple[Store, Path]) -> Iterator[OperatorApi]:
    srv = OperatorApi(ApiConfig(listen="127.0.0.1:0", token=TOKEN), replayed[0], replayed[0])
    srv.start()
    try:
        yield srv
    finally:
        srv.close()


GRAPH = """JSON.stringify([...document.querySelectorAll('#graph g.node')].map(
  g => [g.dataset.id, g.dataset.kind, g.querySelector('text').textContent]))"""
EDGES = """JSON.stringify([...document.querySelectorAll('#graph line.edge')].map(
  l => [l.dataset.source, l.dataset.target, l.getAttribute('class')]))"""
TIMELINE = """JSON.stringify([...document.querySelectorAll('#timeline tr.entry')].map(
  r => [...r.querySelectorAll('td')].slice(1, 3).map(td => td.textContent)))"""


def test_a_replayed_storm_in_the_browser(
    replayed: tuple[Store, Path], api: OperatorApi, browser: Browser
) -> None:
    store, scenario = replayed
    truth = json.loads((scenario / "truth.json").read_text())
    (fault,) = [f for f in truth["faults"] if f["alertname"] == "PFCStorm"]
    storm = next(i for i in store.incidents() if i["kind"] == "storm")
    origin = storm["labels"]["node"] + "/" + storm["labels"]["nic"]
    # the simulator's own ground truth says where the storm began and whom it paused
    assert origin == f"{fault['labels']['node']}/{fault['labels']['nic']}"
    truth_victims = {
        f"nic:{v['node']}/{v['nic']}" if "node" in v else f"switch:{v['switch']}"
        for v in fault["victims"]
    }

    # a browser without a session is sent to sign in, and comes back with one
    browser.goto(f"{api.url}/incidents/{storm['id']}")
    assert browser.js("location.pathname") == "/login"
    browser.act("""document.querySelector('input[name=token]').value = 'wrong-token-123456';
                   document.querySelector('form[action="/login"]').submit()""")
    assert "not the API's" in browser.js("document.body.textContent")
    browser.act(f"""document.querySelector('input[name=token]').value = '{TOKEN}';
                    document.querySelector('form[action="/login"]').submit()""")
    assert browser.js("location.pathname") == f"/incidents/{storm['id']}"
    assert browser.js("document.cookie") == ""  # HttpOnly: no script reads the session

    # the pause graph: the origin, its victims, the job behind it, the node waiting to drain
    nodes = {i: (k, t) for i, k, t in json.loads(browser.js(GRAPH))}
    assert nodes[f"nic:{origin}"][0] == "origin"
    victims = {i for i, (k, _) in nodes.items() if k == "victim"}
    assert truth_victims <= victims and f"nic:{origin}" not in victims
    assert f"job:{storm['labels']['job']}" in nodes
    host = f"host:{storm['labels']['node']}"
    assert nodes[host][0] == "host"
    edges = json.loads(browser.js(EDGES))
    first_hop = {t for s, t, c in edges if s == f"nic:{origin}" and "pauses" in c}
    assert first_hop and first_hop <= victims
    assert (host, f"nic:{origin}") in {(s, t) for s, t, _ in edges}
    text = browser.js("document.getElementById('graph').textContent")
    assert "paused 99" in text  # the origin's pause share, from the evidence

    # the timeline: both alerts firing and resolving, the drain waiting; evidence per alert
    timeline = json.loads(browser.js(TIMELINE))
    kinds = [k for k, _ in timeline]
    assert kinds.count("firing") == 2 and kinds.count("resolved") == 2, timeline
    assert ["action", f"drain {storm['labels']['node']}: pending-approval"] in timeline
    # evidence for each alert filed: the two paged, and the storm's symptoms it inhibited (the
    # congestion on the ports it pauses, the origin's silence)
    inhibited = kinds.count("inhibited")
    assert inhibited >= 1, timeline
    assert browser.js("document.querySelectorAll('details.evidence').length") == 2 + inhibited
    assert "sent pause" in browser.js("document.querySelector('details.evidence pre').textContent")
    shot = browser.screenshot("incident-storm.png")
    assert shot.stat().st_size > 10_000

    # approve: the command goes the operator path, the detector carries it out
    node = storm["labels"]["node"]
    assert browser.js(f"!!document.getElementById('approve-{node}')")
    browser.act(f"document.getElementById('approve-{node}').click()")
    assert browser.js("!!document.getElementById('queued')")
    (cmd,) = store.commands()
    assert (cmd["command"], cmd["node"], cmd["status"]) == ("approve", node, "pending")
    assert cmd["requested_by"] == "page@127.0.0.1"
    topology = Topology.load(scenario / "topology.yaml")
    ex = Recorder()
    policy = DrainPolicy(PolicyConfig(mode="approval"), topology, ex)  # the detect stage's
    alert = next(a for a in store.alerts() if a.fingerprint == storm_fp(store, storm["id"]))
    policy.on_alert(Alert(alert.labels, alert.annotations, alert.starts_at, 0), alert.starts_at)
    store.write_actions(policy.tick(alert.starts_at + 3 * 10**9)[0])
    assert apply_pending(policy, [store]) == 1
    store.write_actions(policy.tick(policy.now)[0])  # the approved drain, carried out
    assert ex.calls == [("drain", node)]
    browser.goto(f"{api.url}/incidents/{storm['id']}")
    timeline = json.loads(browser.js(TIMELINE))
    assert ["command", f"approve {node} by page@127.0.0.1: done: drain of {node} approved"] in (
        timeline
    )
    assert browser.js(f"!!document.getElementById('undrain-{node}')")  # drained: undrain now
    assert not browser.js(f"!!document.getElementById('approve-{node}')")
    browser.screenshot("incident-storm-approved.png")

    # a form posted with the session cookie but without the page's CSRF field is refused
    browser.act(f"""const f = document.createElement('form');
        f.method = 'post'; f.action = '/incidents/{storm["id"]}/command';
        for (const [k, v] of [['command', 'undrain'], ['node', '{node}']]) {{
            const i = document.createElement('input'); i.name = k; i.value = v; f.append(i); }}
        document.body.append(f); f.submit()""")
    assert "CSRF" in browser.js("document.body.textContent")
    assert len(store.commands()) == 1


def storm_fp(store: Store, iid: int) -> str:
    inc = store.incident(iid)
    assert inc is not None
    return next(
        t["ref"]
        for t in inc["timeline"]
        if t["kind"] == "firing" and t["detail"]["alert"]["labels"].get("role") == "origin"
    )


def test_flaky_link_straggler_and_list_pages_render(
    replayed: tuple[Store, Path], api: OperatorApi, browser: Browser
) -> None:
    store, _ = replayed
    browser.goto(f"{api.url}/login")
    browser.act(f"""document.querySelector('input[name=token]').value = '{TOKEN}';
                    document.querySelector('form[action="/login"]').submit()""")
    assert browser.js("location.pathname") == "/incidents"
    rows = json.loads(
        browser.js("""JSON.stringify([...document.querySelectorAll(
        '#incidents tr.incident')].map(r => [...r.querySelectorAll('td')].map(
        td => td.textContent)))""")
    )
    incs = store.incidents()
    assert len(rows) == len(incs) and {r[2] for r in rows} >= {"storm", "flaky_link", "straggler"}
    assert [r[1] for r in rows] == sorted((r[1] for r in rows), key=lambda s: s != "open")
    browser.screenshot("incident-list.png")

    flaky = next(i for i in incs if i["kind"] == "flaky_link")
    browser.goto(f"{api.url}/incidents/{flaky['id']}")
    nodes = {i: k for i, k, _ in json.loads(browser.js(GRAPH))}
    cable = f"{flaky['labels']['node']}/{flaky['labels']['nic']}"
    port = f"{flaky['labels']['switch']}/{flaky['labels']['port']}"
    assert nodes[f"nic:{cable}"] == "end" and nodes[f"port:{port}"] == "end"
    assert [f"nic:{cable}", f"port:{port}", "edge cable"] in json.loads(browser.js(EDGES))
    assert browser.js("document.getElementById('title').textContent") == (
        f"Flaky link {cable} <-> {port}"
    )
    browser.screenshot("incident-flaky-link.png")

    straggler = next(i for i in incs if i["kind"] == "straggler")
    browser.goto(f"{api.url}/incidents/{straggler['id']}")
    nodes = {i: k for i, k, _ in json.loads(browser.js(GRAPH))}
    nic = f"{straggler['labels']['node']}/{straggler['labels']['nic']}"
    assert nodes[f"nic:{nic}"] == "origin" and nodes[f"job:{straggler['labels']['job']}"] == "job"
    timeline = json.loads(browser.js(TIMELINE))
    assert any("PCIe" in s for _, s in timeline) and any("slower" in s for _, s in timeline)
    browser.screenshot("incident-straggler.png")
