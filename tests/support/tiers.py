"""The suite's tiers: what each test needs, marked so that nobody has to remember to.

``python -m pytest -m "not slow"`` is the fast tier: no service, no test over about 2 s.
The full suite (scripts/test-all.sh, what CI runs) needs the real services and skips nothing.

* Markers say what a test needs: ``kafka``, ``postgres``, ``slurm``, ``alertmanager``,
  ``gnmi_peers`` (the Go gNMI tools), ``kube`` (kube-apiserver and etcd), and ``slow``. A test
  that uses one of a service's fixtures gets the service's marker at collection (``SERVICES``),
  and every service marker brings ``slow``: a new test cannot forget them. Tests that are slow
  without a service carry ``pytest.mark.slow`` themselves (a module-level ``pytestmark`` where
  the whole module is).
* A test that needs a service the machine does not offer is skipped, with the command that
  starts it; under CI (the ``CI`` environment variable set, as CI services and
  scripts/test-all.sh set it) a skip is a failure, so a green CI run ran everything.
* A test outside the slow tier that ran longer than ``FAST_BUDGET_S`` is named in the summary
  (it belongs in the slow tier); under CI, one over ``FAST_LIMIT_S`` (30 s;
  ``ROCEWATCH_FAST_LIMIT_S``) fails the run.

tests/conftest.py imports the hooks from here (tests/test_tiers.py loads this module as a
plugin into pytester runs).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Generator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

GO_BIN = Path(os.environ.get("ROCEWATCH_GO_DIR", Path.home() / ".cache/rocewatch/go")) / "bin"
FAST_BUDGET_S = 2.0  # the fast tier's promise per test (set-up + call)
# under CI a fast-tier test this slow fails the run: far enough above the budget that a loaded
# machine does not trip it, low enough that the fast tier cannot quietly grow minutes long
FAST_LIMIT_S = 30.0


def fast_limit_s() -> float:
    return float(os.environ.get("ROCEWATCH_FAST_LIMIT_S", FAST_LIMIT_S))


def ci() -> bool:
    """True under CI: ``CI`` set to anything but empty, 0, false or no."""
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def _pg() -> str:
    if os.environ.get("ROCEWATCH_TEST_PG_URL"):
        return ""
    return "ROCEWATCH_TEST_PG_URL is not set"


def _slurm() -> str:
    nodes = [n for n in os.environ.get("ROCEWATCH_TEST_SLURM_NODES", "").split(",") if n]
    if len(nodes) < 2:
        return "ROCEWATCH_TEST_SLURM_NODES (two nodes of a live slurmctld) is not set"
    if shutil.which("scontrol") is None:
        return "scontrol is not on PATH"
    return ""


def _alertmanager() -> str:
    if shutil.which("prometheus-alertmanager") or shutil.which("alertmanager"):
        return ""
    return "prometheus-alertmanager is not installed"


def _gnmi_peers() -> str:
    missing = [t for t in ("fake_server", "gnmi_cli") if not (GO_BIN / t).exists()]
    return f"{', '.join(missing)} missing in {GO_BIN}" if missing else ""


def _kube() -> str:
    from tests.support.kube import missing  # it imports GO_BIN from here

    return missing()


def _kafka() -> str:
    return ""  # never skipped: the broker fixtures start one or fail with its log


@dataclass(frozen=True)
class Service:
    fixtures: frozenset[str]  # using any of these (directly or through another) needs it
    missing: Callable[[], str]  # why it is not available here ("" when it is)
    start: str  # what gets it
    about: str


SERVICES: dict[str, Service] = {
    "kafka": Service(
        frozenset(
            {
                "kafka_broker",
                "kafka_bootstrap",
                "kafka_topics",
                "restartable_kafka_broker",
                "secure_kafka_broker",
            }
        ),
        _kafka,
        "scripts/kafka_broker.py (started by the fixtures)",
        "a real Kafka broker",
    ),
    "postgres": Service(
        frozenset({"postgres_url"}),
        _pg,
        "bash scripts/services.sh start; source /tmp/rocewatch-services/env.sh",
        "the test PostgreSQL server (ROCEWATCH_TEST_PG_URL)",
    ),
    "slurm": Service(
        frozenset({"slurm_nodes", "slurmd_node"}),
        _slurm,
        "bash scripts/services.sh start; source /tmp/rocewatch-services/env.sh",
        "the test slurmctld and its slurmd (SLURM_CONF, ROCEWATCH_TEST_SLURM_NODES)",
    ),
    "alertmanager": Service(
        frozenset({"alertmanager"}),
        _alertmanager,
        "bash scripts/services.sh install",
        "a real Alertmanager binary (prometheus-alertmanager)",
    ),
    "gnmi_peers": Service(
        frozenset({"gnmi_go_tools", "gnmic"}),  # gnmic: tests/support/gnmic.py checks its own
        _gnmi_peers,
        "bash scripts/go_tools.sh",
        "the gNMI peers scripts/go_tools.sh provides (openconfig's fake_server, gnmi_cli; gnmic)",
    ),
    "kube": Service(
        frozenset({"kube_api"}),
        _kube,
        "bash scripts/services.sh install; bash scripts/go_tools.sh",
        "a real kube-apiserver and kube-controller-manager (scripts/go_tools.sh builds them) "
        "and etcd (Debian's etcd-server)",
    ),
}


# fixtures that take seconds on their own: a test that uses one is slow though it needs no
# service (every user, not only the first: whichever runs first in a tier pays for the fixture)
SLOW_FIXTURES = frozenset(
    {
        "scenario_8n",  # tests/conftest.py's shared scenarios and replays
        "_replay_8n",
        "scenario_16n",
        "_replay_16n",
        "default_run",  # test_sim.py: the default scenario simulated and decoded
        "storm",  # test_clock_guard.py: an 8-node scenario replayed
    }
)

# Slow tests in modules whose owners mark nothing themselves (yet): module file -> test
# functions ("*": all of it), each over the fast tier's budget in a --durations run. A module
# that carries its own marks needs no entry; a slow test missing here shows in the summary.
SLOW_ELSEWHERE: dict[str, frozenset[str]] = {
    "test_ecn_congestion.py": frozenset(
        {
            "test_healthy_dcqcn_marking_stays_silent",
            "test_busy_port_is_judged_against_its_own_normal",
            "test_field_report_queue_and_nic_found_once_at_any_cadence",
        }
    ),
    "test_evaluate.py": frozenset({"test_a_run_is_deterministic_for_its_seed"}),
    "test_inband.py": frozenset({"test_never_raises"}),
    "test_inhibit.py": frozenset(
        {
            "test_a_target_that_fires_before_its_source_is_held_and_still_inhibited",
            "test_a_paused_nics_straggler_is_stored_inhibited_not_notified_nor_drained_"
            "until_the_storm_ends",
            "test_replay_writes_alerts_inhibited_for_their_whole_life_to_inhibited_jsonl",
        }
    ),
    "test_pfc_storm.py": frozenset(
        {
            "test_storm_at_any_cadence",
            "test_healthy_fabric_at_any_cadence",
            "test_storm_sources_at_different_cadences",
        }
    ),
    "test_queue_buildup.py": frozenset(
        {
            "test_field_report_standing_queue_found_once_at_any_cadence",
            "test_bursty_healthy_queues_stay_silent",
            "test_always_busy_uplink_is_judged_against_its_own_normal",
        }
    ),
    "test_real_trace.py": frozenset({"*"}),  # a 12-minute production trace replayed
    "test_sim.py": frozenset(
        {
            "test_healthy_traffic_never_pauses_twice_in_a_row",
            "test_topology_is_rail_optimised_and_valid",
            "test_late_nic_snapshots_and_silent_nodes",
            "test_cadenced_sources_read_on_their_own_intervals_with_jitter_and_loss",
        }
    ),
    "test_straggler.py": frozenset({"test_straggler_at_any_cadence"}),
    "test_transport_errors.py": frozenset({"*"}),  # every cadence of every case
    "test_windows.py": frozenset({"test_two_step_windows_match_the_group_by"}),
}


def _slow_elsewhere(item: pytest.Item) -> bool:
    names = SLOW_ELSEWHERE.get(item.path.name)
    if not names:
        return False
    return "*" in names or getattr(item, "originalname", item.name) in names


def pytest_configure(config: pytest.Config) -> None:
    for name, s in SERVICES.items():
        config.addinivalue_line("markers", f"{name}: needs {s.about}; implies slow")
    config.addinivalue_line(
        "markers",
        "slow: starts or needs a service, or takes more than about 2 s; "
        '`-m "not slow"` is the fast tier',
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark each test with the services its fixtures need, and every such test slow (and
    every test using one of ``SLOW_FIXTURES`` or named in ``SLOW_ELSEWHERE``)."""
    for item in items:
        names = set(getattr(item, "fixturenames", ()))
        for marker, s in SERVICES.items():
            if names & s.fixtures and item.get_closest_marker(marker) is None:
                item.add_marker(marker)
        if item.get_closest_marker("slow") is None and (
            names & SLOW_FIXTURES
            or _slow_elsewhere(item)
            or any(item.get_closest_marker(m) is not None for m in SERVICES)
        ):
            item.add_marker("slow")


def pytest_runtest_setup(item: pytest.Item) -> None:
    """Skip (under CI: fail, see below) a test whose service this machine does not offer."""
    for marker, s in SERVICES.items():
        if item.get_closest_marker(marker) is not None:
            why = s.missing()
            if why:
                pytest.skip(f"needs {s.about}: {why} (get it: {s.start})")


_TOOK = pytest.StashKey[dict[str, float]]()  # per run: each test's set-up and call, seconds


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[Any]
) -> Generator[None, Any, None]:
    outcome = yield
    rep: pytest.TestReport = outcome.get_result()
    if rep.when != "teardown":  # the last test of a run tears the session's fixtures down
        took = item.config.stash.setdefault(_TOOK, {})
        took[item.nodeid] = took.get(item.nodeid, 0.0) + rep.duration
    if rep.skipped and ci() and not hasattr(rep, "wasxfail"):
        # a skip that nobody sees is a test that does not run: under CI it fails the run
        reason = rep.longrepr[2] if isinstance(rep.longrepr, tuple) else str(rep.longrepr)
        rep.outcome = "failed"
        rep.longrepr = f"skipped under CI (CI={os.environ.get('CI')}): {reason}"


def _overdue(
    config: pytest.Config, items: list[pytest.Item], budget: float = FAST_BUDGET_S
) -> list[tuple[str, float]]:
    """Tests outside the slow tier that took longer than ``budget`` seconds."""
    seconds = config.stash.get(_TOOK, {})
    out = []
    for item in items:
        took = seconds.get(item.nodeid, 0.0)
        if took > budget and item.get_closest_marker("slow") is None:
            out.append((item.nodeid, took))
    return sorted(out, key=lambda x: -x[1])


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    items = getattr(terminalreporter._session, "items", None) or []
    late = _overdue(config, items)
    if late:
        terminalreporter.section("tests over the fast tier's budget, not marked slow")
        for nodeid, took in late:
            terminalreporter.line(f"{took:6.1f} s  {nodeid}")
        terminalreporter.line(
            f"(more than {FAST_BUDGET_S:.0f} s: mark them pytest.mark.slow, or make them faster)"
        )


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if not ci():
        return
    tr = session.config.pluginmanager.get_plugin("terminalreporter")
    # a module skipped at collection has no test report to turn into a failure
    skipped = len(tr.stats.get("skipped", [])) if tr is not None else 0
    over = _overdue(session.config, session.items, fast_limit_s())
    if skipped or over:
        if tr is not None:
            if skipped:
                tr.write_line(f"CI: {skipped} skipped (collection): a CI run skips nothing")
            for nodeid, took in over:
                tr.write_line(f"CI: {nodeid} took {took:.1f} s outside the slow tier")
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
