"""The devices' counters: which each switch port and NIC reports, where they start, how they
are read within a tick, and how one tick's per-direction physics becomes their increments.

Every counter is a cumulative 64-bit value. A switch port reads its counters off the two cable
directions it sends and receives on, a NIC off its own cable's two directions, so both ends of a
cable always agree (the NIC's ``tx_prio3_pause_duration`` is its leaf port's ``pfc_rx_pause_us``).

>>> len(SW_COUNTERS), len(NIC_COUNTERS), SW_GAUGES
(15, 23, ('queue_depth_bytes', 'queue_peak_bytes'))
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from rocewatch.sim.faults import Fault, PfcStorm

if TYPE_CHECKING:
    from rocewatch.sim.config import SimConfig
    from rocewatch.sim.fabric import Fabric

NS = 1_000_000_000
U64 = np.uint64

SW_COUNTERS = (
    "port_in_fcs_errors",
    "port_in_errors",
    "port_in_discards",
    "port_carrier_transitions",
    "port_in_octets",
    "port_out_octets",
    "port_in_pkts",
    "port_out_pkts",
    "pfc_rx_pause_frames",
    "pfc_tx_pause_frames",
    "pfc_rx_pause_us",
    "pfc_tx_pause_us",
    "queue_ecn_marked_pkts",
    "queue_tx_pkts",
    "queue_dropped_pkts",
)
SW_GAUGES = ("queue_depth_bytes", "queue_peak_bytes")
NIC_COUNTERS = (
    "nic_rx_pause_frames",
    "nic_tx_pause_frames",
    "nic_rx_pause_us",
    "nic_tx_pause_us",
    "nic_tx_pause_storm_warnings",
    "nic_tx_pause_storm_errors",
    "nic_rx_crc_errors",
    "nic_rx_symbol_errors",
    "nic_rx_corrected_bits",
    "nic_rx_uncorrectable",
    "nic_link_down_events",
    "nic_rx_bytes",
    "nic_tx_bytes",
    "nic_rx_rdma_bytes",
    "nic_tx_rdma_bytes",
    "nic_ecn_marked_pkts",
    "nic_cnp_sent",
    "nic_cnp_handled",
    "nic_out_of_sequence",
    "nic_packet_seq_err",
    "nic_local_ack_timeout",
    "nic_rnr_nak_retry_err",
    "nic_implied_nak_seq_err",
)
NIC_GAUGES = (
    "nic_link_speed_mbps",
    "nic_pcie_speed_gts",
    "nic_pcie_max_speed_gts",
    "nic_pcie_width",
    "nic_pcie_max_width",
)
# driver counters with no canonical name: written to nic.jsonl only ("unknown counters are kept")
NIC_EXTRA = (("ethtool", "rx_discards_phy"), ("hw_counters", "out_of_buffer"))

_SC = {m: i for i, m in enumerate(SW_COUNTERS)}
_NC = {m: i for i, m in enumerate(NIC_COUNTERS)}


def initial_counters(
    rng: np.random.Generator, n_ports: int, n_nics: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The counters' values at the start of a run (switch ports, NICs, the NICs' driver
    extras): devices have been up for a while."""
    P, E = n_ports, n_nics
    up_s = rng.uniform(3600, 30 * 86400, (1, P))
    scale = np.zeros((len(SW_COUNTERS), 1))
    for m, v in (
        ("port_in_octets", 2e9),
        ("port_out_octets", 2e9),
        ("port_in_pkts", 5e5),
        ("port_out_pkts", 5e5),
        ("queue_tx_pkts", 5e5),
        ("pfc_rx_pause_frames", 2),
        ("pfc_tx_pause_frames", 2),
        ("pfc_rx_pause_us", 50),
        ("pfc_tx_pause_us", 50),
        ("queue_ecn_marked_pkts", 50),
        ("port_carrier_transitions", 1e-6),
    ):
        scale[_SC[m]] = v
    sw_init = np.floor(scale * up_s * rng.uniform(0.5, 1.0, (len(SW_COUNTERS), P))).astype(U64)
    up_n = rng.uniform(3600, 30 * 86400, (1, E))
    nscale = np.zeros((len(NIC_COUNTERS), 1))
    for m, v in (
        ("nic_rx_bytes", 2e9),
        ("nic_tx_bytes", 2e9),
        ("nic_rx_rdma_bytes", 1.9e9),
        ("nic_tx_rdma_bytes", 1.9e9),
        ("nic_rx_pause_frames", 2),
        ("nic_tx_pause_frames", 1),
        ("nic_rx_pause_us", 50),
        ("nic_tx_pause_us", 20),
        ("nic_rx_corrected_bits", 2e5),
        ("nic_ecn_marked_pkts", 50),
        ("nic_cnp_sent", 25),
        ("nic_cnp_handled", 25),
        ("nic_out_of_sequence", 20),
        ("nic_link_down_events", 1e-6),
    ):
        nscale[_NC[m]] = v
    nic_init = np.floor(nscale * up_n * rng.uniform(0.5, 1.0, (len(NIC_COUNTERS), E))).astype(U64)
    nic_x_init = np.floor(rng.uniform(0, 50, (len(NIC_EXTRA), E))).astype(U64)
    return sw_init, nic_init, nic_x_init


def read_counters(
    cum: np.ndarray,
    inc: np.ndarray,
    off: np.ndarray,
    cols: np.ndarray,
    frac: np.ndarray,
    clears: list[tuple[float, np.ndarray]],
) -> np.ndarray:
    """Cumulative counters of ``cols`` read ``frac`` of the way through a tick whose increments
    are ``inc``; a clear ``(at, cleared)`` ``at`` that share of the tick restarts the columns
    it hits from that moment."""
    out = cum[:, cols] + np.floor(inc[:, cols] * frac).astype(U64) - off[:, cols]
    for at, cleared in clears:
        hit = np.isin(cols, cleared) & (frac >= at)
        if hit.any():
            cc = cols[hit]
            base = cum[:, cc] + np.floor(inc[:, cc] * at).astype(U64)
            out[:, hit] = cum[:, cc] + np.floor(inc[:, cc] * frac[hit]).astype(U64) - base
    return out


def place_wrap(
    cfg: SimConfig,
    fab: Fabric,
    faults: Sequence[Fault],
    rng: np.random.Generator,
    line_bps: float,
    sw_init: np.ndarray,
) -> dict[str, Any] | None:
    """Start one busy leaf port's in-octets (in ``sw_init``) just below 2^64, so it wraps early
    in the run; returns the wrap as the truth lists it (None: no port to wrap)."""
    busy: set[int] = set()
    busy_leaves: set[int] = set()
    for f in faults:
        node = getattr(f, "node", None)
        if node in fab.node_index:
            busy.add(fab.node_index[node])
        if isinstance(f, PfcStorm) and f.origin == "switch":
            busy_leaves.add(fab.leaves.index(str(f.switch)))
        elif isinstance(f, PfcStorm):
            e = fab.nic_index(str(f.node), str(f.nic))
            busy |= {int(i) for i in np.flatnonzero(fab.job_of_node == fab.nic_job[e])}
    busy |= {fab.node_index[n] for n in cfg.no_agent_nodes}
    cand = [
        e
        for e in range(fab.n_nics)
        if fab.nic_job[e] >= 0
        and int(fab.nic_node[e]) not in busy
        and int(fab.nic_leaf[e]) not in busy_leaves
    ]
    if not cand:
        return None
    e = int(rng.choice(cand))
    ahead = int(line_bps * 0.5 * max(0.2 * cfg.duration_s, cfg.interval_s * 3))
    start = (1 << 64) - ahead
    sw_init[_SC["port_in_octets"], e] = U64(start)
    return {
        "id": "CounterWrap-1",
        "kind": "CounterWrap",
        "labels": fab.port_labels(e),
        "metric": "port_in_octets",
        "initial_raw": start,
        "note": f"starts at 2^64 - {ahead} bytes: wraps once the port received that",
    }


@dataclass
class Carried:
    """One tick's physics, per cable direction (``D``) and per NIC (``E``): what the counters
    are read off."""

    sent: np.ndarray  # (D,) bytes that passed
    pkts: np.ndarray  # (D,) packets offered (data plus the reverse's ACKs), after pauses
    frames: np.ndarray  # (D,) PFC pause frames the receiver sent against it
    pause_us: np.ndarray  # (D,) microseconds its sender was paused
    q_marks: np.ndarray  # (D,) ECN marks the switch queue counted
    drops: np.ndarray  # (D,) packets the egress queue dropped
    depth: np.ndarray  # (D,) egress queue depth (bytes)
    peak: np.ndarray  # (D,) egress queue peak (bytes)
    fcs: np.ndarray  # (D,) FCS errors at its receiver
    symbol: np.ndarray  # (D,) symbol errors
    corrected: np.ndarray  # (D,) FEC-corrected bits
    uncorrectable: np.ndarray  # (D,) FEC-uncorrectable codewords
    carrier: np.ndarray  # (cables,) carrier transitions
    link_down: np.ndarray  # (E,) link-down events
    warn: np.ndarray  # (E,) pause-storm warnings
    ecn: np.ndarray  # (E,) ECN-marked packets received
    cnp: np.ndarray  # (E,) CNPs sent
    handled: np.ndarray  # (E,) CNPs handled
    transport: np.ndarray  # (5, E) out_of_sequence, packet_seq_err, ack timeouts, rnr, implied
    oob_lam: np.ndarray  # (E,) mean out_of_buffer per tick


def switch_increments(
    fab: Fabric, d: Carried, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """Each switch port's counter increments (``SW_COUNTERS`` x ports) and queue gauges
    (``SW_GAUGES`` x ports) over the tick, read off the directions it receives and sends on."""
    P = fab.n_ports
    o, i = fab.port_out_dir, fab.port_in_dir
    sent_i = np.rint(d.sent)
    pkts_i = np.rint(d.pkts)
    sw = np.empty((len(SW_COUNTERS), P))
    sw[0] = d.fcs[i]
    sw[1] = d.fcs[i]
    sw[2] = rng.poisson(1e-4, P)
    sw[3] = d.carrier[fab.port_cable]
    sw[4] = sent_i[i]
    sw[5] = sent_i[o]
    sw[6] = pkts_i[i]
    sw[7] = pkts_i[o]
    sw[8] = d.frames[o]
    sw[9] = d.frames[i]
    sw[10] = d.pause_us[o]
    sw[11] = d.pause_us[i]
    sw[12] = d.q_marks[o]
    sw[13] = np.rint(d.pkts[o] * 0.985)
    sw[14] = d.drops[o]
    sw_g = np.stack([d.depth[o], d.peak[o]])
    return sw.astype(U64), sw_g


def nic_increments(
    fab: Fabric, d: Carried, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """Each NIC's counter increments (``NIC_COUNTERS`` x NICs) and its driver extras
    (``NIC_EXTRA`` x NICs) over the tick: its cable's receive and send directions, its own
    transport and congestion control."""
    E = fab.n_nics
    sent_i = np.rint(d.sent)
    n_rx, n_tx = slice(1, 2 * E, 2), slice(0, 2 * E, 2)
    nic = np.empty((len(NIC_COUNTERS), E))
    nic[0] = d.frames[n_tx]
    nic[1] = d.frames[n_rx]
    nic[2] = d.pause_us[n_tx]
    nic[3] = d.pause_us[n_rx]
    nic[4] = d.warn
    nic[5] = 0
    nic[6] = d.fcs[n_rx]
    nic[7] = d.symbol[n_rx]
    nic[8] = d.corrected[n_rx]
    nic[9] = d.uncorrectable[n_rx]
    nic[10] = d.link_down
    nic[11] = sent_i[n_rx]
    nic[12] = sent_i[n_tx]
    nic[13] = np.rint(d.sent[n_rx] * 0.985)
    nic[14] = np.rint(d.sent[n_tx] * 0.985)
    nic[15] = d.ecn
    nic[16] = d.cnp
    nic[17] = np.rint(d.handled)
    nic[18:23] = d.transport
    extra = np.stack([rng.poisson(1e-3, E), rng.poisson(d.oob_lam)])
    return nic.astype(U64), extra.astype(U64)


__all__ = [
    "NIC_COUNTERS",
    "NIC_EXTRA",
    "NIC_GAUGES",
    "NS",
    "SW_COUNTERS",
    "SW_GAUGES",
    "U64",
    "Carried",
    "initial_counters",
    "nic_increments",
    "place_wrap",
    "read_counters",
    "switch_increments",
]
