"""Alert delivery by signed webhook from the durable outbox, against a real HTTP receiver."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from rocewatch.core.errors import ConfigError
from rocewatch.core.model import Alert
from rocewatch.notify.base import (
    DELIVERY_HEADER,
    SIGNATURE_HEADER,
    TIMESTAMP_HEADER,
    RetryConfig,
    WebhookConfig,
)
from rocewatch.notify.dispatcher import Dispatcher
from rocewatch.notify.signing import verify
from rocewatch.notify.webhook import WebhookNotifier
from storage.outbox import Outbox
from storage.store import Store
from tests.notify_receiver import Received, Receiver, free_port

if TYPE_CHECKING:
    from tests.conftest import SimCache  # the session's recordings fixture

SECRET = "test-hmac-secret-4f9a"
T0 = 1_795_946_400_000_000_000
S = 1_000_000_000


def alert(i: int, ends: int = 0, name: str = "FlakyLink") -> Alert:
    return Alert(
        {"alertname": name, "severity": "warning", "switch": "leaf-0", "port": f"Ethernet{i}"},
        {"summary": f"port {i}"},
        T0 + i * S,
        ends_at=ends,
    )


def events(req: Received) -> list[tuple[str, str, str]]:
    return [(a["fingerprint"], a["startsAt"], a["status"]) for a in req.json()["alerts"]]


def check_signed(req: Received, secret: str = SECRET) -> None:
    h = {k.lower(): v for k, v in req.headers.items()}
    assert verify(
        secret.encode(), req.body, h[TIMESTAMP_HEADER.lower()], h[SIGNATURE_HEADER.lower()]
    ), "bad signature"
    assert h[DELIVERY_HEADER.lower()]


def make(tmp_path: Path, port: int, **retry: Any) -> tuple[Dispatcher, Store]:
    store = Store(f"sqlite:///{tmp_path / 'outbox.db'}")
    store.create_schema()
    sink = WebhookNotifier(
        WebhookConfig(name="ops", url=f"http://127.0.0.1:{port}/hook", secret=SECRET, timeout_s=2)
    )
    r = RetryConfig(**{"initial_s": 0.05, "max_s": 0.2, "jitter": 0.0, **retry})
    return Dispatcher(Outbox(store), [sink], r, poll_s=0.05), store


def test_payload_is_alertmanager_v4_and_signed(tmp_path: Path) -> None:
    rx = Receiver(free_port()).start()
    d, store = make(tmp_path, rx.port)
    try:
        a, b = alert(1), alert(2, ends=T0 + 9 * S)
        d.enqueue([a, b, alert(3, name="Straggler")])
        assert d.drain(10)
    finally:
        rx.stop()
        store.close()
    assert len(rx.requests) == 2  # one request per alertname group
    by_group = {r.json()["groupLabels"]["alertname"]: r for r in rx.requests}
    body = by_group["FlakyLink"].json()
    assert body["version"] == "4"
    assert body["status"] == "firing"
    assert body["receiver"] == "rocewatch"
    assert body["groupKey"] == '{}:{alertname="FlakyLink"}'
    assert body["commonLabels"] == {
        "alertname": "FlakyLink",
        "severity": "warning",
        "switch": "leaf-0",
    }
    assert body["truncatedAlerts"] == 0
    assert body["alerts"] == [a.to_json(), b.to_json()]
    for r in rx.requests:
        assert r.path == "/hook"
        check_signed(r)
        assert not verify(
            b"wrong", r.body, r.headers[TIMESTAMP_HEADER], r.headers[SIGNATURE_HEADER]
        )


def test_resolved_notification_follows_firing(tmp_path: Path) -> None:
    rx = Receiver(free_port()).start()
    d, store = make(tmp_path, rx.port)
    try:
        d.enqueue([alert(1)])
        assert d.drain(10)
        d.enqueue([alert(1), alert(1, ends=T0 + 5 * S)])  # the firing re-sent is not doubled
        assert d.drain(10)
    finally:
        rx.stop()
        store.close()
    got = [e for r in rx.requests for e in events(r)]
    assert [s for _, _, s in got] == ["firing", "resolved"]
    assert rx.requests[1].json()["status"] == "resolved"
    assert rx.requests[1].json()["alerts"][0]["endsAt"] == "2026-11-29T10:00:05.000Z"


def test_5xx_is_retried_with_backoff_4xx_is_dead(tmp_path: Path) -> None:
    rx = Receiver(free_port(), statuses=[503, 503]).start()
    d, store = make(tmp_path, rx.port)
    try:
        d.enqueue([alert(1)])
        assert d.drain(10)
        assert d.failures["ops"] == 2 and d.sent["ops"] == 1
        rx.statuses = [400]
        d.enqueue([alert(2)])
        assert d.drain(5)  # nothing pending: the refused event is dead, not retried
        assert d.dead["ops"] == 1
        assert d.outbox.dead_count() == 1
        n = len(rx.requests)
        d.run_once()
        assert len(rx.requests) == n
    finally:
        rx.stop()
        store.close()
    assert [events(r)[0][2] for r in rx.requests] == ["firing"] * 4


def test_backoff_is_exponential_and_capped() -> None:
    r = RetryConfig(initial_s=1, max_s=30, multiplier=2, jitter=0)
    assert [r.delay(n) for n in range(1, 8)] == [1, 2, 4, 8, 16, 30, 30]
    j = RetryConfig(initial_s=10, max_s=10, jitter=0.1)
    assert j.delay(3, 0.0) == pytest.approx(9) and j.delay(3, 0.999) == pytest.approx(11, 1e-3)


def test_secret_is_required_and_never_logged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with pytest.raises(ConfigError, match="secret"):
        WebhookNotifier(WebhookConfig(name="x", url="http://127.0.0.1:1/"))
    cfg = WebhookConfig(name="x", url="http://u:pw@127.0.0.1:1/?token=t", secret=SECRET)
    assert SECRET not in repr(cfg)
    caplog.set_level(logging.DEBUG)
    port = free_port()  # nobody listens
    d, store = make(tmp_path, port)
    d.enqueue([alert(1)])
    assert not d.drain(0.3)
    store.close()
    assert d.failures["ops"] >= 1
    assert "connection refused" in caplog.text.lower()
    assert SECRET not in caplog.text


# --- the outage tests: a receiver down for 60 s on an injected clock; real processes -------------


@pytest.mark.slow
def test_receiver_down_60s_on_the_outbox_clock_gets_every_event_once(tmp_path: Path) -> None:
    """A receiver away for a minute (the outbox's clock moved, not waited for): the sender
    keeps trying at the capped backoff all along, gives up on nothing, and once the receiver
    is back delivers every event once, within one backoff."""
    now = [1_000.0]
    store = Store(f"sqlite:///{tmp_path / 'outbox.db'}")
    store.create_schema()
    port = free_port()  # nobody listens for the first 60 s
    sink = WebhookNotifier(
        WebhookConfig(name="ops", url=f"http://127.0.0.1:{port}/hook", secret=SECRET, timeout_s=2)
    )
    retry = RetryConfig(initial_s=0.5, max_s=4.0)
    step = 0.5  # the clock moves by this much between passes
    d = Dispatcher(Outbox(store, clock=lambda: now[0]), [sink], retry, poll_s=step)
    sent = [alert(i) for i in range(30)] + [alert(i, ends=T0 + 40 * S) for i in range(0, 30, 3)]
    d.enqueue(sent)
    tries: list[float] = []  # outbox time of each failed request
    rx = Receiver(port)
    try:
        down_at = now[0]
        while now[0] - down_at < 60:
            before = d.failures["ops"]
            assert d.run_once() == 0
            tries += [now[0]] * (d.failures["ops"] - before)
            now[0] += step
        rx.start()
        up_at = now[0]
        while d.depth() and now[0] - up_at < 10:
            d.run_once()
            now[0] += step
        delivered_at = now[0]
    finally:
        rx.stop()
        store.close()
    # it tried through the whole outage, never more than one capped backoff (+ jitter) apart
    gaps = [b - a for a, b in zip([down_at, *tries], [*tries, up_at], strict=True)]
    assert len(tries) >= 60 / (4.0 * 1.1) and max(gaps) <= 4.0 * 1.1 + step, gaps
    assert not d.dead["ops"]
    assert delivered_at - up_at <= 4.0 * 1.1 + 2 * step
    got: Counter[tuple[str, str, str]] = Counter()
    for req in rx.requests:
        check_signed(req)
        got.update(events(req))
    want = Counter((a.fingerprint, a.to_json()["startsAt"], a.status) for a in sent)
    assert got == want and max(got.values()) == 1


@pytest.fixture
def scenario(recordings: SimCache) -> Path:
    # the golden storm recording, simulated once per run (tests/conftest.py): 12 alerts, 4 of
    # them resolved, in an 8-node replay that takes half the 16-node one's time
    return recordings.scenario("default", 8, 20.0, 5)


def rocewatch(*args: str, env: dict[str, str]) -> list[str]:
    return [sys.executable, "-m", "rocewatch.cli", *args]


def wait_for_log(
    path: Path, needle: str, times: int, proc: subprocess.Popen[Any], timeout: float = 60
) -> None:
    """Until ``needle`` shows ``times`` times in ``path`` (the process still running)."""
    deadline = time.monotonic() + timeout
    while path.read_text(errors="replace").count(needle) < times:
        assert proc.poll() is None, path.read_text()[-3000:]
        assert time.monotonic() < deadline, f"{needle!r} not {times}x: {path.read_text()[-3000:]}"
        time.sleep(0.1)


@pytest.mark.slow  # a replay and three senders, each its own process
def test_receiver_down_across_sender_restarts_gets_every_alert_exactly_once(
    scenario: Path, tmp_path: Path
) -> None:
    """Real processes: a replay queues its alerts while the receiver is down and exits with
    them pending; a sender retries and is stopped; a new one delivers once the receiver is up;
    a third finds nothing left. (The long outage is the test above, on the outbox's clock.)"""
    port = free_port()
    state = tmp_path / "state"
    cfg = tmp_path / "rocewatch.yaml"
    cfg.write_text(
        f"""
state_dir: {state}
notify:
  drain_timeout_s: 1
  poll_s: 0.1
  retry: {{initial_s: 0.2, max_s: 1}}
  webhooks:
    - name: ops
      url: http://127.0.0.1:{port}/alerts
      secret: ${{RW_TEST_WEBHOOK_SECRET}}
      timeout_s: 5
"""
    )
    # (a backoff capped at 1 s: each sender's retries come within a second, not four; the
    # capped backoff over a long outage is the test above's)
    env = {**os.environ, "RW_TEST_WEBHOOK_SECRET": SECRET}
    out = tmp_path / "out"
    # 1. replay while the receiver is down: it queues everything and exits with it pending
    r = subprocess.run(
        rocewatch("replay", str(scenario), "--out", str(out), "--config", str(cfg), env=env),
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    assert "still undelivered" in r.stderr
    # 2. a sender retries (twice at least), then is stopped (a restart)
    logs = tmp_path / "notify-a.log"
    with logs.open("w") as fh:
        a = subprocess.Popen(
            rocewatch("notify", "--config", str(cfg), env=env), env=env, stdout=fh, stderr=fh
        )
    try:
        wait_for_log(logs, "not delivered", 2, a)
    finally:
        a.send_signal(signal.SIGTERM)
        assert a.wait(timeout=30) == 0
    # 3. a new sender; the receiver comes up once it has failed too
    logs_b = tmp_path / "notify-b.log"
    rx = Receiver(port)
    with logs_b.open("w") as fh:
        b = subprocess.Popen(
            rocewatch("notify", "--config", str(cfg), "--max-idle", "2", env=env),
            env=env,
            stdout=fh,
            stderr=fh,
        )
    try:
        wait_for_log(logs_b, "not delivered", 1, b)
        rx.start()
        assert b.wait(timeout=60) == 0
        # 4. the happy path sends nothing twice: another sender finds nothing to do
        c = subprocess.run(
            rocewatch("notify", "--config", str(cfg), "--max-idle", "0.5", env=env),
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert c.returncode == 0, c.stderr
    finally:
        if b.poll() is None:
            b.kill()
        rx.stop()
    text = r.stderr + logs.read_text() + logs_b.read_text() + c.stderr
    assert "Connection refused" in text
    assert SECRET not in text

    finals = [json.loads(line) for line in (out / "alerts.jsonl").read_text().splitlines()]
    want = Counter((a["fingerprint"], a["startsAt"], "firing") for a in finals)
    want += Counter(
        (a["fingerprint"], a["startsAt"], "resolved") for a in finals if a["status"] == "resolved"
    )
    # (a storm's victims are one alert: tests/test_grouping.py)
    assert len(finals) > 8 and any(a["status"] == "resolved" for a in finals)
    got: Counter[tuple[str, str, str]] = Counter()
    for req in rx.requests:
        check_signed(req)
        assert req.json()["version"] == "4"
        got.update(events(req))
    assert max(got.values()) == 1, [k for k, n in got.items() if n > 1][:5]
    assert got == want
    # the resolved notification carries the alert's final state
    final_by_key = {(a["fingerprint"], a["startsAt"], a["status"]): a for a in finals}
    sent = {
        (a["fingerprint"], a["startsAt"], a["status"]): a
        for req in rx.requests
        for a in req.json()["alerts"]
    }
    for k, a in final_by_key.items():
        assert sent[k]["endsAt"] == a["endsAt"]


def test_outbox_refreshes_firing_until_resolved(tmp_path: Path) -> None:
    now = [1000.0]
    store = Store(f"sqlite:///{tmp_path / 'o.db'}")
    store.create_schema()
    ob = Outbox(store, clock=lambda: now[0])
    ob.enqueue([alert(1)], ["am"])
    (item,) = ob.claim("am", 10, lease_s=30)
    ob.delivered([item], refresh_s=60)
    assert ob.depth() == {}
    now[0] += 30
    assert ob.claim("am", 10, lease_s=30) == []
    now[0] += 31
    (again,) = ob.claim("am", 10, lease_s=30)
    assert again.refresh and again.alert["status"] == "firing"
    ob.delivered([again], refresh_s=60)
    ob.enqueue([alert(1, ends=T0 + 5 * S)], ["am"])
    now[0] += 200
    (res,) = ob.claim("am", 10, lease_s=30)  # the resolution, and no more refreshes
    assert res.alert["status"] == "resolved" and not res.refresh
    ob.delivered([res], refresh_s=60)
    now[0] += 200
    assert ob.claim("am", 10, lease_s=30) == []
    store.close()


def self_signed(tmp_path: Path) -> tuple[Path, Path]:
    import datetime as dt
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "rocewatch-test-receiver")])
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(hours=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    crt, pem = tmp_path / "rx.crt", tmp_path / "rx.key"
    crt.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    pem.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return crt, pem


def test_https_receiver_with_private_ca(tmp_path: Path) -> None:
    import ssl

    from rocewatch.notify.base import TlsConfig

    crt, key = self_signed(tmp_path)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(crt, key)
    rx = Receiver(free_port(), tls=ctx).start()
    store = Store(f"sqlite:///{tmp_path / 'o.db'}")
    store.create_schema()
    url = f"https://127.0.0.1:{rx.port}/hook"
    r = RetryConfig(initial_s=0.05, max_s=0.1, jitter=0.0)
    try:
        # without the receiver's CA the certificate is not trusted: retried, never sent plain
        untrusted = WebhookNotifier(WebhookConfig(name="ops", url=url, secret=SECRET, timeout_s=2))
        now = [1_000.0]  # the outbox's clock: retries fall due when the test moves it
        d = Dispatcher(Outbox(store, clock=lambda: now[0]), [untrusted], r, poll_s=0.05)
        d.enqueue([alert(1)])
        assert not d.drain(0.3)
        assert d.failures["ops"] >= 1 and rx.requests == []
        trusted = WebhookNotifier(
            WebhookConfig(
                name="ops", url=url, secret=SECRET, timeout_s=2, tls=TlsConfig(ca_file=str(crt))
            )
        )
        d2 = Dispatcher(Outbox(store, clock=lambda: now[0]), [trusted], r, poll_s=0.05)
        now[0] += r.max_s  # past the backoff
        assert d2.drain(10)
    finally:
        rx.stop()
        store.close()
    (req,) = rx.requests
    check_signed(req)
    assert events(req) == [(alert(1).fingerprint, alert(1).to_json()["startsAt"], "firing")]


# --- receivers that push back: 429 (with and without Retry-After), or accept and never answer ---


class Scripted:
    """A real HTTP receiver answering each request from a script: an int status, a (status,
    Retry-After) pair, or "hang" (read the request, never answer); 200 once the script ends."""

    def __init__(self, script: list[Any]) -> None:
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        self.script = list(script)
        self.requests: list[tuple[Received, Any]] = []  # each request and what it was answered
        self.released = threading.Event()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                step = outer.script.pop(0) if outer.script else 200
                outer.requests.append((Received(self.path, dict(self.headers), body), step))
                if step == "hang":
                    outer.released.wait(30)  # the client must give up first
                    return
                code, after = step if isinstance(step, tuple) else (step, None)
                self.send_response(code)
                if after is not None:
                    self.send_header("Retry-After", after)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *a: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = int(self.server.server_address[1])
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def answered(self) -> list[Received]:
        """The requests answered 200."""
        return [r for r, step in self.requests if step == 200]

    def stop(self) -> None:
        self.released.set()
        self.server.shutdown()
        self.server.server_close()


def clocked(
    tmp_path: Path, port: int, timeout_s: float = 2.0
) -> tuple[Dispatcher, Store, list[float]]:
    """A dispatcher whose outbox runs on a clock the test moves (retries are due by it)."""
    now = [1_000.0]
    store = Store(f"sqlite:///{tmp_path / 'outbox.db'}")
    store.create_schema()
    sink = WebhookNotifier(
        WebhookConfig(
            name="ops", url=f"http://127.0.0.1:{port}/hook", secret=SECRET, timeout_s=timeout_s
        )
    )
    retry = RetryConfig(initial_s=0.5, max_s=30.0, jitter=0.0)
    return Dispatcher(Outbox(store, clock=lambda: now[0]), [sink], retry), store, now


def test_429_backs_off_honours_retry_after_and_delivers_once(tmp_path: Path) -> None:
    """429 without Retry-After: the next try after the backoff (0.5 s); 429 with Retry-After: 3:
    not before 3 s though the backoff (1 s) is over; then every event goes once."""
    rx = Scripted([429, (429, "3")])
    d, store, now = clocked(tmp_path, rx.port)
    sent = [alert(i) for i in range(5)]
    try:
        d.enqueue(sent)
        assert d.run_once() == 0 and len(rx.requests) == 1  # 429, no Retry-After
        now[0] += 0.4
        assert d.run_once() == 0 and len(rx.requests) == 1  # within the backoff: no request
        now[0] += 0.1
        assert d.run_once() == 0 and len(rx.requests) == 2  # 429, Retry-After: 3
        now[0] += 1.5  # past the 1 s backoff, not past the receiver's 3 s
        assert d.run_once() == 0 and len(rx.requests) == 2
        now[0] += 1.5
        assert d.run_once() == len(sent)
        assert d.depth() == 0 and not d.dead["ops"]
        assert d.failures["ops"] == 2
        now[0] += 60
        assert d.run_once() == 0 and len(rx.requests) == 3  # nothing goes twice
    finally:
        rx.stop()
        store.close()
    (ok,) = rx.answered()
    check_signed(ok)
    assert Counter(events(ok)) == Counter(
        (a.fingerprint, a.to_json()["startsAt"], "firing") for a in sent
    )
    # every try carried the same events under the same delivery id
    assert len({r.headers[DELIVERY_HEADER] for r, _ in rx.requests}) == 1


def test_retry_after_is_capped_and_read_as_seconds_or_a_date() -> None:
    from rocewatch.notify.http import retry_after_s

    assert retry_after_s("120", 0.0) == 120.0
    assert retry_after_s("Wed, 02 Dec 2026 10:00:30 GMT", 1_796_205_600.0) == 30.0
    assert retry_after_s("Wed, 02 Dec 2026 09:00:00 GMT", 1_796_205_600.0) == 0.0  # past
    assert retry_after_s("soon", 0.0) is None and retry_after_s(None, 0.0) is None


def test_a_days_retry_after_waits_no_longer_than_the_backoff_cap(tmp_path: Path) -> None:
    rx = Scripted([(503, "86400")])
    d, store, now = clocked(tmp_path, rx.port)
    try:
        d.enqueue([alert(1)])
        assert d.run_once() == 0
        now[0] += 29.9
        assert d.run_once() == 0 and len(rx.requests) == 1
        now[0] += 0.2  # the cap (max_s 30 s)
        assert d.run_once() == 1 and d.depth() == 0
    finally:
        rx.stop()
        store.close()


def test_a_receiver_that_never_answers_is_timed_out_and_retried(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A receiver that accepts and never answers costs one timeout, not the sender: the pass
    returns, the events wait for the backoff, and the next try delivers them. The hung request
    and its retry carry the same delivery id, so a receiver that did act on the first can drop
    the second."""
    import time as _time

    caplog.set_level(logging.WARNING, logger="rocewatch.notify.dispatcher")
    rx = Scripted(["hang"])
    d, store, now = clocked(tmp_path, rx.port, timeout_s=0.3)
    sent = [alert(i) for i in range(3)] + [alert(i, name="Straggler") for i in range(2)]
    try:
        d.enqueue(sent)
        t0 = _time.monotonic()
        assert d.run_once() == 0
        took = _time.monotonic() - t0
        assert took < 10, took  # one timeout (0.3 s): the second group waits with the first
        assert d.failures["ops"] == 1 and d.depth() == len(sent)
        assert "timed out" in caplog.text
        now[0] += 0.5
        assert d.run_once() == len(sent)
        assert d.depth() == 0 and not d.dead["ops"]
    finally:
        rx.stop()
        store.close()
    hung = [r for r, step in rx.requests if step == "hang"]
    assert len(hung) == 1
    got: Counter[tuple[str, str, str]] = Counter()
    for r in rx.answered():
        check_signed(r)
        got.update(events(r))
    want = Counter((a.fingerprint, a.to_json()["startsAt"], "firing") for a in sent)
    assert got == want and max(got.values()) == 1
    retried = [r for r in rx.answered() if r.body == hung[0].body]
    assert [r.headers[DELIVERY_HEADER] for r in retried] == [hung[0].headers[DELIVERY_HEADER]]
