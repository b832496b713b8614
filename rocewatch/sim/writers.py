"""Writes a simulated run as a replay scenario directory (docs/formats.md section 5).

``switch.jsonl`` holds gnmic "event" objects (section 2): one per switch port and reading group
(interface counters; PFC counters of the lossless priority; the egress queue), counters as
strings as gnmic writes uint64 values, gauges as numbers, on the paths of the fabric's
``naming``: OpenConfig, NVIDIA Cumulus (OpenConfig with the Ethernet CRC and unicast packet
counters) or SONiC (COUNTERS_DB fields per port and per ``port:queue``, all values strings,
the port and queue as tags; carrier transitions through OpenConfig). Queue gauges polled on
their own schedule get events of their own. ``nic.jsonl`` holds node-agent
snapshots (section 3) with the driver's own counter names, plus a couple of driver counters
rocewatch has no canonical name for. Lines are in emission order, so NIC snapshots that arrive
late stay late. Lines are formatted from precompiled templates: every name in them is plain
ASCII from the simulator's own fabric, escaped once by orjson.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
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
from rocewatch.core.errors import ConfigError
from rocewatch.sim.fabric import GNMI_PORT
from rocewatch.sim.inband import IntReportWriter
from rocewatch.sim.roce_config import write_roce_config
from rocewatch.sim.simulator import (
    NIC_COUNTERS,
    NIC_EXTRA,
    SW_COUNTERS,
    SW_GAUGES,
    Readings,
    SimConfig,
    Simulator,
    config_to_dict,
)

SUBSCRIPTION = "fabric"
_IF = [m for m in SW_COUNTERS if m.startswith("port_")]
_PRIO = [m for m in SW_COUNTERS if m.startswith("pfc_")]
_QUEUE_C = [m for m in SW_COUNTERS if m.startswith("queue_")]
_CI = {m: i for i, m in enumerate(SW_COUNTERS)}
_GI = {m: i for i, m in enumerate(SW_GAUGES)}

# NVIDIA Cumulus serves OpenConfig, with the Ethernet CRC counter and unicast packet counts
_CUMULUS_PATH = {
    **OPENCONFIG_PATH,
    "port_in_fcs_errors": "/interfaces/interface/ethernet/state/counters/in-crc-errors",
    "port_in_pkts": "/interfaces/interface/state/counters/in-unicast-pkts",
    "port_out_pkts": "/interfaces/interface/state/counters/out-unicast-pkts",
}
# SONiC COUNTERS_DB fields (collector/mappings/sonic.yaml); {q} is the lossless priority
_SONIC_FIELD = {
    "port_in_fcs_errors": "SAI_PORT_STAT_IF_IN_FCS_ERRORS",
    "port_in_errors": "SAI_PORT_STAT_IF_IN_ERRORS",
    "port_in_discards": "SAI_PORT_STAT_IF_IN_DISCARDS",
    "port_in_octets": "SAI_PORT_STAT_IF_IN_OCTETS",
    "port_out_octets": "SAI_PORT_STAT_IF_OUT_OCTETS",
    "port_in_pkts": "SAI_PORT_STAT_IF_IN_UCAST_PKTS",
    "port_out_pkts": "SAI_PORT_STAT_IF_OUT_UCAST_PKTS",
    "pfc_rx_pause_frames": "SAI_PORT_STAT_PFC_{q}_RX_PKTS",
    "pfc_tx_pause_frames": "SAI_PORT_STAT_PFC_{q}_TX_PKTS",
    "pfc_rx_pause_us": "SAI_PORT_STAT_PFC_{q}_RX_PAUSE_DURATION_US",
    "pfc_tx_pause_us": "SAI_PORT_STAT_PFC_{q}_TX_PAUSE_DURATION_US",
    "queue_ecn_marked_pkts": "SAI_QUEUE_STAT_WRED_ECN_MARKED_PACKETS",
    "queue_tx_pkts": "SAI_QUEUE_STAT_PACKETS",
    "queue_dropped_pkts": "SAI_QUEUE_STAT_DROPPED_PACKETS",
    "queue_depth_bytes": "SAI_QUEUE_STAT_CURR_OCCUPANCY_BYTES",
    "queue_peak_bytes": "SAI_QUEUE_STAT_WATERMARK_BYTES",
}
TS = -1  # a value slot that holds the poll's timestamp

# one event: its tags' kind ("if", "prio", "queue") and its values: (path, slot, quoted), a
# slot being a counter (index into SW_COUNTERS) or a gauge (len(SW_COUNTERS) + index)
Event = tuple[str, list[tuple[str, int, bool]]]


def _g(m: str) -> int:
    return len(SW_COUNTERS) + _GI[m]


def switch_events(naming: str, port: str, prio: str) -> dict[str, list[Event]]:
    """The gnmic events of one port's poll, by what the poll reads: ``combined`` (counters and
    queue gauges together), ``counters`` and ``gauges`` (gauges polled on their own)."""
    gauges = ["queue_depth_bytes", "queue_peak_bytes"]
    if naming == "sonic":
        # one COUNTERS_DB key per port (port and PFC fields), one per queue; the port and queue
        # come as tags (as gnmic's event-extract-tags processor takes them from the path).
        # COUNTERS_DB has no carrier transitions: SONiC serves those through OpenConfig.
        def f(m: str, key: str) -> str:
            return f"/COUNTERS/{key}/" + _SONIC_FIELD[m].format(q=prio)

        port_ev: Event = (
            "if",
            [(f(m, port), _CI[m], True) for m in _IF + _PRIO if m in _SONIC_FIELD],
        )
        flap_ev: Event = (
            "if",
            [(OPENCONFIG_PATH["port_carrier_transitions"], _CI["port_carrier_transitions"], True)],
        )
        qkey = f"{port}:{prio}"
        qg = [(f(m, qkey), _g(m), True) for m in gauges]
        qc = [(f(m, qkey), _CI[m], True) for m in _QUEUE_C]
        return {
            "combined": [port_ev, flap_ev, ("queue", qg + qc)],
            "counters": [port_ev, flap_ev, ("queue", qc)],
            "gauges": [("queue", qg)],
        }
    paths = _CUMULUS_PATH if naming == "cumulus" else OPENCONFIG_PATH
    if_ev: Event = ("if", [(paths[m], _CI[m], True) for m in _IF])
    pr_ev: Event = ("prio", [(paths[m], _CI[m], True) for m in _PRIO])
    qg = [(paths[m], _g(m), False) for m in gauges]
    qc = [(paths[m], _CI[m], True) for m in _QUEUE_C]
    return {
        "combined": [if_ev, pr_ev, ("queue", qg + qc)],
        "counters": [if_ev, pr_ev, ("queue", qc)],
        "gauges": [("queue", qg)],
    }


def _j(obj: object) -> str:
    return orjson.dumps(obj).decode()


class SwitchWriter:
    """gnmic event lines for one tick of switch readings, in the fabric's naming."""

    def __init__(self, sim: Simulator) -> None:
        fab = sim.fabric
        prio = str(fab.priority)
        naming = fab.naming
        qos_port = IF_PORT_TAG if naming == "sonic" else QOS_PORT_TAG
        head = '{"name":"' + SUBSCRIPTION + '","timestamp":%d,"tags":'
        self.fmt: dict[str, list[str]] = {"combined": [], "counters": [], "gauges": []}
        self.slots: dict[str, list[int]] = {}
        for p in range(fab.n_ports):
            sw = fab.switches[int(fab.port_switch[p])]
            port = fab.port_name[p]
            base = {"source": f"{sw}:{GNMI_PORT}", "subscription-name": SUBSCRIPTION}
            tags = {
                "if": _j({**base, IF_PORT_TAG: port}),
                "prio": _j({**base, QOS_PORT_TAG: port, PRIORITY_TAG: prio}),
                "queue": _j({**base, qos_port: port, QUEUE_TAG: prio}),
            }
            for what, events in switch_events(naming, port, prio).items():
                text, slots = "", []
                for kind, values in events:
                    vals = ",".join(
                        f'"{path}":' + ('"%d"' if quoted else "%d") for path, _, quoted in values
                    )
                    text += head + tags[kind] + ',"values":{' + vals + "}}\n"
                    slots += [TS] + [slot for _, slot, _ in values]
                self.fmt[what].append(text)
                self.slots[what] = slots  # the same for every port

    def _lines(self, what: str, ports: np.ndarray, ts: np.ndarray, vals: np.ndarray) -> list[str]:
        """``vals``: (slots, rows) uint64, counters then gauges; the TS slots take ``ts``."""
        slots = self.slots[what]
        cols = np.vstack([ts.astype(np.uint64) if s == TS else vals[s] for s in slots]).T.tolist()
        fmt = self.fmt[what]
        return [fmt[p] % tuple(v) for p, v in zip(ports.tolist(), cols, strict=True)]

    def lines(self, r: Readings) -> str:
        n_c = len(SW_COUNTERS)
        if r.gauges_with_counters:
            vals = np.vstack([r.sw_c, r.sw_g.astype(np.uint64)])
            return "".join(self._lines("combined", r.sw_port, r.sw_ts, vals))
        pad_c = np.zeros((n_c, len(r.g_port)), dtype=np.uint64)
        c_lines = self._lines(
            "counters",
            r.sw_port,
            r.sw_ts,
            np.vstack([r.sw_c, np.zeros((len(SW_GAUGES), len(r.sw_port)), dtype=np.uint64)]),
        )
        g_lines = self._lines(
            "gauges", r.g_port, r.g_ts, np.vstack([pad_c, r.sw_g.astype(np.uint64)])
        )
        order = np.argsort(np.concatenate([r.sw_ts, r.g_ts]), kind="stable").tolist()
        both = c_lines + g_lines
        return "".join(both[i] for i in order)


class NicWriter:
    """Node-agent snapshot lines (docs/formats.md section 3) for one tick."""

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

    def lines(self, r: Readings) -> str:
        vals = np.vstack([r.nic_c, r.nic_x])[self.order].T.tolist()
        gs = r.nic_g.T.tolist()
        tl = r.nic_ts.tolist()
        fmt = self.fmt
        return "".join(
            fmt[e] % (tl[j], gs[j][0], *vals[j], *gs[j][1:]) for j, e in enumerate(r.nic.tolist())
        )


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
    write_roce_config(out, cfg, fabric=sim.fabric)  # nic_config.jsonl, switch_config.jsonl
    sw, nw = SwitchWriter(sim), NicWriter(sim)
    if int_pcap and cfg.cadenced:
        raise ConfigError("INT reports are simulated for runs at the default sampling only")
    iw = IntReportWriter(sim) if int_pcap else None
    datagrams: list[bytes] = []
    total = sim.n_ticks

    def readings() -> Iterator[Readings]:
        if cfg.cadenced:
            yield from sim.readings()
            return
        for t in sim.steps():
            if iw is not None:
                datagrams.extend(iw.datagrams(t))
            yield Readings.from_tick(t, sim.fabric.port_switch)

    with (out / "switch.jsonl").open("w") as fs, (out / "nic.jsonl").open("w") as fn:
        for r in readings():
            fs.write(sw.lines(r))
            fn.write(nw.lines(r))
            if progress is not None:
                progress(r.k + 1, total)
    if iw is not None:
        write_pcap(out / "int.pcap", datagrams, start_ns=cfg.start_ns)
    (out / "truth.json").write_bytes(orjson.dumps(sim.truth(), option=orjson.OPT_INDENT_2))
    meta = config_to_dict(cfg)
    meta["generator"] = "rocewatch.sim"
    meta["n_ticks"] = total
    (out / "scenario.json").write_bytes(orjson.dumps(meta, option=orjson.OPT_INDENT_2))
    return out
