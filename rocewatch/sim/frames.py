"""The devices' readings as SAMPLE_SCHEMA frames (``ts device port qual metric value raw``):
the rows' static columns laid out once per run, then each tick's times and values filled in.
Rows go counters, then gauges, each metric by metric (switch ports, then NICs).
"""

from __future__ import annotations

import numpy as np
import polars as pl

from rocewatch.core.model import METRICS, SAMPLE_SCHEMA, Scope
from rocewatch.sim.counters import NIC_COUNTERS, NIC_GAUGES, SW_COUNTERS, SW_GAUGES
from rocewatch.sim.fabric import Fabric
from rocewatch.sim.readings import Late, Readings, Tick


def _qual(metric: str, prio: str) -> str:
    scope = METRICS[metric].scope
    return prio if scope in (Scope.PRIORITY, Scope.QUEUE, Scope.NIC_PRIORITY) else ""


class FrameLayout:
    """The frames of ``fab``'s devices: ``frame`` for a default run's tick, ``readings_frame``
    for a cadenced run's readings."""

    def __init__(self, fab: Fabric) -> None:
        self.fabric = fab
        prio = str(fab.priority)
        P, E = fab.n_ports, fab.n_nics
        sw_dev = np.array(fab.switches, dtype=object)[fab.port_switch]
        sw_port = np.array(fab.port_name, dtype=object)
        nic_dev = np.array(fab.nodes, dtype=object)[fab.nic_node]
        nic_port = np.array(fab.rail_nics, dtype=object)[fab.nic_rail]
        self._nic_dev, self._nic_port = nic_dev, nic_port
        self._nic_metric_rows = NIC_COUNTERS + NIC_GAUGES
        self._nic_qual = [_qual(m, prio) for m in self._nic_metric_rows]
        parts = [
            (sw_dev, sw_port, SW_COUNTERS, P),
            (nic_dev, nic_port, NIC_COUNTERS, E),
            (sw_dev, sw_port, SW_GAUGES, P),
            (nic_dev, nic_port, NIC_GAUGES, E),
        ]
        dev, port, qual, metric = [], [], [], []
        for d, p, ms, n in parts:
            for m in ms:
                dev.append(d)
                port.append(p)
                qual.append(np.full(n, _qual(m, prio), dtype=object))
                metric.append(np.full(n, m, dtype=object))
        self._static_cols = pl.DataFrame(
            {
                "device": np.concatenate(dev).tolist(),
                "port": np.concatenate(port).tolist(),
                "qual": np.concatenate(qual).tolist(),
                "metric": np.concatenate(metric).tolist(),
            },
            schema={"device": pl.String, "port": pl.String, "qual": pl.String, "metric": pl.String},
        )
        n_sw = len(fab.switches)
        # row -> index into concat(sw_ts, nic_ts)
        self._row_dev = np.concatenate(
            [
                np.tile(fab.port_switch, len(SW_COUNTERS)),
                n_sw + np.tile(np.arange(E), len(NIC_COUNTERS)),
                np.tile(fab.port_switch, len(SW_GAUGES)),
                n_sw + np.tile(np.arange(E), len(NIC_GAUGES)),
            ]
        )
        self._n_counter_rows = P * len(SW_COUNTERS) + E * len(NIC_COUNTERS)
        self._n_rows = self._n_counter_rows + P * len(SW_GAUGES) + E * len(NIC_GAUGES)
        self._row_nic = np.full(self._n_rows, -1)
        a = P * len(SW_COUNTERS)
        self._row_nic[a : self._n_counter_rows] = np.tile(np.arange(E), len(NIC_COUNTERS))
        b = self._n_counter_rows + P * len(SW_GAUGES)
        self._row_nic[b:] = np.tile(np.arange(E), len(NIC_GAUGES))

    def readings_frame(self, r: Readings) -> pl.DataFrame:
        """``r`` as a SAMPLE_SCHEMA frame: counters, then gauges, each metric by metric."""
        fab = self.fabric
        P, E = fab.n_ports, fab.n_nics
        nsc, nnc, nsg, nng = len(SW_COUNTERS), len(NIC_COUNTERS), len(SW_GAUGES), len(NIC_GAUGES)
        a = P * nsc
        b = self._n_counter_rows
        c = b + P * nsg
        idx = np.concatenate(
            [
                (np.arange(nsc)[:, None] * P + r.sw_port[None, :]).ravel(),
                a + (np.arange(nnc)[:, None] * E + r.nic[None, :]).ravel(),
                b + (np.arange(nsg)[:, None] * P + r.g_port[None, :]).ravel(),
                c + (np.arange(nng)[:, None] * E + r.nic[None, :]).ravel(),
            ]
        )
        tiles = ((r.sw_ts, nsc), (r.nic_ts, nnc), (r.g_ts, nsg), (r.nic_ts, nng))
        ts = np.concatenate([np.tile(x, n) for x, n in tiles])
        raw = np.concatenate([r.sw_c.ravel(), r.nic_c.ravel()])
        value = np.concatenate([raw.astype(np.float64), r.sw_g.ravel(), r.nic_g.ravel()])
        n_g = len(idx) - len(raw)
        raw_s = pl.concat(
            [pl.Series("raw", raw, dtype=pl.UInt64), pl.Series("raw", [None] * n_g, pl.UInt64)]
        )
        return (
            self._static_cols[idx]
            .with_columns(pl.Series("ts", ts, dtype=pl.Int64), pl.Series("value", value), raw_s)
            .select(list(SAMPLE_SCHEMA))
        )

    def frame(self, t: Tick) -> pl.DataFrame:
        fab = self.fabric
        ts_dev = np.concatenate([t.sw_ts, t.nic_ts])
        ts = ts_dev[self._row_dev]
        raw = np.concatenate([t.sw_c.ravel(), t.nic_c.ravel()])
        value = np.concatenate([raw.astype(np.float64), t.sw_g.ravel(), t.nic_g.ravel()])
        n_g = self._n_rows - self._n_counter_rows
        nulls = pl.Series("raw", [None], dtype=pl.UInt64).extend_constant(None, n_g - 1)
        raw_s = pl.concat([pl.Series("raw", raw, dtype=pl.UInt64), nulls])
        df = self._static_cols.with_columns(
            pl.Series("ts", ts, dtype=pl.Int64), pl.Series("value", value), raw_s
        ).select(list(SAMPLE_SCHEMA))
        if len(t.emit) != fab.n_nics:
            emitted = np.zeros(fab.n_nics + 1, dtype=bool)
            emitted[t.emit] = True
            emitted[-1] = True  # switch rows (row_nic == -1)
            df = df.filter(pl.Series(emitted[self._row_nic]))
        if t.late:
            df = pl.concat([df, *(self._late_frame(x) for x in t.late)])
        return df

    def _late_frame(self, late: Late) -> pl.DataFrame:
        n = len(late.nics)
        m = len(self._nic_metric_rows)
        raw = late.c.ravel()
        value = np.concatenate([raw.astype(np.float64), late.g.ravel()])
        return pl.DataFrame(
            {
                "ts": np.tile(late.ts, m),
                "device": np.tile(self._nic_dev[late.nics], m).tolist(),
                "port": np.tile(self._nic_port[late.nics], m).tolist(),
                "qual": np.repeat(np.array(self._nic_qual, dtype=object), n).tolist(),
                "metric": np.repeat(np.array(self._nic_metric_rows, dtype=object), n).tolist(),
                "value": value,
                "raw": pl.concat(
                    [
                        pl.Series(raw, dtype=pl.UInt64),
                        pl.Series([None] * (n * len(NIC_GAUGES)), dtype=pl.UInt64),
                    ]
                ),
            },
            schema=SAMPLE_SCHEMA,
        )


__all__ = ["FrameLayout"]
