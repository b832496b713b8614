"""PCIeDowngrade on hand-built gauges: a NIC below its maximum PCIe speed or width."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import polars as pl
import pytest

from detectors.pcie_downgrade import PcieDowngradeConfig
from rocewatch.config import Config
from rocewatch.core.errors import ConfigError
from rocewatch.core.model import Alert, conform
from rocewatch.core.topology import Topology
from rocewatch.pipeline import Pipeline
from tests import cadence
from tests.support.restart import restart_pipeline

S = 1_000_000_000
STEP = S // 10
T0 = 1_795_946_400 * S

NODES = [f"gpu-00{i}" for i in range(1, 5)]
TOPO = Topology.from_dict(
    {
        "switches": [{"name": f"leaf-{r}", "role": "leaf", "rail": r} for r in range(2)],
        "nodes": [
            {
                "name": n,
                "nics": [
                    {"nic": f"mlx5_{r}", "switch_port": f"leaf-{r}/Ethernet1/{i + 1}"}
                    for r in range(2)
                ],
            }
            for i, n in enumerate(NODES)
        ],
        "jobs": [{"name": "llm", "tenant": "a", "nodes": NODES}],
    }
)
NICS = [(n, f"mlx5_{r}") for n in NODES for r in range(2)]
# (node, nic, t) -> (speed GT/s, width, max speed, max width)
Pcie = Callable[[str, str, float], tuple[float, float, float, float]]


def gen5(node: str, nic: str, t: float) -> tuple[float, float, float, float]:
    return (32.0, 16.0, 32.0, 16.0)


def feed(
    seconds: float, pcie: Pcie, silent: Callable[[str, float], bool] = lambda n, t: False
) -> Iterator[pl.DataFrame]:
    for i in range(int(seconds * 10) + 1):
        t = i / 10
        ts = T0 + i * STEP + 2_000_000
        rows = []
        for node, nic in NICS:
            if silent(node, t):
                continue
            vals = pcie(node, nic, t)
            for m, v in zip(
                (
                    "nic_pcie_speed_gts",
                    "nic_pcie_width",
                    "nic_pcie_max_speed_gts",
                    "nic_pcie_max_width",
                ),
                vals,
                strict=True,
            ):
                if v == v:  # NaN: the agent could not read it
                    rows.append((ts, node, nic, "", m, v, None))
            rows.append((ts, node, nic, "", "nic_link_speed_mbps", 400_000.0, None))
            rows.append((ts, node, nic, "", "nic_tx_rdma_bytes", float(i * 10**8), i * 10**8))
        yield conform(
            pl.DataFrame(
                rows,
                schema=["ts", "device", "port", "qual", "metric", "value", "raw"],
                orient="row",
            )
        )


def run(
    frames: Iterator[pl.DataFrame],
    cut: int | None = None,
    config: Config | None = None,
    after: Config | None = None,
) -> list[Alert]:
    """Replay ``frames``; with ``cut``, stop after that many and start again from the state
    through the product's checkpoint codec (the service's restart), with the configuration
    ``after`` if given."""
    p = Pipeline(TOPO, config, rollup_s=None)
    p.detectors = [d for d in p.detectors if d.name == "pcie_downgrade"]  # this detector alone
    for n, f in enumerate(frames):
        if n == cut:
            p = restart_pipeline(p, after, only=("pcie_downgrade",))
        p.ingest(f)
        p.advance(int(f["ts"].max()) - p.engine.lateness_ns())  # type: ignore[arg-type]
    p.finish()
    return [a for a in p.all_alerts() if a.name == "PCIeDowngrade"]


def test_speed_downgrade_found_and_resolved() -> None:
    def pcie(node: str, nic: str, t: float) -> tuple[float, float, float, float]:
        if (node, nic) == ("gpu-003", "mlx5_1") and 3.0 <= t < 9.0:
            return (16.0, 16.0, 32.0, 16.0)  # Gen5 trained down to Gen4
        return gen5(node, nic, t)

    alerts = run(feed(12.0, pcie), cut=40)
    assert len(alerts) == 1
    a = alerts[0]
    assert a.labels["node"] == "gpu-003" and a.labels["nic"] == "mlx5_1"
    assert a.labels["severity"] == "warning" and a.labels["job"] == "llm"
    assert a.labels["rail"] == "1"
    # sustained min_duration_s (2 s): startsAt is the read that completed it
    ttd = (a.starts_at - (T0 + 3 * S)) / S
    assert 2.0 <= ttd <= 2.2, ttd
    ev = a.annotations["evidence"]
    assert "16 GT/s x16, maximum 32 GT/s x16" in ev and "~252 Gb/s of 504" in ev, ev
    assert "port 400 Gb/s" in ev
    assert a.ends_at and T0 + 9 * S <= a.ends_at <= T0 + int(10.5 * S)
    # the checkpoint was taken mid-fault (at 4 s: the downgrade seen, not yet sustained), and
    # the restarted detector raised it when an uninterrupted one does (the ttd above)


def test_a_restored_detector_takes_todays_min_duration() -> None:
    """Restarted at 4 s, the downgrade seen since 3 s, with ``min_duration_s`` 4 instead of 2:
    the alert starts after today's 4 s, counted from the read that began it before the stop."""

    def pcie(node: str, nic: str, t: float) -> tuple[float, float, float, float]:
        if (node, nic) == ("gpu-003", "mlx5_1") and 3.0 <= t < 9.0:
            return (16.0, 16.0, 32.0, 16.0)
        return gen5(node, nic, t)

    cfg = Config(detectors={"pcie_downgrade": PcieDowngradeConfig(min_duration_s=4.0)})
    (a,) = run(feed(12.0, pcie), cut=40, after=cfg)
    ttd = (a.starts_at - (T0 + 3 * S)) / S
    assert 4.0 <= ttd <= 4.2, ttd


def test_width_downgrade_found() -> None:
    def pcie(node: str, nic: str, t: float) -> tuple[float, float, float, float]:
        if (node, nic) == ("gpu-001", "mlx5_0") and t >= 1.0:
            return (32.0, 8.0, 32.0, 16.0)
        return gen5(node, nic, t)

    alerts = run(feed(4.0, pcie))
    assert [(a.labels["node"], a.labels["nic"]) for a in alerts] == [("gpu-001", "mlx5_0")]
    assert "32 GT/s x8, maximum 32 GT/s x16" in alerts[0].annotations["evidence"]


def test_transients_gaps_unknowns_and_native_gen4_raise_nothing() -> None:
    """A retrain caught mid-way (below for 0.5 s), a Gen4 NIC at its own maximum in a Gen5
    fleet, a NIC whose maximum is unreadable, and an agent gap: none is a downgrade."""

    def pcie(node: str, nic: str, t: float) -> tuple[float, float, float, float]:
        if (node, nic) == ("gpu-001", "mlx5_1") and 2.0 <= t < 2.5:
            return (8.0, 16.0, 32.0, 16.0)
        if (node, nic) == ("gpu-002", "mlx5_0"):
            return (16.0, 16.0, 16.0, 16.0)
        if (node, nic) == ("gpu-002", "mlx5_1"):
            return (16.0, 16.0, float("nan"), float("nan"))
        return gen5(node, nic, t)

    silent = lambda n, t: n == "gpu-004" and 3.0 <= t < 6.0  # noqa: E731
    assert run(feed(9.0, pcie, silent)) == []


def test_an_agent_gap_does_not_resolve_and_refire_a_downgrade() -> None:
    def pcie(node: str, nic: str, t: float) -> tuple[float, float, float, float]:
        if (node, nic) == ("gpu-004", "mlx5_0"):
            return (16.0, 16.0, 32.0, 16.0)
        return gen5(node, nic, t)

    silent = lambda n, t: n == "gpu-004" and 4.0 <= t < 6.0  # noqa: E731
    alerts = run(feed(8.0, pcie, silent))
    assert len(alerts) == 1 and alerts[0].ends_at == 0
    assert abs((alerts[0].starts_at - T0) / S - 2.0) < 0.1


def test_a_nic_silent_longer_than_stale_s_is_forgotten() -> None:
    def pcie(node: str, nic: str, t: float) -> tuple[float, float, float, float]:
        if (node, nic) == ("gpu-004", "mlx5_0"):
            return (16.0, 16.0, 32.0, 16.0)
        return gen5(node, nic, t)

    silent = lambda n, t: n == "gpu-004" and t >= 3.0  # noqa: E731
    cfg = Config(detectors={"pcie_downgrade": PcieDowngradeConfig(stale_s=1.5)})
    alerts = run(feed(7.0, pcie, silent), config=cfg)
    assert len(alerts) == 1 and T0 + int(4.5 * S) <= alerts[0].ends_at <= T0 + int(6.0 * S)


def test_config_is_validated() -> None:
    with pytest.raises(ConfigError, match="min_duration_s"):
        PcieDowngradeConfig(min_duration_s=0)


# --- cadence: sysfs read every 0.1, 1, 5 or 10 s ----------------------------------------------


def pcie_series(interval: float, fault: tuple[float, float] | None = None) -> list[cadence.Series]:
    """The four PCIe gauges of every NIC read every ``interval`` s (out of step, jittered);
    during ``fault`` gpu-002/mlx5_1's link runs at Gen4."""
    out = []
    for k, (node, nic) in enumerate(NICS):
        down = fault is not None and (node, nic) == ("gpu-002", "mlx5_1")
        a, b = fault or (0.0, 0.0)
        gauges = {
            "nic_pcie_speed_gts": (lambda t, a=a, b=b: 16.0 if a <= t < b else 32.0)
            if down
            else (lambda t: 32.0),
            "nic_pcie_max_speed_gts": lambda t: 32.0,
            "nic_pcie_width": lambda t: 16.0,
            "nic_pcie_max_width": lambda t: 16.0,
        }
        for m, g in gauges.items():
            out.append(
                cadence.Series(
                    node,
                    nic,
                    m,
                    gauge=g,
                    interval=interval,
                    phase=0.002 + 0.19 * (k % 5) % interval,
                    jitter=0.2,
                )
            )
    return out


@pytest.mark.parametrize("interval", [*cadence.CADENCES, 10.0])
def test_downgrade_at_any_cadence(interval: float) -> None:
    onset, until, seconds = cadence.timeline(interval)
    r = cadence.run(TOPO, pcie_series(interval, (onset, until)), seconds, only=("pcie_downgrade",))
    (a,) = r.named("PCIeDowngrade")  # one alert while it lasts: never resolved and re-raised
    assert (a.labels["node"], a.labels["nic"]) == ("gpu-002", "mlx5_1")
    assert 0 < cadence.ttd(a, onset) <= cadence.bound(interval), cadence.ttd(a, onset)
    assert cadence.still_firing_or_ended_after(a, until)
    assert a.ends_at, "resolved at the first reading back at the maximum"


@pytest.mark.parametrize("interval", [*cadence.CADENCES, 10.0])
def test_healthy_links_at_any_cadence(interval: float) -> None:
    r = cadence.run(TOPO, pcie_series(interval), cadence.timeline(interval)[2])
    assert r.named("PCIeDowngrade") == []
