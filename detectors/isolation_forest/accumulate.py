"""What counters added over a feature window, per series, step by step (numpy sums), in the
detector or in stage 1 of the detector service (``FeatureFeed``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

import numpy as np
import polars as pl

from detectors.isolation_forest.features import _CODES, _N_NIC, _NAMES, KINDS, METRICS, S
from detectors.slots import SlotTable
from detectors.windows import Step
from rocewatch.core.state import Stateful, StateMismatch

# --- per-entity accumulation ----------------------------------------------------------------------


class _Series(SlotTable[tuple[str, str, str]]):
    """Stable slots for (device, port, qual) series (``detectors.slots.SlotTable``), found by
    hashes the caller computes (``hash_expr``) over frames it never builds whole."""

    COLUMNS = ("device", "port", "qual")
    SEED = 0x1F0E57

    def rows_at(
        self,
        positions: tuple[int, np.ndarray] | None,
        hashes: Callable[[np.ndarray | None], np.ndarray],
        keys_of: Callable[[np.ndarray], list[tuple[str, str, str]]],
    ) -> tuple[np.ndarray, list[tuple[str, str, str]]]:
        """Like ``rows``; where the window engine gave the rows' series positions
        ``(epoch, positions)``, a row's slot is remembered by position, so only rows of series
        not seen before are hashed (``hashes(row indices or None for all)``)."""
        if positions is None:
            return self.rows(hashes(None), keys_of)
        new: list[tuple[str, str, str]] = []

        def slots_of(miss: np.ndarray) -> np.ndarray:
            found, added = self.rows(hashes(miss), lambda i: keys_of(miss[i]))
            new.extend(added)
            return found

        return self.at_positions(positions, slots_of), new

    def rows(
        self, h: np.ndarray, keys_of: Callable[[np.ndarray], list[tuple[str, str, str]]]
    ) -> tuple[np.ndarray, list[tuple[str, str, str]]]:
        """The slot of every row (by its ``hash_expr`` hash), and the keys seen for the first
        time (``keys_of(row indices)`` names them; only new series cost a Python step)."""
        return self.slots(h, keys_of)


class _Accumulator:
    """Per-series sums of one entity kind over the current feature window.

    Counters add their deltas (``a``) and interval seconds (``b``); gauges add their readings
    and a count. Series map to entities ((device, port) of a NIC or switch port).
    """

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.metrics = METRICS[kind]
        m = len(self.metrics)
        self.gauge = np.array([g for g, _ in self.metrics.values()])
        self.by_max = np.array([x for _, x in self.metrics.values()])
        self.series = _Series()
        self.series_entity = np.empty(0, dtype=np.int64)
        self.entities: list[tuple[str, str]] = []
        self.entity_index: dict[tuple[str, str], int] = {}
        self.a = np.zeros((0, m))
        self.b = np.zeros((0, m))
        self.ts = np.zeros(0, dtype=np.int64)  # newest sample per entity in the window

    @property
    def n_entities(self) -> int:
        return len(self.entities)

    def add(
        self,
        h: np.ndarray | Callable[[np.ndarray | None], np.ndarray],
        col: np.ndarray,
        cols: tuple[np.ndarray, np.ndarray, np.ndarray],
        keys_of: Callable[[np.ndarray], list[tuple[str, str, str]]],
        positions: tuple[int, np.ndarray] | None = None,
    ) -> list[int]:
        """Add a step's rows of this kind: series hashes ``h`` (or a function of row indices,
        None for all, that hashes them), metric column ``col``, the rows' (a, b, ts) (``a``:
        delta for counters, the reading for gauges; ``b``: dt for counters, 1 for a gauge's
        reading; NaN as 0, see ``ab``) and optionally their window-engine positions; return the
        entities seen for the first time."""
        if callable(h):
            slot, new = self.series.rows_at(positions, h, keys_of)
        else:
            slot, new = self.series.rows(h, keys_of)
        fresh: list[int] = []
        if new:
            ent = []
            for d, p, _ in new:
                i = self.entity_index.get((d, p))
                if i is None:
                    i = self.entity_index[(d, p)] = len(self.entities)
                    self.entities.append((d, p))
                    fresh.append(i)
                ent.append(i)
            self.series_entity = np.concatenate([self.series_entity, np.array(ent, np.int64)])
            z = np.zeros((len(new), len(self.metrics)))
            self.a = np.concatenate([self.a, z])
            self.b = np.concatenate([self.b, z.copy()])
            if fresh:
                self.ts = np.concatenate([self.ts, np.zeros(len(fresh), dtype=np.int64)])
        a, b, ts = cols
        flat = slot * len(self.metrics) + col
        if positions is not None:
            # the engine's rows: one per series and metric, so no index repeats
            self.a.ravel()[flat] += a
            self.b.ravel()[flat] += b
        else:
            np.add.at(self.a.ravel(), flat, a)
            np.add.at(self.b.ravel(), flat, b)
        np.maximum.at(self.ts, self.series_entity[slot], ts)
        return fresh

    def close(self, reset: bool = True) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per entity: each metric's window value (rate/s for counters, mean for gauges; NaN when
        absent), the covered seconds, and the newest sample time; then start a new window
        (``reset=False``: the window goes on)."""
        n, m = self.n_entities, len(self.metrics)
        with np.errstate(divide="ignore", invalid="ignore"):
            v = np.where(self.b > 0, self.a / self.b, np.nan)
        out = np.full((n, m), np.nan)
        mx = self.by_max
        # reduce series -> entity: max for shares and gauges, sum for volumes
        vmax = np.full((n, int(mx.sum())), np.nan)
        np.fmax.at(vmax, self.series_entity, v[:, mx])
        vsum = np.zeros((n, int((~mx).sum())))
        np.add.at(vsum, self.series_entity, np.nan_to_num(v[:, ~mx]))
        have = np.zeros_like(vsum)
        np.add.at(have, self.series_entity, np.isfinite(v[:, ~mx]).astype(float))
        out[:, mx] = vmax
        out[:, ~mx] = np.where(have > 0, vsum, np.nan)
        cov = np.zeros(n)
        np.maximum.at(cov, self.series_entity, np.where(self.gauge, 0.0, self.b).max(axis=1))
        ts = self.ts.copy()
        if reset:
            self.a.fill(0.0)
            self.b.fill(0.0)
            self.ts.fill(0)
        return out, cov, ts


def add_step(accs: dict[str, Any], step: Step) -> dict[str, list[int]] | None:
    """Add a step's rows of the forest's metrics to each kind's accumulator (``_Accumulator``);
    per kind, the entities seen for the first time; None if the step holds none of them."""
    # the step's per-metric split is shared with the rule detectors (built once per step)
    by = step.by_metric
    out: dict[str, list[int]] | None = None
    for kind, lo, hi in (("nic", 0, _N_NIC), ("port", _N_NIC, len(_CODES))):
        parts = [
            (p, c)
            for m, c in _CODES.items()
            if lo <= c < hi and (p := by.get(m)) is not None and p.height
        ]
        if parts:
            out = out or {}
            out[kind] = _add_kind(accs[kind], lo, parts, step.positions)
    return out


def _add_kind(
    acc: _Accumulator,
    lo: int,
    parts: list[tuple[pl.DataFrame, int]],
    known: tuple[int, dict[str, np.ndarray]] | None,
) -> list[int]:
    """Add one kind's rows: ``parts``, one frame per metric (with its code; the kind's codes
    start at ``lo``); the entities seen for the first time."""
    # each part is one metric: a counter's (delta, dt) or a gauge's (reading, 1)
    a_parts, b_parts = [], []
    for p, c in parts:
        if acc.gauge[c - lo]:
            v = p.get_column("max").to_numpy()
            a_parts.append(v)
            b_parts.append((~np.isnan(v)).astype(float))
        else:
            a_parts.append(p.get_column("delta").to_numpy())
            b_parts.append(p.get_column("dt").to_numpy())
    code = np.repeat(np.array([c - lo for _, c in parts]), [p.height for p, _ in parts])
    a = np.nan_to_num(np.concatenate(a_parts).astype(float, copy=False))
    b = np.nan_to_num(np.concatenate(b_parts).astype(float, copy=False))
    ts = np.concatenate([p.get_column("ts").to_numpy() for p, _ in parts])
    # the engine's series positions spare hashing the key strings of known series
    pos = None
    if known is not None and all(_NAMES[c] in known[1] for _, c in parts):
        pos = (known[0], np.concatenate([known[1][_NAMES[c]] for _, c in parts]))
    frame: list[pl.DataFrame] = []  # the kind's rows in one frame, only if a key is needed
    hashed: list[np.ndarray] = []

    def rows_frame() -> pl.DataFrame:
        if not frame:
            frame.append(pl.concat([p for p, _ in parts], how="vertical", rechunk=False))
        return frame[0]

    def keys_of(i: np.ndarray) -> list[tuple[str, str, str]]:
        sel = rows_frame()[i.tolist()].select("device", "port", "qual")
        return [(str(d), str(p), str(q)) for d, p, q in sel.iter_rows()]

    def hashes(i: np.ndarray | None) -> np.ndarray:
        if not hashed:  # once per step, and only if some series is not known yet
            hashed.append(rows_frame().select(_Series.hash_expr()).to_series().to_numpy())
        return hashed[0] if i is None else hashed[0][i]

    return acc.add(hashes, code, (a, b, ts), keys_of, pos)


class FeatureFeed(Stateful):
    """The forest's per-step work for the telemetry of one scale-out partition (stage 1):
    each entity's window values, one row per entity and window, instead of every series'
    rows every step. A partition's entities are its own (the telemetry key is the device), so
    its window values are whole; the detect stage's forest reads them from every partition
    (``IsolationForestDetector.offer``) and scores the fleet as replay does.

    A window is the ``feature_window_s`` its steps start in; it is done once the partition
    has closed past its end. A partition that reports idle sends its open window's values so
    far, and keeps the window open: if the partition resumes inside it, the window is sent
    again, whole, when it is done, and that copy replaces the first (unless the detect stage
    scored the window in between: the resumed rows are late then, as late step rows are)."""

    def __init__(self, feature_window_s: float) -> None:
        self.window_ns = round(feature_window_s * S)
        self.accs = {k: _Accumulator(k) for k in KINDS}
        self.window_end: int | None = None
        self.done: list[pl.DataFrame] = []

    STATE_TYPES: ClassVar[tuple[type, ...]] = (_Accumulator, _Series)
    NOT_STATE: ClassVar[frozenset[str]] = frozenset({"window_ns"})

    def restore(self, data: dict[str, Any]) -> None:
        """As every part; a window of another length starts afresh (``StateMismatch``)."""
        if data.get("window_end") is not None and data["window_end"] % self.window_ns:
            raise StateMismatch("the isolation forest's feature_window_s changed")
        super().restore(data)

    def add(self, step: Step) -> None:
        if self.window_end is not None and step.start >= self.window_end:
            self._finish()
        if add_step(self.accs, step) is not None and self.window_end is None:
            self.window_end = (step.start // self.window_ns + 1) * self.window_ns

    def take(self, closed_to: int | None, idle: bool = False) -> pl.DataFrame | None:
        """The windows done once the partition has closed to ``closed_to`` (and the open
        window's values so far when it is idle: it stays open), as one frame
        (``window_frame``); None if none."""
        if self.window_end is not None and (closed_to or 0) >= self.window_end:
            self._finish()
        elif self.window_end is not None and idle:
            self._finish(keep=True)
        if not self.done:
            return None
        out = pl.concat(self.done, how="diagonal")
        self.done = []
        return out

    def _finish(self, keep: bool = False) -> None:
        """The window's values into ``done``; ``keep``: the window stays open (idle)."""
        end = self.window_end
        if not keep:
            self.window_end = None
        assert end is not None
        for kind, acc in self.accs.items():
            if acc.n_entities == 0:
                continue
            v, cov, ts = acc.close(reset=not keep)
            have = np.flatnonzero(ts > 0)  # entities with a sample in this window
            if len(have):
                self.done.append(window_frame(end, kind, acc, have, v, cov, ts))


def window_frame(
    end: int,
    kind: str,
    acc: _Accumulator,
    rows: np.ndarray,
    v: np.ndarray,
    cov: np.ndarray,
    ts: np.ndarray,
) -> pl.DataFrame:
    """One kind's window values: ``end``, ``kind``, ``device``, ``port``, ``cov``, ``ts`` and
    a column per metric of the kind (NaN: none in the window)."""
    ents = [acc.entities[i] for i in rows.tolist()]
    cols: dict[str, Any] = {
        "end": pl.Series("end", np.full(len(rows), end, dtype=np.int64)),
        "kind": pl.Series("kind", [kind] * len(rows), dtype=pl.String),
        "device": pl.Series("device", [d for d, _ in ents], dtype=pl.String),
        "port": pl.Series("port", [q for _, q in ents], dtype=pl.String),
        "cov": pl.Series("cov", cov[rows]),
        "ts": pl.Series("ts", ts[rows]),
    }
    for j, m in enumerate(acc.metrics):
        cols[m] = pl.Series(m, v[rows, j])
    return pl.DataFrame(cols)


class _FedAccumulator:
    """The detect stage's stand-in for ``_Accumulator`` when stage 1 computes the window
    values (``FeatureFeed``): the entities, indexed in the order they were first offered, and
    the window's values scattered over them (NaN, 0 coverage and time 0 for an entity without
    a sample in the window, as ``_Accumulator.close`` gives)."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.metrics = METRICS[kind]
        self.entities: list[tuple[str, str]] = []
        self.entity_index: dict[tuple[str, str], int] = {}
        self.pending: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = []

    @property
    def n_entities(self) -> int:
        return len(self.entities)

    def put(self, frame: pl.DataFrame) -> list[int]:
        """Take one partition's window values of this kind; the entities new to it."""
        fresh: list[int] = []
        idx = np.empty(frame.height, dtype=np.int64)
        keys = zip(frame["device"].to_list(), frame["port"].to_list(), strict=True)
        for r, key in enumerate(keys):
            i = self.entity_index.get(key)
            if i is None:
                i = self.entity_index[key] = len(self.entities)
                self.entities.append(key)
                fresh.append(i)
            idx[r] = i
        missing = [m for m in self.metrics if m not in frame.columns]
        if missing:
            frame = frame.with_columns(pl.lit(None, dtype=pl.Float64).alias(m) for m in missing)
        v = frame.select(list(self.metrics)).to_numpy().astype(float)
        self.pending.append(
            (idx, v, frame["cov"].to_numpy().astype(float), frame["ts"].to_numpy().astype(np.int64))
        )
        return fresh

    def close(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        n, m = self.n_entities, len(self.metrics)
        out, cov, ts = np.full((n, m), np.nan), np.zeros(n), np.zeros(n, dtype=np.int64)
        for idx, v, c, t in self.pending:
            out[idx], cov[idx], ts[idx] = v, c, t
        self.pending = []
        return out, cov, ts
