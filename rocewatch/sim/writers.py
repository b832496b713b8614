"""Writes a simulated run as a replay scenario directory (CONTRACTS.md section 5).

``switch.jsonl`` holds gnmic "event" objects (section 2): one per switch port and reading group
(interface counters; PFC counters of the lossless priority; the egress queue), counters as
strings as gnmic writes uint64 values, gauges as numbers. ``nic.jsonl`` holds node-agent
snapshots (section 3) with the driver's own counter names, plus a couple of driver counters
rocewatch has no canonical name for. Lines are in emission order, so NIC snapshots that arrive
late stay late. Lines are formatted from precompiled templates: every name in them is plain
ASCII from the simulator's own fabric, escaped once by orjson.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import orjson
import yaml

from collector.inband import write_pcap
from collector.mapping import (
    IF_PORT_TAG,
    NIC_SECTION,
    OPENCONFIG_PATH,
    PRIORITY_TAG,
    QOS_PORT_TAG,
    QUEUE_TAG,
)
from rocewatch.sim.fabric import GNMI_PORT
from rocewatch.sim.inband import IntReportWriter
from rocewatch.sim.simulator import (
    NIC_COUNTERS,
    NIC_EXTRA,
    SW_COUNTERS,
    SimConfig,
    Simulator,
    Tick,
    config_to_dict,
)

SUBSCRIPTION = "fabric"
_IF = [m for m in SW_COUNTERS if m.startswith("port_")]
_PRIO = [m for m in SW_COUNTERS if m.startswith("pfc_")]
_QUEUE_C = [m for m in SW_COUNTERS if m.startswith("queue_")]


def _j(obj: object) -> str:
    return orjson.dumps(obj).decode()


class SwitchWriter:
    """gnmic event lines for one tick of switch readings."""

    def __init__(self, sim: Simulator) -> None:
        fab = sim.fabric
        prio = str(fab.priority)
        ci = {m: i for i, m in enumerate(SW_COUNTERS)}
        self.if_idx = [ci[m] for m in _IF]
        self.prio_idx = [ci[m] for m in _PRIO]
        self.q_idx = [ci[m] for m in _QUEUE_C]
        head = '{"name":"' + SUBSCRIPTION + '","timestamp":%d,"tags":'

        def values(metrics: list[str], quoted: bool) -> str:
            q = '"' if quoted else ""
            return ",".join(f'"{OPENCONFIG_PATH[m]}":{q}%d{q}' for m in metrics)

        self.fmt: list[str] = []
        for p in range(fab.n_ports):
            sw = fab.switches[int(fab.port_switch[p])]
            port = fab.port_name[p]
            base = {"source": f"{sw}:{GNMI_PORT}", "subscription-name": SUBSCRIPTION}
            f_if = head + _j({**base, IF_PORT_TAG: port}) + ',"values":{' + values(_IF, True)
            f_pr = head + _j({**base, QOS_PORT_TAG: port, PRIORITY_TAG: prio}) + ',"values":{'
            f_pr += values(_PRIO, True)
            f_q = head + _j({**base, QOS_PORT_TAG: port, QUEUE_TAG: prio}) + ',"values":{'
            f_q += values(["queue_depth_bytes", "queue_peak_bytes"], False) + ","
            f_q += values(_QUEUE_C, True)
            self.fmt.append(f_if + "}}\n" + f_pr + "}}\n" + f_q + "}}\n")
        self.ports_of = [
            np.flatnonzero(fab.port_switch == s).tolist() for s in range(len(fab.switches))
        ]

    def lines(self, t: Tick) -> str:
        c = t.sw_c
        cols = np.vstack(
            [c[self.if_idx], c[self.prio_idx], t.sw_g.astype(np.uint64), c[self.q_idx]]
        ).T.tolist()
        out = []
        ts = t.sw_ts.tolist()
        fmt = self.fmt
        for s in np.argsort(t.sw_ts, kind="stable").tolist():
            tss = ts[s]
            for p in self.ports_of[s]:
                v = cols[p]
                out.append(fmt[p] % (tss, *v[:8], tss, *v[8:12], tss, *v[12:]))
        return "".join(out)


class NicWriter:
    """Node-agent snapshot lines (CONTRACTS.md section 3) for one tick."""

    def __init__(self, sim: Simulator) -> None:
        fab = sim.fabric
        q = str(fab.priority)
        sec: dict[str, list[tuple[str, int]]] = {"ethtool": [], "hw_counters": []}
        for i, m in enumerate(NIC_COUNTERS):
            section, name = NIC_SECTION[m]
            sec[section].append((name.format(q=q), i))
        n = len(NIC_COUNTERS)
        for i, (section, name) in enumerate(NIC_EXTRA):
            sec[section].append((name, n + i))
        self.order = [i for s in ("ethtool", "hw_counters") for _, i in sec[s]]

        def body(section: str) -> str:
            return ",".join(f'"{name}":%d' for name, _ in sec[section])

        self.fmt = []
        for e in range(fab.n_nics):
            who = _j(
                {
                    "node": fab.nodes[int(fab.nic_node[e])],
                    "nic": fab.rail_nics[int(fab.nic_rail[e])],
                    "netdev": fab.rail_netdevs[int(fab.nic_rail[e])],
                }
            )[1:-1]
            self.fmt.append(
                '{"timestamp":%d,'
                + who
                + ',"speed_mbps":%d,"ethtool":{'
                + body("ethtool")
                + '},"hw_counters":{'
                + body("hw_counters")
                + '},"pcie":{"current_link_speed":'
                '"%.1f GT/s PCIe","max_link_speed":"%.1f GT/s PCIe","current_link_width":%d,'
                '"max_link_width":%d}}\n'
            )

    def _snap(
        self, nics: np.ndarray, ts: np.ndarray, c: np.ndarray, x: np.ndarray, g: np.ndarray
    ) -> list[str]:
        vals = np.vstack([c, x])[self.order].T.tolist()
        gs = g.T.tolist()
        tl = ts.tolist()
        fmt = self.fmt
        return [
            fmt[e] % (tl[j], gs[j][0], *vals[j], *gs[j][1:]) for j, e in enumerate(nics.tolist())
        ]

    def lines(self, t: Tick) -> str:
        emit = t.emit[np.argsort(t.nic_ts[t.emit], kind="stable")]
        out = self._snap(emit, t.nic_ts[emit], t.nic_c[:, emit], t.nic_x[:, emit], t.nic_g[:, emit])
        for late in t.late:
            out += self._snap(late.nics, late.ts, late.c, late.x, late.g)
        return "".join(out)


def write_scenario(
    cfg: SimConfig,
    out_dir: str | Path,
    progress: Callable[[int, int], None] | None = None,
    int_pcap: bool = False,
) -> Path:
    """Simulate ``cfg`` into a replay scenario directory; returns the directory.

    Writes ``topology.yaml``, ``switch.jsonl``, ``nic.jsonl``, ``truth.json`` (the ground
    truth, see ``Simulator.truth``) and ``scenario.json`` (the config). ``progress(done,
    total)`` is called after every tick.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    sim = Simulator(cfg)
    (out / "topology.yaml").write_text(
        yaml.safe_dump(sim.topology.to_dict(), sort_keys=False, width=120)
    )
    sw, nw = SwitchWriter(sim), NicWriter(sim)
    iw = IntReportWriter(sim) if int_pcap else None
    datagrams: list[bytes] = []
    total = sim.n_ticks
    with (out / "switch.jsonl").open("w") as fs, (out / "nic.jsonl").open("w") as fn:
        for t in sim.steps():
            fs.write(sw.lines(t))
            fn.write(nw.lines(t))
            if iw is not None:
                datagrams += iw.datagrams(t)
            if progress is not None:
                progress(t.k + 1, total)
    if iw is not None:
        write_pcap(out / "int.pcap", datagrams, start_ns=cfg.start_ns)
    (out / "truth.json").write_bytes(orjson.dumps(sim.truth(), option=orjson.OPT_INDENT_2))
    meta = config_to_dict(cfg)
    meta["generator"] = "rocewatch.sim"
    meta["n_ticks"] = total
    (out / "scenario.json").write_bytes(orjson.dumps(meta, option=orjson.OPT_INDENT_2))
    return out
