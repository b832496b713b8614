"""PortAnomaly's features: what each NIC and switch port's counters become, one vector a window
(relative wherever the raw level depends on the workload rather than on health)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

S = 1_000_000_000
DEFAULT_SPEED_MBPS = 400_000.0
DEFAULT_BUFFER_BYTES = 64 * 1024 * 1024

# --- the features ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Feature:
    """One feature: how its raw value is transformed for the forest, and which side of the
    training range means trouble (+1 above, -1 below, 0 either, None: not judged)."""

    name: str
    transform: str  # share | log1p | log10 | log2 | id
    direction: int | None
    unit: str = ""
    congestion: bool = False  # a congestion rule alert on the entity's switch may explain it


# robust-scale floor per transform, in transformed units: a feature that never varied in
# training is not an outlier at every wiggle
_FLOOR = {"share": 0.01, "log1p": 0.05, "log10": 0.1, "log2": 0.02, "id": 0.01}

NIC_FEATURES: tuple[Feature, ...] = (
    Feature("rx_pause_share", "share", +1, "of the time", True),  # paused by its leaf
    Feature("tx_pause_share", "share", +1, "of the time", True),  # pausing its leaf
    Feature("ecn_marked_per_mb", "log1p", +1, "/MB", True),
    Feature("cnp_sent_per_mb", "log1p", +1, "/MB", True),
    Feature("cnp_handled_per_mb", "log1p", +1, "/MB", True),
    Feature("out_of_sequence_per_mb", "log1p", +1, "/MB"),
    Feature("retransmit_errors_per_s", "log1p", +1, "/s"),
    Feature("crc_errors_per_s", "log1p", +1, "/s"),
    Feature("symbol_errors_per_s", "log1p", +1, "/s"),
    Feature("fec_uncorrectable_per_s", "log1p", +1, "/s"),
    Feature("pre_fec_ber", "log10", +1),
    Feature("link_down_per_s", "log1p", +1, "/s"),
    Feature("pause_storm_events_per_s", "log1p", +1, "/s", True),
    Feature("tx_vs_peers", "log2", 0, "x peer median", True),
    Feature("rx_vs_peers", "log2", 0, "x peer median", True),
    Feature("pcie_speed_ratio", "id", -1, "of max"),
    Feature("pcie_width_ratio", "id", -1, "of max"),
)
PORT_FEATURES: tuple[Feature, ...] = (
    Feature("rx_pause_share", "share", +1, "of the time", True),  # paused by its peer
    Feature("tx_pause_share", "share", +1, "of the time", True),  # pausing its peer
    Feature("queue_depth_share", "share", +1, "of buffer", True),
    Feature("queue_peak_share", "share", +1, "of buffer", True),
    Feature("ecn_marked_per_kpkt", "log1p", +1, "/1000 pkts", True),
    Feature("fcs_errors_per_s", "log1p", +1, "/s"),
    Feature("drops_per_s", "log1p", +1, "/s", True),
    Feature("flaps_per_s", "log1p", +1, "/s"),
    Feature("in_utilisation", "share", None, "of line rate", True),
    Feature("out_utilisation", "share", None, "of line rate", True),
    Feature("role", "id", None),  # 0 NIC-facing, 1 leaf uplink, 2 spine/core port, 3 unknown
)
FEATURES: dict[str, tuple[Feature, ...]] = {"nic": NIC_FEATURES, "port": PORT_FEATURES}

# Metrics each kind accumulates: name -> (is a gauge, reduce across an entity's series by max).
# Pause durations and queue gauges exist per priority/queue: the worst one counts.
NIC_METRICS: dict[str, tuple[bool, bool]] = {
    "nic_rx_pause_us": (False, True),
    "nic_tx_pause_us": (False, True),
    "nic_ecn_marked_pkts": (False, False),
    "nic_cnp_sent": (False, False),
    "nic_cnp_handled": (False, False),
    "nic_out_of_sequence": (False, False),
    "nic_packet_seq_err": (False, False),
    "nic_local_ack_timeout": (False, False),
    "nic_rnr_nak_retry_err": (False, False),
    "nic_implied_nak_seq_err": (False, False),
    "nic_rx_crc_errors": (False, False),
    "nic_rx_symbol_errors": (False, False),
    "nic_rx_uncorrectable": (False, False),
    "nic_rx_corrected_bits": (False, False),
    "nic_link_down_events": (False, False),
    "nic_tx_pause_storm_warnings": (False, False),
    "nic_tx_pause_storm_errors": (False, False),
    "nic_rx_bytes": (False, False),
    "nic_tx_bytes": (False, False),
    "nic_rx_rdma_bytes": (False, False),
    "nic_tx_rdma_bytes": (False, False),
    "nic_link_speed_mbps": (True, True),
    "nic_pcie_speed_gts": (True, True),
    "nic_pcie_max_speed_gts": (True, True),
    "nic_pcie_width": (True, True),
    "nic_pcie_max_width": (True, True),
}
PORT_METRICS: dict[str, tuple[bool, bool]] = {
    "pfc_rx_pause_us": (False, True),
    "pfc_tx_pause_us": (False, True),
    "queue_depth_bytes": (True, True),
    "queue_peak_bytes": (True, True),
    "queue_ecn_marked_pkts": (False, False),
    "queue_tx_pkts": (False, False),
    "queue_dropped_pkts": (False, False),
    "port_out_pkts": (False, False),
    "port_in_fcs_errors": (False, False),
    "port_in_discards": (False, False),
    "port_carrier_transitions": (False, False),
    "port_in_octets": (False, False),
    "port_out_octets": (False, False),
    "port_speed_mbps": (True, True),
}
METRICS: dict[str, dict[str, tuple[bool, bool]]] = {"nic": NIC_METRICS, "port": PORT_METRICS}
KINDS = ("nic", "port")
# one code per metric for both kinds: NIC metrics first
_CODES: dict[str, int] = {m: i for i, m in enumerate([*NIC_METRICS, *PORT_METRICS])}
_N_NIC = len(NIC_METRICS)
_NAMES = dict(enumerate(_CODES))


def feature_names(kind: str) -> list[str]:
    """The feature list a model of ``kind`` is built on (what ``load`` checks)."""
    return [f.name for f in FEATURES[kind]]


# --- window values -> features ----------------------------------------------------------------


def _group_median(values: np.ndarray, groups: np.ndarray, n_groups: int, min_n: int) -> np.ndarray:
    """Each entity's group median of ``values`` (NaN where the group has fewer than ``min_n``
    finite values), vectorised: one sort, no loop per group.

    >>> _group_median(np.array([1.0, 3.0, 2.0, 9.0, np.nan]), np.array([0, 0, 0, 1, 1]), 2, 1)
    array([2., 2., 2., 9., 9.])
    """
    ok = np.flatnonzero(np.isfinite(values) & (groups >= 0))
    med = np.full(n_groups, np.nan)
    if len(ok):
        g, v = groups[ok], values[ok]
        order = np.lexsort((v, g))
        g, v = g[order], v[order]
        starts = np.flatnonzero(np.r_[True, g[1:] != g[:-1]])
        counts = np.diff(np.r_[starts, len(g)])
        mid = (v[starts + (counts - 1) // 2] + v[starts + counts // 2]) / 2
        med[g[starts]] = np.where(counts >= min_n, mid, np.nan)
    return np.where(groups >= 0, med[np.maximum(groups, 0)], np.nan)


def _nic_features(
    v: np.ndarray, valid: np.ndarray, speed: np.ndarray, group: np.ndarray, n_groups: int
) -> np.ndarray:
    """Raw NIC features (entities x NIC_FEATURES) from the window's per-metric values."""
    c = {m: v[:, i] for i, m in enumerate(NIC_METRICS)}

    def first(*names: str) -> np.ndarray:
        out = c[names[0]]
        for n in names[1:]:
            out = np.where(np.isnan(out), c[n], out)
        return out

    def total(*names: str) -> np.ndarray:
        parts = np.stack([c[n] for n in names])
        return np.where(np.isnan(parts).all(axis=0), np.nan, np.nansum(parts, axis=0))

    rx = first("nic_rx_bytes", "nic_rx_rdma_bytes")
    tx = first("nic_tx_bytes", "nic_tx_rdma_bytes")
    # per MB carried, at 1 MB/s at least (an idle NIC's few events are not a rate per MB)
    rx_mb = np.maximum(np.nan_to_num(rx) / 1e6, 1.0)
    tx_mb = np.maximum(np.nan_to_num(tx) / 1e6, 1.0)
    link = np.where(c["nic_link_speed_mbps"] > 0, c["nic_link_speed_mbps"], speed)
    tx_r = first("nic_tx_rdma_bytes", "nic_tx_bytes")
    rx_r = first("nic_rx_rdma_bytes", "nic_rx_bytes")
    peers_tx = _group_median(np.where(valid, tx_r, np.nan), group, n_groups, 3)
    peers_rx = _group_median(np.where(valid, rx_r, np.nan), group, n_groups, 3)
    with np.errstate(divide="ignore", invalid="ignore"):
        cols = [
            c["nic_rx_pause_us"] / 1e6,
            c["nic_tx_pause_us"] / 1e6,
            c["nic_ecn_marked_pkts"] / rx_mb,
            c["nic_cnp_sent"] / rx_mb,
            c["nic_cnp_handled"] / tx_mb,
            c["nic_out_of_sequence"] / rx_mb,
            total(
                "nic_packet_seq_err",
                "nic_local_ack_timeout",
                "nic_rnr_nak_retry_err",
                "nic_implied_nak_seq_err",
            ),
            c["nic_rx_crc_errors"],
            c["nic_rx_symbol_errors"],
            c["nic_rx_uncorrectable"],
            c["nic_rx_corrected_bits"] / (link * 1e6),
            c["nic_link_down_events"],
            total("nic_tx_pause_storm_warnings", "nic_tx_pause_storm_errors"),
            # +1 MB/s: a near-idle group's ratios are not blown up by a few bytes
            (tx_r + 1e6) / (peers_tx + 1e6),
            (rx_r + 1e6) / (peers_rx + 1e6),
            c["nic_pcie_speed_gts"] / c["nic_pcie_max_speed_gts"],
            c["nic_pcie_width"] / c["nic_pcie_max_width"],
        ]
    return np.stack(cols, axis=1)


def _port_features(
    v: np.ndarray, speed: np.ndarray, buffer: np.ndarray, role: np.ndarray
) -> np.ndarray:
    """Raw switch-port features (entities x PORT_FEATURES) from the window's metric values."""
    c = {m: v[:, i] for i, m in enumerate(PORT_METRICS)}
    tx_pkts = np.where(np.isnan(c["queue_tx_pkts"]), c["port_out_pkts"], c["queue_tx_pkts"])
    link = np.where(c["port_speed_mbps"] > 0, c["port_speed_mbps"], speed) * 1e6
    drops = np.stack([c["queue_dropped_pkts"], c["port_in_discards"]])
    with np.errstate(divide="ignore", invalid="ignore"):
        cols = [
            c["pfc_rx_pause_us"] / 1e6,
            c["pfc_tx_pause_us"] / 1e6,
            c["queue_depth_bytes"] / buffer,
            c["queue_peak_bytes"] / buffer,
            1000.0 * c["queue_ecn_marked_pkts"] / np.maximum(np.nan_to_num(tx_pkts), 1000.0),
            c["port_in_fcs_errors"],
            np.where(np.isnan(drops).all(axis=0), np.nan, np.nansum(drops, axis=0)),
            c["port_carrier_transitions"],
            8.0 * c["port_in_octets"] / link,
            8.0 * c["port_out_octets"] / link,
            role.astype(float),
        ]
    return np.stack(cols, axis=1)
