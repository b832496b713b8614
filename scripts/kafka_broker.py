#!/usr/bin/env python3
"""A real Apache Kafka 4.x broker (KRaft, single node, 127.0.0.1) for tests and CI.

Stdlib only. The broker jars come from Maven Central through Maven and are cached
under ``~/.cache/rocewatch/kafka-<version>/libs`` (``$ROCEWATCH_CACHE`` overrides
``~/.cache/rocewatch``; ``$ROCEWATCH_KAFKA_VERSION`` overrides the version).

Command line::

    python scripts/kafka_broker.py fetch
    python scripts/kafka_broker.py start --dir DIR --port 9092 [--controller-port N] [--foreground]
    python scripts/kafka_broker.py stop --dir DIR
    python scripts/kafka_broker.py status --dir DIR

As a module (tests put ``scripts/`` on ``sys.path`` or load this file by path)::

    import kafka_broker
    broker = kafka_broker.start("/tmp/kafka", port=19092)
    broker.bootstrap        # "127.0.0.1:19092"
    broker.restart()        # same dir, same ports, data kept
    broker.stop()

Extra listeners (SSL, SASL_SSL, ...) go through :func:`broker_properties`'s
``extra_listeners``; see :class:`Listener`.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import fcntl
import json
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import time
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

KAFKA_VERSION = os.environ.get("ROCEWATCH_KAFKA_VERSION", "4.1.1")
# Kafka 4.x ships log4j2 and slf4j-api 1.7; this binds the two (same version as log4j-core).
LOG4J_VERSION = "2.24.3"
DEPENDENCY_PLUGIN_VERSION = "3.8.1"
DEFAULT_HOST = "127.0.0.1"
DEFAULT_HEAP = "512m"
DEFAULT_START_TIMEOUT = 90.0
DEFAULT_STOP_TIMEOUT = 30.0
FETCH_TIMEOUT = 900.0
MARKER = ".complete"


class BrokerError(RuntimeError):
    """The broker could not be fetched, started or stopped. ``log_tail``: the broker log's end."""

    def __init__(self, message: str, log_tail: str = "") -> None:
        super().__init__(message + (f"\n--- broker.log (tail) ---\n{log_tail}" if log_tail else ""))
        self.log_tail = log_tail


def _say(msg: str, quiet: bool = False) -> None:
    if not quiet:
        print(f"[kafka_broker] {msg}", flush=True)


# --------------------------------------------------------------------------- fetch


def cache_root() -> Path:
    env = os.environ.get("ROCEWATCH_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "rocewatch"


def cache_dir(version: str = KAFKA_VERSION) -> Path:
    return cache_root() / f"kafka-{version}"


def libs_dir(version: str = KAFKA_VERSION) -> Path:
    return cache_dir(version) / "libs"


def is_fetched(version: str = KAFKA_VERSION) -> bool:
    d = cache_dir(version)
    return (d / MARKER).is_file() and any((d / "libs").glob("kafka_2.13-*.jar"))


def _pom(version: str) -> str:
    deps = [
        ("org.apache.kafka", "kafka_2.13", version),
        ("org.apache.logging.log4j", "log4j-slf4j-impl", LOG4J_VERSION),
    ]
    dep_xml = "\n".join(
        f"    <dependency><groupId>{g}</groupId><artifactId>{a}</artifactId>"
        f"<version>{v}</version></dependency>"
        for g, a, v in deps
    )
    return f"""<?xml version="1.0" encoding="UTF-8"?>
<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>rocewatch.dev</groupId>
  <artifactId>kafka-broker-libs</artifactId>
  <version>{version}</version>
  <packaging>pom</packaging>
  <dependencies>
{dep_xml}
  </dependencies>
  <build>
    <plugins>
      <plugin>
        <groupId>org.apache.maven.plugins</groupId>
        <artifactId>maven-dependency-plugin</artifactId>
        <version>{DEPENDENCY_PLUGIN_VERSION}</version>
      </plugin>
    </plugins>
  </build>
</project>
"""


def fetch(
    version: str = KAFKA_VERSION, quiet: bool = False, timeout: float = FETCH_TIMEOUT
) -> Path:
    """Resolve the broker's jars into the cache with Maven; return the libs directory.

    Does nothing when the cache is already complete. Safe to call from concurrent processes.
    """
    d = cache_dir(version)
    if is_fetched(version):
        _say(f"kafka {version} already cached in {d / 'libs'}", quiet)
        return d / "libs"
    d.mkdir(parents=True, exist_ok=True)
    with open(d / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if is_fetched(version):  # another process finished it while we waited
            _say(f"kafka {version} already cached in {d / 'libs'}", quiet)
            return d / "libs"
        mvn = shutil.which("mvn")
        if not mvn:
            raise BrokerError("Maven ('mvn') is not on PATH; install it (apt-get install maven)")
        (d / "pom.xml").write_text(_pom(version))
        tmp = d / "libs.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(d / "libs", ignore_errors=True)
        _say(
            f"resolving org.apache.kafka:kafka_2.13:{version} from Maven Central "
            f"into {d / 'libs'} ...",
            quiet,
        )
        t0 = time.monotonic()
        cmd = [
            mvn,
            "-q",
            "-B",
            "-f",
            str(d / "pom.xml"),
            "dependency:copy-dependencies",
            "-DincludeScope=runtime",
            f"-DoutputDirectory={tmp}",
        ]
        try:
            res = subprocess.run(cmd, cwd=d, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired as e:
            raise BrokerError(f"mvn did not finish within {timeout:.0f}s") from e
        if res.returncode != 0:
            out = (res.stdout + res.stderr)[-4000:]
            raise BrokerError(f"mvn failed (exit {res.returncode}):\n{out}")
        jars = sorted(p.name for p in tmp.glob("*.jar"))
        if not any(j.startswith("kafka_2.13-") for j in jars):
            raise BrokerError(f"mvn finished but {tmp} holds no kafka_2.13 jar: {jars}")
        tmp.rename(d / "libs")
        (d / MARKER).write_text(json.dumps({"version": version, "jars": jars}, indent=1) + "\n")
        _say(f"fetched {len(jars)} jars in {time.monotonic() - t0:.1f}s", quiet)
    return d / "libs"


# --------------------------------------------------------------------------- properties


@dataclass
class Listener:
    """One extra listener.

    ``properties`` are written verbatim (e.g. ``listener.name.ssl.ssl.keystore.location``).

    Example: ``Listener("SSL", 19093, "SSL", {"ssl.keystore.location": ..., ...})``; keys without a
    ``listener.name.`` prefix are prefixed with ``listener.name.<name lowercased>.``.
    """

    name: str
    port: int
    protocol: str = "PLAINTEXT"  # PLAINTEXT | SSL | SASL_PLAINTEXT | SASL_SSL
    properties: dict[str, str] = field(default_factory=dict)
    host: str = DEFAULT_HOST
    advertised_host: str | None = None

    @classmethod
    def coerce(cls, value: Listener | Mapping[str, Any]) -> Listener:
        return value if isinstance(value, Listener) else cls(**dict(value))


def broker_properties(
    data_dir: str | os.PathLike[str],
    port: int,
    controller_port: int,
    *,
    host: str = DEFAULT_HOST,
    node_id: int = 1,
    extra_listeners: Iterable[Listener | Mapping[str, Any]] = (),
    overrides: Mapping[str, Any] | None = None,
) -> dict[str, str]:
    """All server.properties of the single-node KRaft broker+controller, in order.

    ``extra_listeners``: Listener objects or dicts with the same fields (name, port, protocol,
    properties, host, advertised_host). ``overrides`` win over everything.
    """
    listeners = [Listener("PLAINTEXT", port, "PLAINTEXT", host=host)]
    listeners += [Listener.coerce(x) for x in extra_listeners]
    names = [x.name.upper() for x in listeners] + ["CONTROLLER"]
    if len(set(names)) != len(names):
        raise ValueError(f"duplicate listener names: {names}")
    proto_map = {x.name.upper(): x.protocol.upper() for x in listeners}
    proto_map["CONTROLLER"] = "PLAINTEXT"
    props: dict[str, str] = {
        "process.roles": "broker,controller",
        "node.id": str(node_id),
        "controller.listener.names": "CONTROLLER",
        "listeners": ",".join(
            [f"{x.name.upper()}://{x.host}:{x.port}" for x in listeners]
            + [f"CONTROLLER://{host}:{controller_port}"]
        ),
        "advertised.listeners": ",".join(
            f"{x.name.upper()}://{x.advertised_host or x.host}:{x.port}" for x in listeners
        )
        + f",CONTROLLER://{host}:{controller_port}",
        "inter.broker.listener.name": "PLAINTEXT",
        "listener.security.protocol.map": ",".join(f"{k}:{v}" for k, v in proto_map.items()),
        "controller.quorum.bootstrap.servers": f"{host}:{controller_port}",
        "log.dirs": str(Path(data_dir) / "data"),
        "num.partitions": "4",
        "default.replication.factor": "1",
        "min.insync.replicas": "1",
        "auto.create.topics.enable": "true",
        "offsets.topic.replication.factor": "1",
        "offsets.topic.num.partitions": "4",
        "transaction.state.log.replication.factor": "1",
        "transaction.state.log.min.isr": "1",
        "transaction.state.log.num.partitions": "4",
        "share.coordinator.state.topic.replication.factor": "1",
        "share.coordinator.state.topic.min.isr": "1",
        "group.initial.rebalance.delay.ms": "0",
        "num.network.threads": "2",
        "num.io.threads": "4",
        "num.recovery.threads.per.data.dir": "1",
        "log.retention.hours": "24",
        "log.segment.bytes": str(64 * 1024 * 1024),
        "delete.topic.enable": "true",
    }
    for x in listeners:
        prefix = f"listener.name.{x.name.lower()}."
        for k, v in x.properties.items():
            props[k if k.startswith("listener.name.") else prefix + k] = str(v)
    for k, v in (overrides or {}).items():
        props[str(k)] = str(v)
    return props


def render_properties(props: Mapping[str, str]) -> str:
    def esc(s: str) -> str:
        return s.replace("\\", "\\\\").replace("\n", "\\n")

    return "# written by scripts/kafka_broker.py\n" + "".join(
        f"{k}={esc(v)}\n" for k, v in props.items()
    )


LOG4J2_PROPERTIES = """\
status = warn
name = rocewatch-kafka
appender.out.type = Console
appender.out.name = STDOUT
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = info
rootLogger.appenderRef.out.ref = STDOUT
logger.request.name = kafka.request.logger
logger.request.level = warn
logger.state.name = state.change.logger
logger.state.level = warn
logger.clients.name = org.apache.kafka.clients
logger.clients.level = warn
logger.config.name = org.apache.kafka.common.config.AbstractConfig
logger.config.level = warn
"""


# --------------------------------------------------------------------------- helpers


def new_cluster_id() -> str:
    """A random Kafka cluster id: a UUID as 22 chars of unpadded base64url.

    Like Kafka's own Uuid.randomUuid(), never one starting with "-" (the tools would read it
    as an option).
    """
    while True:
        cid = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not cid.startswith("-"):
            return cid


def free_port(host: str = DEFAULT_HOST) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def java_bin() -> str:
    home = os.environ.get("JAVA_HOME")
    if home and (Path(home) / "bin" / "java").exists():
        return str(Path(home) / "bin" / "java")
    j = shutil.which("java")
    if not j:
        raise BrokerError("no 'java' on PATH and no JAVA_HOME: Kafka needs Java 17+")
    return j


def tail(path: Path, lines: int = 60) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - 64 * 1024))
            data = f.read().decode("utf-8", "replace")
    except OSError:
        return f"(no log at {path})"
    return "\n".join(data.splitlines()[-lines:])


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie is dead for our purposes
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def _pid_is_our_broker(pid: int, props_file: Path) -> bool:
    try:
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return _pid_alive(pid)  # no /proc: trust the pid file
    return b"kafka.Kafka" in cmd and str(props_file).encode() in cmd


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("connection closed by broker")
        buf += chunk
    return buf


def _kafka_request(
    host: str, port: int, api_key: int, api_version: int, body: bytes, timeout: float
) -> bytes:
    """One request, header v1 (non-flexible versions); returns what follows the correlation id."""
    client_id = b"rocewatch-probe"
    corr = 7
    header = struct.pack(">hhih", api_key, api_version, corr, len(client_id)) + client_id
    msg = header + body
    with socket.create_connection((host, port), timeout=timeout) as s:
        s.settimeout(timeout)
        s.sendall(struct.pack(">i", len(msg)) + msg)
        (size,) = struct.unpack(">i", _recv_exact(s, 4))
        resp = _recv_exact(s, size)
    (got_corr,) = struct.unpack(">i", resp[:4])
    if got_corr != corr:
        raise ConnectionError(f"bad correlation id {got_corr}")
    return resp[4:]


def probe(host: str, port: int, timeout: float = 5.0) -> str | None:
    """Real Kafka API calls with the stdlib: ApiVersions v0 then Metadata v4.

    Returns None when the broker serves requests and lists at least one live broker,
    else a short reason.
    """
    try:
        resp = _kafka_request(host, port, 18, 0, b"", timeout)  # ApiVersions v0
        (err,) = struct.unpack(">h", resp[:2])
        if err != 0:
            return f"ApiVersions error {err}"
        # Metadata v4: topics = [] (none), allow_auto_topic_creation = false
        resp = _kafka_request(host, port, 3, 4, struct.pack(">ib", 0, 0), timeout)
        _throttle, n_brokers = struct.unpack(">ii", resp[:8])
        if n_brokers < 1:
            return "metadata lists no live broker yet"
    except (OSError, ConnectionError, struct.error) as e:
        return f"{type(e).__name__}: {e}"
    return None


def probe_kafka_python(bootstrap: str, timeout: float = 10.0) -> str | None:
    """List topics with kafka-python's KafkaAdminClient. None = fine (or kafka-python missing)."""
    try:
        from kafka import KafkaAdminClient  # type: ignore[import-not-found]
    except Exception:
        return None
    admin = None
    ms = int(timeout * 1000)
    # bootstrap wait: api_version_auto_timeout_ms in kafka-python 2.x, bootstrap_timeout_ms in 3.x
    wanted = {
        "request_timeout_ms": ms,
        "api_version_auto_timeout_ms": ms,
        "bootstrap_timeout_ms": ms,
    }
    known = getattr(KafkaAdminClient, "DEFAULT_CONFIG", wanted)
    kwargs = {k: v for k, v in wanted.items() if k in known}
    try:
        admin = KafkaAdminClient(bootstrap_servers=bootstrap, client_id="rocewatch-probe", **kwargs)
        admin.list_topics()
    except Exception as e:
        if type(e).__name__ == "KafkaConfigurationError":
            raise BrokerError(f"kafka-python rejected the probe's settings: {e}") from e
        return f"kafka-python: {type(e).__name__}: {e}"
    finally:
        if admin is not None:
            with contextlib.suppress(Exception):
                admin.close()
    return None


# --------------------------------------------------------------------------- broker


@dataclass
class Broker:
    """A single-node KRaft broker in ``dir`` (server.properties, data/, broker.log, broker.pid)."""

    dir: Path
    port: int
    controller_port: int
    host: str = DEFAULT_HOST
    version: str = KAFKA_VERSION
    heap: str = DEFAULT_HEAP
    extra_listeners: list[Listener] = field(default_factory=list)
    overrides: dict[str, Any] = field(default_factory=dict)
    # extra StorageTool format arguments, e.g. ["--add-scram", "SCRAM-SHA-512=[name=u,password=p]"]
    format_args: list[str] = field(default_factory=list)
    pid: int | None = None
    _proc: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    # a class attribute, not a field: True only for stand-ins of brokers this module did not start
    external = False

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def properties_file(self) -> Path:
        return self.dir / "server.properties"

    @property
    def log_file(self) -> Path:
        return self.dir / "broker.log"

    @property
    def pid_file(self) -> Path:
        return self.dir / "broker.pid"

    @property
    def state_file(self) -> Path:
        return self.dir / "broker.json"

    def log_tail(self, lines: int = 60) -> str:
        return tail(self.log_file, lines)

    def is_running(self) -> bool:
        if self._proc is not None:
            return self._proc.poll() is None
        return (
            self.pid is not None
            and _pid_alive(self.pid)
            and _pid_is_our_broker(self.pid, self.properties_file)
        )

    # setup
    def write_config(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        props = broker_properties(
            self.dir,
            self.port,
            self.controller_port,
            host=self.host,
            extra_listeners=self.extra_listeners,
            overrides=self.overrides,
        )
        self.properties_file.write_text(render_properties(props))
        (self.dir / "log4j2.properties").write_text(LOG4J2_PROPERTIES)
        self.state_file.write_text(
            json.dumps(
                {
                    "host": self.host,
                    "port": self.port,
                    "controller_port": self.controller_port,
                    "version": self.version,
                    "heap": self.heap,
                    "extra_listeners": [vars(x) for x in self.extra_listeners],
                    "overrides": self.overrides,
                    "format_args": self.format_args,
                },
                indent=1,
            )
            + "\n"
        )

    def _java_cmd(self, main: str, *args: str, heap: str | None = None) -> list[str]:
        libs = libs_dir(self.version)
        return [
            java_bin(),
            f"-Xmx{heap or self.heap}",
            "-Xms64m",
            "-XX:+UseG1GC",
            "-XX:MaxGCPauseMillis=20",
            "-Djava.awt.headless=true",
            f"-Dlog4j2.configurationFile={self.dir / 'log4j2.properties'}",
            f"-Dkafka.logs.dir={self.dir / 'logs'}",
            "-cp",
            f"{libs}/*",
            main,
            *args,
        ]

    def format_storage(self) -> None:
        """Format data/ once (kept across restarts)."""
        if (self.dir / "data" / "meta.properties").exists():
            return
        cid_file = self.dir / "cluster.id"
        cluster_id = cid_file.read_text().strip() if cid_file.exists() else new_cluster_id()
        cid_file.write_text(cluster_id + "\n")
        cmd = self._java_cmd(
            "kafka.tools.StorageTool",
            "format",
            "--standalone",
            "--ignore-formatted",
            "-t",
            cluster_id,
            "-c",
            str(self.properties_file),
            *self.format_args,
            heap="256m",
        )
        try:
            res = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        except subprocess.TimeoutExpired as e:
            raise BrokerError("kafka StorageTool format timed out after 120s") from e
        with open(self.log_file, "a") as f:
            f.write(
                f"--- StorageTool format (exit {res.returncode}) ---\n{res.stdout}{res.stderr}\n"
            )
        if res.returncode != 0:
            raise BrokerError(
                f"kafka StorageTool format failed (exit {res.returncode})", self.log_tail()
            )

    # lifecycle
    def start(self, timeout: float = DEFAULT_START_TIMEOUT, foreground: bool = False) -> Broker:
        """Write config, format once, launch detached, wait until it serves (or BrokerError)."""
        if self.is_running():
            raise BrokerError(f"a broker is already running from {self.dir} (pid {self.pid})")
        if not is_fetched(self.version):
            fetch(self.version)
        self.write_config()
        self.format_storage()
        for p in (self.port, self.controller_port, *(x.port for x in self.extra_listeners)):
            self._wait_port_free(p, 20.0)
        cmd = self._java_cmd("kafka.Kafka", str(self.properties_file))
        with open(self.log_file, "ab") as log:
            now = time.strftime("%Y-%m-%d %H:%M:%S")
            log.write(f"--- starting kafka {self.version} at {now} ---\n".encode())
            log.flush()
            self._proc = subprocess.Popen(
                cmd,
                cwd=self.dir,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.pid = self._proc.pid
        self.pid_file.write_text(f"{self.pid}\n")
        if foreground:
            return self
        try:
            self.wait_ready(timeout)
        except BrokerError:
            self.stop()
            raise
        return self

    def _wait_port_free(self, port: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                try:
                    s.bind((self.host, port))
                    return
                except OSError as e:
                    if time.monotonic() > deadline:
                        raise BrokerError(f"port {self.host}:{port} is in use: {e}") from e
            time.sleep(0.2)

    def wait_ready(self, timeout: float = DEFAULT_START_TIMEOUT) -> None:
        """Poll until the broker answers ApiVersions + Metadata (and kafka-python's list_topics)."""
        t0 = time.monotonic()
        deadline = t0 + timeout
        reason = "not probed"
        while time.monotonic() < deadline:
            if not self.is_running():
                code = self._proc.poll() if self._proc is not None else None
                raise BrokerError(
                    f"kafka broker exited during startup (exit code {code})", self.log_tail()
                )
            left = max(1.0, deadline - time.monotonic())
            reason = probe(self.host, self.port, timeout=min(5.0, left)) or ""
            if not reason:
                reason = probe_kafka_python(self.bootstrap, timeout=min(10.0, left)) or ""
                if not reason:
                    return
            time.sleep(0.25)
        raise BrokerError(
            f"kafka broker at {self.bootstrap} not ready within {timeout:.0f}s (last: {reason})",
            self.log_tail(),
        )

    def stop(self, timeout: float = DEFAULT_STOP_TIMEOUT) -> None:
        """SIGTERM (controlled shutdown), SIGKILL after ``timeout`` seconds; waits for the exit."""
        pid = self.pid
        if pid is None and self.pid_file.exists():
            with contextlib.suppress(ValueError):
                pid = int(self.pid_file.read_text().strip())
        if pid is not None and (
            self._proc is not None or _pid_is_our_broker(pid, self.properties_file)
        ):
            self._signal(pid, signal.SIGTERM)
            if not self._wait_exit(pid, timeout):
                self._signal(pid, signal.SIGKILL)
                if not self._wait_exit(pid, 15.0):
                    raise BrokerError(f"kafka broker pid {pid} survived SIGKILL")
        if self._proc is not None:
            with contextlib.suppress(Exception):
                self._proc.wait(timeout=5)
        self._proc = None
        self.pid = None
        with contextlib.suppress(FileNotFoundError):
            self.pid_file.unlink()

    def restart(
        self, timeout: float = DEFAULT_START_TIMEOUT, stop_timeout: float = DEFAULT_STOP_TIMEOUT
    ) -> Broker:
        """Stop and start again on the same dir and ports; the data is kept."""
        self.stop(stop_timeout)
        return self.start(timeout)

    def kill(self) -> None:
        """Crash it: SIGKILL, no controlled shutdown (``start()`` brings it back, data kept)."""
        if self.pid is not None and self.is_running():
            self._signal(self.pid, signal.SIGKILL)
            if not self._wait_exit(self.pid, 15.0):
                raise BrokerError(f"kafka broker pid {self.pid} survived SIGKILL")
        self.stop(timeout=0.0)

    def _signal(self, pid: int, sig: int) -> None:
        # The broker leads its own session/process group: signal the group, fall back to the pid.
        try:
            os.killpg(pid, sig)
        except (ProcessLookupError, PermissionError):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)

    def _wait_exit(self, pid: int, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while True:
            if self._proc is not None:
                if self._proc.poll() is not None:
                    return True
            elif not _pid_alive(pid):
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.1)

    def __enter__(self) -> Broker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @classmethod
    def from_dir(cls, dir: str | os.PathLike[str]) -> Broker:
        """The broker described by DIR/broker.json (pid from DIR/broker.pid, if any)."""
        d = Path(dir).resolve()
        st = json.loads((d / "broker.json").read_text())
        b = cls(
            dir=d,
            port=int(st["port"]),
            controller_port=int(st["controller_port"]),
            host=st.get("host", DEFAULT_HOST),
            version=st.get("version", KAFKA_VERSION),
            heap=st.get("heap", DEFAULT_HEAP),
            extra_listeners=[Listener.coerce(x) for x in st.get("extra_listeners", [])],
            overrides=dict(st.get("overrides", {})),
            format_args=list(st.get("format_args", [])),
        )
        with contextlib.suppress(FileNotFoundError, ValueError):
            b.pid = int((d / "broker.pid").read_text().strip())
        return b


def make_broker(
    dir: str | os.PathLike[str],
    port: int = 9092,
    controller_port: int | None = None,
    *,
    host: str = DEFAULT_HOST,
    version: str = KAFKA_VERSION,
    heap: str = DEFAULT_HEAP,
    extra_listeners: Sequence[Listener | Mapping[str, Any]] = (),
    overrides: Mapping[str, Any] | None = None,
    format_args: Sequence[str] = (),
) -> Broker:
    """A (not yet started) Broker for ``dir``.

    ``port=0`` picks a free port; ``controller_port=None`` reuses the one an earlier start in
    ``dir`` used (formatted storage remembers it), else a free one.
    Raises BrokerError if a broker from ``dir`` is still running."""
    d = Path(dir).resolve()
    if (d / "broker.json").exists():
        prev = Broker.from_dir(d)
        if prev.pid is not None and prev.is_running():
            raise BrokerError(
                f"a broker is already running from {d} (pid {prev.pid}, {prev.bootstrap})"
            )
        if controller_port is None:
            controller_port = prev.controller_port
    if port == 0:
        port = free_port(host)
    if controller_port is None:
        controller_port = free_port(host)
        while controller_port == port:
            controller_port = free_port(host)
    return Broker(
        dir=d,
        port=port,
        controller_port=controller_port,
        host=host,
        version=version,
        heap=heap,
        extra_listeners=[Listener.coerce(x) for x in extra_listeners],
        overrides=dict(overrides or {}),
        format_args=list(format_args),
    )


def start(
    dir: str | os.PathLike[str],
    port: int = 9092,
    controller_port: int | None = None,
    *,
    host: str = DEFAULT_HOST,
    version: str = KAFKA_VERSION,
    heap: str = DEFAULT_HEAP,
    extra_listeners: Sequence[Listener | Mapping[str, Any]] = (),
    overrides: Mapping[str, Any] | None = None,
    format_args: Sequence[str] = (),
    timeout: float = DEFAULT_START_TIMEOUT,
) -> Broker:
    """Fetch if needed, then start a broker in ``dir`` and wait until it serves. Raises BrokerError.

    Ports as in :func:`make_broker`. On failure the broker process is stopped again.
    """
    broker = make_broker(
        dir,
        port,
        controller_port,
        host=host,
        version=version,
        heap=heap,
        extra_listeners=extra_listeners,
        overrides=overrides,
        format_args=format_args,
    )
    return broker.start(timeout)


@contextlib.contextmanager
def serving(dir: str | os.PathLike[str], bootstrap: str | None = None) -> Iterator[str]:
    """For benchmarks: ``bootstrap`` when given, else a fresh broker on a free port in ``dir``
    (fetched first if needed) that is stopped on exit. Yields the bootstrap address."""
    if bootstrap:
        yield bootstrap
        return
    _say("starting a Kafka broker")
    fetch(quiet=True)
    broker = start(dir, port=0)
    try:
        yield broker.bootstrap
    finally:
        broker.stop()


def stop(dir: str | os.PathLike[str], timeout: float = DEFAULT_STOP_TIMEOUT) -> bool:
    """Stop the broker started from DIR. Returns False when none was running."""
    d = Path(dir)
    if not (d / "broker.json").exists():
        return False
    b = Broker.from_dir(d)
    running = b.pid is not None and b.is_running()
    b.stop(timeout)
    return running


# --------------------------------------------------------------------------- CLI


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    f = sub.add_parser("fetch", help="resolve the broker jars from Maven Central into the cache")
    f.add_argument("--version", default=KAFKA_VERSION)
    s = sub.add_parser("start", help="format (once) and start a single-node KRaft broker")
    s.add_argument("--dir", required=True)
    s.add_argument("--port", type=int, default=9092, help="PLAINTEXT port (0 = a free one)")
    s.add_argument("--controller-port", type=int, default=None, help="default: a free port")
    s.add_argument("--host", default=DEFAULT_HOST)
    s.add_argument("--version", default=KAFKA_VERSION)
    s.add_argument("--heap", default=DEFAULT_HEAP)
    s.add_argument("--timeout", type=float, default=DEFAULT_START_TIMEOUT)
    s.add_argument(
        "--foreground", action="store_true", help="stay attached; Ctrl-C stops the broker"
    )
    p = sub.add_parser("stop", help="stop the broker started from DIR")
    p.add_argument("--dir", required=True)
    p.add_argument("--timeout", type=float, default=DEFAULT_STOP_TIMEOUT)
    st = sub.add_parser("status", help="exit 0 if the broker from DIR is up and serving")
    st.add_argument("--dir", required=True)
    a = ap.parse_args(argv)

    try:
        if a.cmd == "fetch":
            t0 = time.monotonic()
            libs = fetch(a.version)
            _say(f"ready: {libs} ({time.monotonic() - t0:.1f}s)")
            return 0
        if a.cmd == "start":
            fetch(a.version)
            t0 = time.monotonic()
            if a.foreground:
                return _foreground(a)
            b = start(
                a.dir,
                a.port,
                a.controller_port,
                host=a.host,
                version=a.version,
                heap=a.heap,
                timeout=a.timeout,
            )
            _say(f"broker pid {b.pid} ready in {time.monotonic() - t0:.1f}s; log {b.log_file}")
            print(b.bootstrap, flush=True)
            return 0
        if a.cmd == "stop":
            was = stop(a.dir, a.timeout)
            _say("stopped" if was else "no broker was running")
            return 0
        if a.cmd == "status":
            b = Broker.from_dir(a.dir)
            if not b.is_running():
                _say("not running")
                return 1
            why = probe(b.host, b.port)
            _say(f"pid {b.pid} at {b.bootstrap}: " + (why or "serving"))
            return 1 if why else 0
    except BrokerError as e:
        print(f"[kafka_broker] ERROR: {e}", file=sys.stderr, flush=True)
        return 1
    return 2


def _foreground(a: argparse.Namespace) -> int:
    b = make_broker(a.dir, a.port, a.controller_port, host=a.host, version=a.version, heap=a.heap)
    b.start(foreground=True)
    _say(f"broker pid {b.pid} starting on {b.bootstrap}; log {b.log_file}; Ctrl-C stops it")
    try:
        b.wait_ready(a.timeout)
        _say(f"ready: {b.bootstrap}")
        assert b._proc is not None
        return b._proc.wait()
    except KeyboardInterrupt:
        _say("stopping ...")
        return 0
    finally:
        b.stop()


if __name__ == "__main__":
    sys.exit(main())
