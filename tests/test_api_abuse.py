"""The operator API runs inside the detector's process: bad clients must cost it little.

Real sockets on 127.0.0.1, as an attacker would try it: a thousand connections that never send
a request line, a request line sent a byte at a time, a body that trickles, negative, malformed
and huge Content-Lengths, with and without the token. Throughout, an authorised request is
answered within a second, the idle connections are closed after the idle timeout, and the
process holds no more threads than the API's loop and its workers.
"""

from __future__ import annotations

import contextlib
import dataclasses
import http.client
import json
import os
import select
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from actions.api import ApiConfig, OperatorApi
from actions.operator import MemoryCommands
from storage.store import Store

pytestmark = pytest.mark.slow  # each case waits out the idle timeout (a few seconds)

TOKEN = "s3cret-operator-token-0123"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
IDLE_S = 1.5
BODY_S = 1.0


def os_threads() -> int:
    """The process's threads as the kernel counts them (Python's and native ones)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("Threads:"):
            return int(line.split()[1])
    raise AssertionError("no Threads: line in /proc/self/status")


@pytest.fixture(scope="module")
def cert(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    d = tmp_path_factory.mktemp("tls")
    cert, key = d / "cert.pem", d / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
         "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True,
    )  # fmt: skip
    return str(cert), str(key)


@pytest.fixture(params=["http", "https"])
def served(
    request: pytest.FixtureRequest, cert: tuple[str, str], tmp_path: Path
) -> Iterator[tuple[OperatorApi, ssl.SSLContext | None, int]]:
    store = Store(f"sqlite:///{tmp_path}/abuse.db")
    store.create_schema()
    kw: dict[str, Any] = {}
    ctx = None
    if request.param == "https":
        kw = {"tls_cert": cert[0], "tls_key": cert[1]}
        ctx = ssl.create_default_context(cafile=cert[0])
    before = os_threads()
    cfg = ApiConfig(
        listen="127.0.0.1:0", token=TOKEN, idle_timeout_s=IDLE_S, body_timeout_s=BODY_S, **kw
    )
    srv = OperatorApi(cfg, MemoryCommands(), store).start()
    try:
        yield srv, ctx, before
    finally:
        srv.close()
        store.close()


def connect(srv: OperatorApi, ctx: ssl.SSLContext | None, timeout: float) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", srv.port), timeout=timeout)
    if ctx is not None:
        s = ctx.wrap_socket(s, server_hostname="127.0.0.1")
    return s


def ask(
    srv: OperatorApi,
    ctx: ssl.SSLContext | None,
    method: str = "GET",
    path: str = "/api/v1/pending",
    body: bytes | None = None,
    timeout: float = 1.0,
) -> tuple[int, Any]:
    """One authorised request on a fresh connection; ``timeout`` bounds every socket wait."""
    if ctx is None:
        c: http.client.HTTPConnection = http.client.HTTPConnection(
            "127.0.0.1", srv.port, timeout=timeout
        )
    else:
        c = http.client.HTTPSConnection("127.0.0.1", srv.port, timeout=timeout, context=ctx)
    try:
        c.request(method, path, body, {**AUTH, "Content-Type": "application/json"})
        r = c.getresponse()
        data = r.read()
        if r.getheader("Content-Type", "").startswith("text/html"):
            return r.status, data.decode()
        return r.status, json.loads(data)
    finally:
        c.close()


def raw(
    srv: OperatorApi, ctx: ssl.SSLContext | None, head: bytes, timeout: float = 3.0
) -> tuple[int, bytes]:
    """Send ``head`` as is; the status the server answers and whatever else it sent."""
    s = connect(srv, ctx, timeout)
    try:
        s.sendall(head)
        data = b""
        with contextlib.suppress(ConnectionResetError):
            while b"\r\n\r\n" not in data:
                chunk = s.recv(4096)
                if not chunk:
                    break
                data += chunk
        assert data.startswith(b"HTTP/1."), data
        return int(data.split(b" ", 2)[1]), data
    finally:
        s.close()


def closed_by_server(s: socket.socket) -> bool:
    """True once the server has closed (or reset) the connection."""
    p = select.poll()  # (select() cannot take descriptors past 1023)
    p.register(s, select.POLLIN)
    if not p.poll(0):
        return False
    try:
        return s.recv(1) == b""
    except (ConnectionResetError, ssl.SSLError, OSError):
        return True


def test_the_api_survives_idle_floods_slow_bodies_and_bad_lengths(
    served: tuple[OperatorApi, ssl.SSLContext | None, int],
) -> None:
    srv, ctx, threads_before = served
    assert ask(srv, ctx) == (200, {"nodes": []})

    # 1,000 connections that never send a request line (plain TCP even on the TLS port:
    # a handshake never started holds a connection just the same)
    idle: list[socket.socket] = []
    try:
        for _ in range(1000):
            idle.append(socket.create_connection(("127.0.0.1", srv.port), timeout=5))
        # ... and one that sends its request line a byte at a time, never finishing
        slowloris = connect(srv, ctx, 5)
        slowloris.sendall(b"GET /api/v1/pend")
        assert ask(srv, ctx) == (200, {"nodes": []})  # answered within the second
        code, page = ask(srv, ctx, path="/incidents")  # and so are the incident pages
        assert code == 200 and "<h1>Incidents</h1>" in page

        # a body announced at 40 bytes, sent 3 at first then nothing: 408 after body_timeout_s
        slow = connect(srv, ctx, 5)
        slow.sendall(
            b"POST /api/v1/approve HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
            + TOKEN.encode()
            + b'\r\nContent-Type: application/json\r\nContent-Length: 40\r\n\r\n{"n'
        )
        assert ask(srv, ctx) == (200, {"nodes": []})  # not held up by the trickling body
        slow.settimeout(BODY_S + 5)
        answer = slow.recv(4096)
        assert answer.startswith(b"HTTP/1.1 408"), answer
        slow.close()

        auth = b"Authorization: Bearer " + TOKEN.encode() + b"\r\n"
        post = b"POST /api/v1/approve HTTP/1.1\r\nHost: x\r\n"
        # the request that the http.server API never answered
        assert raw(srv, ctx, post + auth + b"Content-Length: -1\r\n\r\n")[0] == 400
        assert raw(srv, ctx, post + auth + b"Content-Length: 12abc\r\n\r\n")[0] == 400
        assert raw(srv, ctx, post + auth + b"Content-Length: 1000000000000\r\n\r\n")[0] == 413
        code, _ = raw(srv, ctx, post + auth + b"Content-Length: " + b"9" * 40 + b"\r\n\r\n")
        assert code in (400, 413)  # past 64 bits: the parser refuses it before we see it
        assert raw(srv, ctx, post + b"Content-Length: 1000000000000\r\n\r\n")[0] == 401
        big = b"{" + b" " * 70_000 + b"}"  # a real body over the limit, chunked: 413
        chunked = post + auth + b"Transfer-Encoding: chunked\r\n\r\n"
        chunked += f"{len(big):x}\r\n".encode() + big + b"\r\n0\r\n\r\n"
        assert raw(srv, ctx, chunked)[0] == 413

        # the API still takes a real command, and the process holds a bounded set of threads
        code, cmd = ask(srv, ctx, "POST", "/api/v1/approve", b'{"node": "gpu-01"}')
        assert code == 202 and cmd["node"] == "gpu-01"
        assert os_threads() <= threads_before + 1 + srv.config.workers
        assert threading.active_count() <= 64

        # past the idle timeout every one of those connections is closed by the server
        deadline = time.monotonic() + IDLE_S + 5
        left = [*idle, slowloris]
        while left and time.monotonic() < deadline:
            left = [s for s in left if not closed_by_server(s)]
            time.sleep(0.1)
        assert left == [], f"{len(left)} idle connections still open"
        assert srv.timed_out > 0  # the slow request line, at least, by the sweeper
        if ctx is None:  # (on TLS, asyncio's handshake timeout closes the silent ones)
            assert srv.refused > 0  # past max_connections, the longest idle made room
        assert ask(srv, ctx) == (200, {"nodes": []})
    finally:
        for s in idle:
            s.close()


def test_keep_alive_connections_serve_several_requests_then_idle_out(
    served: tuple[OperatorApi, ssl.SSLContext | None, int],
) -> None:
    """The timeouts do not cut an operator's connection short while it is in use."""
    srv, ctx, _ = served
    if ctx is None:
        c: http.client.HTTPConnection = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=5)
    else:
        c = http.client.HTTPSConnection("127.0.0.1", srv.port, timeout=5, context=ctx)
    for _ in range(3):
        c.request("GET", "/api/v1/pending", headers=AUTH)
        r = c.getresponse()
        assert r.status == 200 and json.loads(r.read()) == {"nodes": []}
        time.sleep(IDLE_S / 4)
    assert c.sock is not None
    sock = c.sock
    deadline = time.monotonic() + IDLE_S + 5
    closed = False
    while not closed and time.monotonic() < deadline:
        closed = closed_by_server(sock)
        time.sleep(0.1)
    assert closed
    c.close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def proc_threads(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Threads:"):
            return int(line.split()[1])
    raise AssertionError(f"no Threads: line for {pid}")


def scrape(port: int, name: str) -> float | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
            text = r.read().decode()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return None


def test_the_detector_keeps_up_with_its_stream_while_its_api_is_attacked(
    kafka_bootstrap: str,
    kafka_topics: Any,
    tmp_path: Path,
    scenario: Path,
    replay_result: Any,
) -> None:
    """`rocewatch detect` (a real process, real broker) serves its API while the scenario
    streams at 1.5x telemetry speed; 1,000 idle connections, slow request lines, slow bodies
    and bad lengths hit the API meanwhile. The detector's thread count stays bounded, the
    API answers, the consumer lag falls back to zero once the stream ends and the alerts and
    actions are exactly the replay's."""
    from tests.support.state_keys import SIGNING_YAML
    from tests.test_kafka_pipeline import kafka_cfg, sorted_actions, wait_for_outputs

    cfg = kafka_cfg(kafka_bootstrap, kafka_topics, tmp_path, scenario)
    from rocewatch.bus.topics import ensure_topics
    from rocewatch.runtime.publish import publish_scenario

    ensure_topics(cfg.kafka)
    k = cfg.kafka
    api_port, metrics_port = free_port(), free_port()
    conf = tmp_path / "rocewatch.yaml"
    conf.write_text(
        yaml.safe_dump(
            {
                "topology": cfg.topology,
                "state_dir": cfg.state_dir,
                "metrics_port": metrics_port,
                "api": {
                    "listen": f"127.0.0.1:{api_port}",
                    "token": TOKEN,
                    "idle_timeout_s": IDLE_S,
                },
                "kafka": {
                    "bootstrap_servers": k.bootstrap_servers,
                    "group_id": k.group_id,
                    "commit_interval_s": 0.5,
                    "idle_flush_s": 3.0,
                    "session_timeout_ms": 6000,
                    "topics": dataclasses.asdict(k.topics),
                    "state_signing": SIGNING_YAML,
                },
            }
        )
    )
    log_path = tmp_path / "detect.log"
    with log_path.open("wb") as fh:
        proc = subprocess.Popen(
            [sys.executable, "-m", "rocewatch.cli", "detect", "--config", str(conf)],
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
            stdout=fh,
            stderr=subprocess.STDOUT,
        )
    idle: list[socket.socket] = []
    try:
        deadline = time.monotonic() + 120
        while "detect stage active" not in log_path.read_text(errors="replace"):
            assert proc.poll() is None and time.monotonic() < deadline, log_path.read_text()
            time.sleep(0.1)
        threads_before = proc_threads(proc.pid)
        # at 1.5x telemetry time, so the attack lasts long enough to see the stream consumed
        # throughout (at 3x a loaded machine took two scrapes before the stream ended)
        pub = threading.Thread(target=publish_scenario, args=(scenario, cfg, 1.5), daemon=True)
        pub.start()

        class Target:  # what ask() and raw() need of an OperatorApi
            port = api_port

        srv: Any = Target()
        srv_workers = ApiConfig().workers
        for _ in range(1000):
            idle.append(socket.create_connection(("127.0.0.1", api_port), timeout=5))
        slow = socket.create_connection(("127.0.0.1", api_port), timeout=5)
        slow.sendall(b"POST /api/v1/approve HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
                     + TOKEN.encode() + b"\r\nContent-Length: 40\r\n\r\n{")  # fmt: skip
        auth = b"Authorization: Bearer " + TOKEN.encode() + b"\r\n"
        post = b"POST /api/v1/approve HTTP/1.1\r\nHost: x\r\n"
        assert raw(srv, None, post + auth + b"Content-Length: -1\r\n\r\n")[0] == 400
        assert raw(srv, None, post + auth + b"Content-Length: 1000000000000\r\n\r\n")[0] == 413
        lags: list[float] = []
        ingested: list[float] = []
        threads: list[int] = []
        while pub.is_alive():  # the attack goes on while the stream does
            assert ask(srv, None)[0] == 200  # every request answered within the second
            threads.append(proc_threads(proc.pid))
            lag = scrape(metrics_port, "rocewatch_consumer_lag_records_total")
            if lag is not None:
                lags.append(lag)
            n = scrape(metrics_port, "rocewatch_samples_ingested_total")
            if n is not None:
                ingested.append(n)
            for i, s in enumerate(idle):  # idle connections come back as fast as closed
                if closed_by_server(s):
                    s.close()
                    idle[i] = socket.create_connection(("127.0.0.1", api_port), timeout=5)
            time.sleep(0.2)
        # the API's loop thread is there already; its workers start on demand, and the
        # detector's own threads (producer sender, metrics scrapes) come with the stream
        bound = threads_before + srv_workers + 8  # (the http.server API: one per connection)
        assert max(threads) <= bound, (threads_before, threads)
        assert len(ingested) >= 3 and ingested[-1] > ingested[0]  # it consumed throughout
        wait_for_outputs(kafka_bootstrap, cfg, replay_result.alerts, replay_result.actions)
        deadline = time.monotonic() + 30
        while (scrape(metrics_port, "rocewatch_consumer_lag_records_total") or 0) > 0:
            assert time.monotonic() < deadline, f"lag stays up: {lags[-10:]}"
            time.sleep(0.5)
        print(f"lag during the attack: max {max(lags, default=0):.0f} records, "
              f"threads {threads_before} -> max {max(threads)}")  # fmt: skip
    finally:
        for s in idle:
            s.close()
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
    from tests.test_kafka_pipeline import read_topic

    acts = [json.loads(m.value) for m in read_topic(kafka_bootstrap, k.topics.actions)]
    assert sorted_actions(acts) == sorted_actions(replay_result.actions)
