"""The join on alerts (rocewatch/alerting/job_paths.py): a fabric alert about a NIC or a port
carries the jobs and ranks that use it; a job alert carries the NICs, ports and fabric alerts
on its path."""

from __future__ import annotations

import polars as pl

from rocewatch.alerting.job_paths import JobPaths
from rocewatch.core.model import Alert
from tests.support.nccl_edges import COMM, T0, topology
from tests.support.restart import through_codec


def joined() -> JobPaths:
    jp = JobPaths(topology())
    # the window engine's rows of nccl_rank_gpu: rank r on gpu-00<r+1>/mlx5_0, GPU 0
    jp.learn(
        pl.DataFrame(
            {
                "device": [f"gpu-00{r + 1}" for r in range(4)],
                "port": [f"rank{r}" for r in range(4)],
                "qual": [f"{COMM}/mlx5_0"] * 4,
                "last": [0.0] * 4,
                "ts": [T0] * 4,
            }
        )
    )
    return jp


def ann(jp: JobPaths, firing: list[dict[str, str]] | None = None, **labels: str) -> dict[str, str]:
    return jp.annotations(labels, firing or [])


def test_fabric_alerts_carry_the_jobs_and_ranks_behind_them() -> None:
    jp = joined()
    a = ann(jp, alertname="PCIeDowngrade", node="gpu-003", nic="mlx5_0")
    assert a == {"jobs": "llm", "ranks": "llm rank 2 (gpu-003 GPU 0 mlx5_0)"}
    # a leaf port: the NIC cabled to it
    a = ann(jp, alertname="FlakyLink", switch="leaf-0", port="Ethernet34")
    assert a["ranks"] == "llm rank 1 (gpu-002 GPU 0 mlx5_0)"
    # a leaf's uplink, or the spine's end of it: every NIC under that leaf
    a = ann(jp, alertname="PFCStorm", switch="spine-0", port="Ethernet2")
    assert a["ranks"] == "llm rank 2 (gpu-003 GPU 0 mlx5_0), llm rank 3 (gpu-004 GPU 0 mlx5_0)"
    a = ann(jp, alertname="ECNCongestion", switch="leaf-0", port="Ethernet1", queue="3")
    assert a["ranks"].startswith("llm rank 0 (gpu-001") and "rank 1 (gpu-002" in a["ranks"]
    # a port nothing is cabled to, or an alert that is not about the fabric: nothing added
    assert ann(jp, alertname="FlakyLink", switch="leaf-0", port="Ethernet9") == {}
    assert ann(jp, alertname="FabricIncident", scope="fabric") == {}
    # the join goes through the product's codec
    again = JobPaths(topology())
    again.restore(through_codec(jp.state()))
    assert again.state() == jp.state()
    assert ann(again, alertname="PCIeDowngrade", node="gpu-003", nic="mlx5_0") == ann(
        jp, alertname="PCIeDowngrade", node="gpu-003", nic="mlx5_0"
    )


def test_job_alerts_carry_their_path_and_the_fabric_alerts_on_it() -> None:
    jp = joined()
    pcie = {"alertname": "PCIeDowngrade", "node": "gpu-003", "nic": "mlx5_0"}
    far = {"alertname": "FlakyLink", "node": "gpu-001", "nic": "mlx5_0"}
    slow = {"alertname": "SlowRank", "node": "gpu-003", "nic": "mlx5_0", "comm": COMM}
    a = ann(jp, [pcie, far], **slow)
    assert a["path_nics"] == "gpu-003/mlx5_0" and a["path_ports"] == "leaf-1/Ethernet33"
    assert a["path_alerts"] == "PCIeDowngrade: nic=mlx5_0, node=gpu-003"
    bw = ann(jp, [pcie], alertname="BusBandwidthDrop", comm=COMM, collective="AllReduce")
    assert bw["path_nics"].count("/mlx5_0") == 4 and bw["path_alerts"].startswith("PCIeDown")
    # an alert that fires later on the path is added to a firing job alert's list
    rec = Alert(labels={**slow}, annotations=dict(a), starts_at=T0)
    late = {"alertname": "TransportErrors", "node": "gpu-003", "nic": "mlx5_0"}
    ev = Alert(labels=dict(late), annotations={}, starts_at=T0 + 5)
    records = {rec.fingerprint: rec, ev.fingerprint: ev}
    jp.annotate([ev], records, lambda: [pcie, late])
    assert rec.annotations["path_alerts"] == (
        "PCIeDowngrade: nic=mlx5_0, node=gpu-003; TransportErrors: nic=mlx5_0, node=gpu-003"
    )
    assert ev.annotations["ranks"] == "llm rank 2 (gpu-003 GPU 0 mlx5_0)"
