"""gnmic (openconfig/gnmic 0.47, a real gNMI client) reads the simulated switch's CONFIG_DB RoCE
tables over gNMI; rocewatch's switch-configuration reader decodes gnmic's event output to the
same per-port configuration as the simulator's own ``switch_config.jsonl`` lines."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from collector.roce_config.switch import SwitchConfigReader
from rocewatch.sim import SimConfig
from rocewatch.sim.config_target import ConfigDbTarget
from rocewatch.sim.fabric import Fabric
from rocewatch.sim.roce_config import ConfigFault, config_db, switch_events
from tests.support.gnmic import need_gnmic

pytestmark = [pytest.mark.slow]


@pytest.fixture(scope="module")
def gnmic() -> Path:
    return need_gnmic()


def ports(reader: SwitchConfigReader) -> dict[str, dict[str, object]]:
    out = {}
    for e in reader.ends():
        d = e.to_dict()
        for k in ("device", "timestamp", "source"):
            d.pop(k, None)
        out[e.port] = d
    return out


@pytest.mark.parametrize("mode", [["get"], ["subscribe", "--mode", "once"]])
def test_gnmic_reads_what_the_simulator_writes(gnmic: Path, mode: list[str]) -> None:
    cfg = SimConfig(nodes=2, nics_per_node=1, spines=2, naming="sonic")
    fab = Fabric(cfg)
    faults = [ConfigFault("pfc_wrong_priority", "leaf-r0-p0")]
    db = config_db(fab, faults, 3)["leaf-r0-p0"]
    with ConfigDbTarget(db) as target:
        res = subprocess.run(
            [str(gnmic), "-a", f"127.0.0.1:{target.port}", "--insecure", "--timeout", "10s",
             *mode, "--target", "CONFIG_DB", *(a for t in db for a in ("--path", t)),
             "--encoding", "json_ietf", "--format", "event"],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
    assert res.returncode == 0, res.stderr
    events = json.loads(res.stdout)  # gnmic prints one JSON array of events
    assert all(ev["tags"]["target"] == "CONFIG_DB" for ev in events)
    theirs = SwitchConfigReader()
    theirs.feed_lines([json.dumps(events)])
    ours = SwitchConfigReader()
    ours.feed_lines(
        json.dumps(ev)
        for ev in switch_events(fab, cfg.start_ns, faults, 3)
        if ev["tags"]["source"].startswith("leaf-r0-p0:")
    )
    got, want = ports(theirs), ports(ours)
    assert set(got) == {"Ethernet0", "Ethernet8", "Ethernet512", "Ethernet520"}
    assert got == want
    assert got["Ethernet0"]["pfc"] == [4] and got["Ethernet0"]["trust"] == "dscp"
    assert theirs.skipped == {}
