"""Shared pytest fixtures for rocewatch.

Tiers (tests/support/tiers.py): ``python -m pytest -m "not slow"`` is the fast tier (no service,
no test over about 2 s); ``bash scripts/test-all.sh`` runs everything with the real services and
``CI`` set, under which a skipped test fails the run. A test using a service fixture below is
marked with that service and ``slow`` automatically.
"""

from __future__ import annotations

# =============================================================================
# Kafka fixtures: a REAL Apache Kafka 4.x broker (scripts/kafka_broker.py)
#
#   kafka_broker            session: the Broker (.bootstrap "127.0.0.1:PORT", .restart(), .stop(),
#                           .pid, .log_tail())
#   kafka_bootstrap         function: the bootstrap string
#   kafka_topics            function: unique topic names per test; kafka_topics("alerts") -> name,
#                           kafka_topics.create("alerts", partitions=4) -> name (created, visible)
#   restartable_kafka_broker function: a broker the test may restart/kill (the session one when it
#                           is local, else a private local one)
#   new_topic_prefix(label) plain helper: "rwtest.<label>.<uuid>" for code outside fixtures
#
# ROCEWATCH_KAFKA_BOOTSTRAP=host:port uses that external broker instead of starting one.
# Tests that need Kafka are never skipped: if the broker cannot start they fail with its log tail.
# Tests using these fixtures are marked kafka and slow automatically (tests/support/tiers.py).
# Other fixtures: append them in their own block below; hooks belong in tests/support/tiers.py.
# =============================================================================
import atexit
import contextlib
import importlib.util
import os
import re
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

# the tiers (tests/support/tiers.py): markers by fixture, skip-fails-under-CI, the fast budget
from tests.support.tiers import (  # noqa: F401  (pytest finds hooks by name here)
    pytest_collection_modifyitems,
    pytest_configure,
    pytest_runtest_makereport,
    pytest_runtest_setup,
    pytest_sessionfinish,
    pytest_terminal_summary,
)

_KAFKA_SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "kafka_broker.py"
KAFKA_BOOTSTRAP_ENV = "ROCEWATCH_KAFKA_BOOTSTRAP"


def load_kafka_broker_module() -> ModuleType:
    """scripts/kafka_broker.py as module ``kafka_broker`` (loaded by path, kept in sys.modules)."""
    mod = sys.modules.get("kafka_broker")
    if mod is not None and getattr(mod, "__file__", None) == str(_KAFKA_SCRIPT):
        return mod
    spec = importlib.util.spec_from_file_location("kafka_broker", _KAFKA_SCRIPT)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["kafka_broker"] = mod  # dataclasses look their module up here
    spec.loader.exec_module(mod)
    return mod


def new_topic_prefix(label: str = "t") -> str:
    """A unique, legal topic-name prefix: ``rwtest.<label>.<12 hex>``."""
    label = re.sub(r"[^A-Za-z0-9_-]+", "_", label).strip("_")[:80] or "t"
    return f"rwtest.{label}.{uuid.uuid4().hex[:12]}"


class ExternalKafkaBroker:
    """Stands in for a Broker when ROCEWATCH_KAFKA_BOOTSTRAP names one we did not start."""

    external = True
    pid = None

    def __init__(self, bootstrap: str) -> None:
        self.bootstrap = bootstrap

    def is_running(self) -> bool:
        return True

    def log_tail(self, lines: int = 60) -> str:
        return f"(external broker {self.bootstrap}: no log here)"

    def restart(self, *a: Any, **k: Any) -> ExternalKafkaBroker:
        raise RuntimeError(
            f"cannot restart the external broker {self.bootstrap}; use restartable_kafka_broker"
        )

    def stop(self, *a: Any, **k: Any) -> None:
        raise RuntimeError(f"cannot stop the external broker {self.bootstrap}")


def _start_local_broker(directory: Path) -> Any:
    kb = load_kafka_broker_module()
    problem = ""
    try:
        kb.fetch(quiet=True)
        broker = kb.start(
            directory, port=0, timeout=float(os.environ.get("ROCEWATCH_KAFKA_START_TIMEOUT", "90"))
        )
    except kb.BrokerError as e:
        problem = str(e)
    except Exception as e:
        problem = f"{type(e).__name__}: {e}\n{kb.tail(directory / 'broker.log')}"
    if problem:  # failed outside the except block: no chained traceback noise
        pytest.fail(f"could not start the Kafka broker in {directory}: {problem}", pytrace=False)
    atexit.register(_stop_quietly, broker)  # if a finalizer never runs (e.g. interpreter exit)
    return broker


def _stop_quietly(broker: Any) -> None:
    with contextlib.suppress(Exception):
        if broker.is_running():
            broker.stop()


def _wait_external(bootstrap: str, timeout: float = 60.0) -> None:
    kb = load_kafka_broker_module()
    host, _, port = bootstrap.split(",")[0].rpartition(":")
    deadline = time.monotonic() + timeout
    reason = ""
    while time.monotonic() < deadline:
        reason = kb.probe(host or "127.0.0.1", int(port)) or ""
        if not reason:
            return
        time.sleep(0.5)
    pytest.fail(
        f"external Kafka {bootstrap} ({KAFKA_BOOTSTRAP_ENV}) not reachable: {reason}", pytrace=False
    )


@pytest.fixture(scope="session")
def kafka_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """The session's Kafka broker: ``.bootstrap``, ``.restart()``, ``.stop()``, ``.pid``, ..."""
    external = os.environ.get(KAFKA_BOOTSTRAP_ENV, "").strip()
    if external:
        _wait_external(external)
        yield ExternalKafkaBroker(external)
        return
    broker = _start_local_broker(tmp_path_factory.mktemp("kafka"))
    try:
        yield broker
    finally:
        _stop_quietly(broker)


@pytest.fixture
def kafka_bootstrap(kafka_broker: Any) -> str:
    """``"127.0.0.1:PORT"`` of a running broker (started again if an earlier test left it down)."""
    if not kafka_broker.external and not kafka_broker.is_running():
        kb = load_kafka_broker_module()
        problem = ""
        try:
            kafka_broker.start()
        except kb.BrokerError as e:
            problem = str(e)
        if problem:
            pytest.fail(f"could not bring the Kafka broker back up: {problem}", pytrace=False)
    return str(kafka_broker.bootstrap)


@pytest.fixture
def restartable_kafka_broker(
    kafka_broker: Any, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Any]:
    """A local broker this test may restart or kill; it is running again when the test ends."""
    if not kafka_broker.external:
        yield kafka_broker
        if not kafka_broker.is_running():
            with contextlib.suppress(Exception):
                kafka_broker.start()
        return
    broker = _start_local_broker(tmp_path_factory.mktemp("kafka-private"))
    try:
        yield broker
    finally:
        _stop_quietly(broker)


class KafkaTopics:
    """Unique topic names for one test: ``topics("alerts")`` gives the same name on every call."""

    def __init__(self, bootstrap: str, label: str) -> None:
        self.bootstrap = bootstrap
        self.prefix = new_topic_prefix(label)
        self.created: list[str] = []

    def __call__(self, name: str = "t") -> str:
        return f"{self.prefix}.{name}"

    def create(
        self, name: str = "t", partitions: int = 4, timeout: float = 30.0, **configs: str
    ) -> str:
        """Create ``self(name)`` with ``partitions`` partitions; wait until all have a leader."""
        from kafka import KafkaAdminClient
        from kafka.admin import NewTopic

        topic = self(name)
        admin = KafkaAdminClient(
            bootstrap_servers=self.bootstrap,
            client_id="rwtest-admin",
            request_timeout_ms=int(timeout * 1000),
        )
        try:
            admin.create_topics(
                [
                    NewTopic(
                        topic,
                        num_partitions=partitions,
                        replication_factor=1,
                        topic_configs={k.replace("_", "."): v for k, v in configs.items()},
                    )
                ],
                timeout_ms=int(timeout * 1000),
            )
            deadline = time.monotonic() + timeout
            while True:
                desc = admin.describe_topics([topic])
                parts = desc[0].get("partitions") or [] if desc else []
                if (
                    desc
                    and desc[0].get("error_code", 0) == 0
                    and len(parts) == partitions
                    and all(
                        p.get("leader_id", p.get("leader", -1)) >= 0
                        for p in parts  # kafka-python 3.x / 2.x
                    )
                ):
                    break
                if time.monotonic() > deadline:
                    raise TimeoutError(f"topic {topic} not ready after {timeout}s: {desc}")
                time.sleep(0.2)
        finally:
            admin.close()
        self.created.append(topic)
        return topic


@pytest.fixture
def kafka_topics(kafka_bootstrap: str, request: pytest.FixtureRequest) -> KafkaTopics:
    """Per-test unique topic names (``rwtest.<test>.<uuid>.<name>``) and a ``create`` helper."""
    return KafkaTopics(kafka_bootstrap, request.node.name)


# ============================ end of Kafka fixtures ===========================


# ==================== Secured Kafka: TLS and SASL/SCRAM (real broker) =========================
#
#   secure_kafka_broker     session: a second local broker with listeners PLAINTEXT, SSL and
#                           SASL_SSL (SCRAM-SHA-512 and SCRAM-SHA-256 enabled), a test CA and
#                           broker certificate (tests/kafka_secure.py), SCRAM users from
#                           SECURE_KAFKA_USERS. Attributes: .plaintext_bootstrap, .ssl_bootstrap,
#                           .sasl_ssl_bootstrap, .pki.ca_file, .users. Started on first use only.
# =============================================================================================
SECURE_KAFKA_USERS = {"rocewatch": "Wq8-rocewatch-scram-pw-7Zt", "reader": "reader-pw-4Hk"}


@pytest.fixture(scope="session")
def secure_kafka_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    import kafka_secure  # tests/ is on sys.path (rootdir conftest)

    kb = load_kafka_broker_module()
    directory = tmp_path_factory.mktemp("kafka-secure")
    problem = ""
    try:
        kb.fetch(quiet=True)
        sb = kafka_secure.start_secure_broker(
            kb,
            directory,
            SECURE_KAFKA_USERS,
            timeout=float(os.environ.get("ROCEWATCH_KAFKA_START_TIMEOUT", "90")),
        )
    except kb.BrokerError as e:
        problem = str(e)
    if problem:
        pytest.fail(f"could not start the secured Kafka broker: {problem}", pytrace=False)
    atexit.register(_stop_quietly, sb.broker)
    try:
        yield sb
    finally:
        _stop_quietly(sb.broker)


# ==================== The other services: PostgreSQL, Slurm, the Go gNMI tools ================
#
#   postgres_url        session: the test server's SQLAlchemy URL (ROCEWATCH_TEST_PG_URL); a test
#                       that wants a database of its own makes one (tests/pg_fresh.py)
#   slurm_nodes         session: two node names of the test slurmctld (ROCEWATCH_TEST_SLURM_NODES)
#   slurmd_node         session: the node with a live slurmd, where jobs run
#   gnmi_go_tools       session: the directory holding openconfig's fake_server and gnmi_cli
#   kube_api            session: kube-apiserver + etcd on 127.0.0.1 (tests/support/kube.py)
#
# A test using one is marked postgres / slurm / gnmi_peers / kube and slow (tests/support/tiers.py),
# and is skipped, or under CI fails, where the service is missing (scripts/services.sh start).
# ==============================================================================================


@pytest.fixture(scope="session")
def postgres_url() -> str:
    return os.environ["ROCEWATCH_TEST_PG_URL"]


@pytest.fixture(scope="session")
def slurm_nodes() -> tuple[str, str]:
    a, b = [n for n in os.environ["ROCEWATCH_TEST_SLURM_NODES"].split(",") if n][:2]
    return a, b


@pytest.fixture(scope="session")
def slurmd_node(slurm_nodes: tuple[str, str]) -> str:
    node = os.environ.get("ROCEWATCH_TEST_SLURMD_NODE", "")
    if not node:
        pytest.skip("needs ROCEWATCH_TEST_SLURMD_NODE (a node with a live slurmd)")
    return node


@pytest.fixture(scope="session")
def gnmi_go_tools() -> Path:
    from tests.support.tiers import GO_BIN

    return GO_BIN


@pytest.fixture(scope="session")
def kube_api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A real kube-apiserver on etcd, 127.0.0.1, for the whole run (tests/support/kube.py)."""
    from tests.support.kube import running_cluster

    yield from running_cluster(tmp_path_factory)


# ==================== Shared scenarios: simulated and replayed once per run ====================
#
#   scenario_8n         session: default_scenario(nodes=8, duration_s=30, seed=3) written to a
#                       directory (topology.yaml, switch.jsonl, nic.jsonl, truth.json)
#   replay_8n           function: replay(scenario_8n) (the run's one replay; a deep copy per test,
#                       so a test that changes it changes nothing for the next)
#   scenario_16n        session: default_scenario(nodes=16, duration_s=20, seed=1)
#   replay_16n          function: replay(scenario_16n), the same way
#
# The Kafka, scale-out, sink, notify, Alertmanager and Grafana tests compare against these:
# simulating and replaying each once per run instead of once per module. Treat the directories
# as read-only (copy a file before changing it).
# ==============================================================================================


def _scenario(factory: pytest.TempPathFactory, name: str, **kw: Any) -> Path:
    from rocewatch.sim import write_scenario
    from rocewatch.sim.scenarios import default_scenario

    d = factory.mktemp(name)
    write_scenario(default_scenario(**kw), d)
    return d


def _replayed(scenario: Path, factory: pytest.TempPathFactory) -> Any:
    from rocewatch.replay import replay

    res = replay(scenario, factory.mktemp(f"{scenario.name}-replay"))
    assert res.alerts, "the default scenario has faults: replay must find some"
    assert res.actions, "the default scenario has culprits: replay must decide drains"
    return res


@pytest.fixture(scope="session")
def scenario_8n(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _scenario(tmp_path_factory, "scenario-8n", nodes=8, duration_s=30.0, seed=3)


@pytest.fixture(scope="session")
def _replay_8n(scenario_8n: Path, tmp_path_factory: pytest.TempPathFactory) -> Any:
    return _replayed(scenario_8n, tmp_path_factory)


@pytest.fixture
def replay_8n(_replay_8n: Any) -> Any:
    import copy

    return copy.deepcopy(_replay_8n)


@pytest.fixture
def scenario(scenario_8n: Path) -> Path:
    """The Kafka modules' scenario: the run's shared 8-node one (a module with a scenario of its
    own defines ``scenario`` itself, which overrides this)."""
    return scenario_8n


@pytest.fixture
def replay_result(replay_8n: Any) -> Any:
    """The replay of ``scenario`` (a copy of the run's one)."""
    return replay_8n


@pytest.fixture(scope="session")
def scenario_16n(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _scenario(tmp_path_factory, "scenario-16n", nodes=16, duration_s=20.0, seed=1)


@pytest.fixture(scope="session")
def _replay_16n(scenario_16n: Path, tmp_path_factory: pytest.TempPathFactory) -> Any:
    return _replayed(scenario_16n, tmp_path_factory)


@pytest.fixture
def replay_16n(_replay_16n: Any) -> Any:
    import copy

    return copy.deepcopy(_replay_16n)


# ==================== Recordings by name: simulated and replayed once per run ==================
#
#   recordings          session: a SimCache. .scenario(name, nodes, duration_s, seed) -> the
#                       directory of SCENARIOS[name](...) written once per run; .replay(same) ->
#                       (out_dir, ReplayResult) of its replay with the default configuration,
#                       once per run (a deep copy of the result per call)
#
# The golden cases, the clock guard and the detector-reads tests use the same few recordings
# (tests/golden/*/case.yaml): each is simulated, and replayed with the default configuration,
# once per run instead of once per test. Treat the directories as read-only.
# ==============================================================================================


class SimCache:
    """Scenarios from ``rocewatch.sim.scenarios.SCENARIOS`` and their default replays, made on
    first use and kept for the run."""

    def __init__(self, factory: pytest.TempPathFactory) -> None:
        self._factory = factory
        self._dirs: dict[tuple[str, int, float, int], Path] = {}
        self._replays: dict[tuple[str, int, float, int], tuple[Path, Any]] = {}

    def scenario(self, name: str, nodes: int, duration_s: float, seed: int) -> Path:
        key = (name, nodes, float(duration_s), seed)
        if key not in self._dirs:
            from rocewatch.sim import write_scenario
            from rocewatch.sim.scenarios import SCENARIOS

            d = self._factory.mktemp(f"{name}-n{nodes}-{duration_s:g}s-seed{seed}")
            write_scenario(SCENARIOS[name](nodes=nodes, duration_s=duration_s, seed=seed), d)
            self._dirs[key] = d
        return self._dirs[key]

    def replay(self, name: str, nodes: int, duration_s: float, seed: int) -> tuple[Path, Any]:
        """The replay's output directory and a copy of its result (a test may change it)."""
        import copy

        from rocewatch.replay import replay

        key = (name, nodes, float(duration_s), seed)
        if key not in self._replays:
            d = self.scenario(name, nodes, duration_s, seed)
            out = self._factory.mktemp(f"{d.name}-replay")
            self._replays[key] = (out, replay(d, out))
        out, res = self._replays[key]
        return out, copy.deepcopy(res)


@pytest.fixture(scope="session")
def recordings(tmp_path_factory: pytest.TempPathFactory) -> SimCache:
    return SimCache(tmp_path_factory)


# ==================== Kafka topics for a shared run ===========================================
#
#   shared_kafka_topics session: label -> KafkaTopics on the session's broker, for a fixture
#                       wider than one test (a module's run that several tests compare with)
# ==============================================================================================


@pytest.fixture(scope="session")
def shared_kafka_topics(kafka_broker: Any) -> Any:
    def make(label: str) -> KafkaTopics:
        return KafkaTopics(str(kafka_broker.bootstrap), label)

    return make
