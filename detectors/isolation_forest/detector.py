"""PortAnomaly, the detector: a window's features scored, thresholded and explained (the
package's docstring says how)."""

from __future__ import annotations

import logging
import math
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

import numpy as np
import polars as pl

from detectors.base import Finding, StepContext, node_labels, port_labels
from detectors.isolation_forest.accumulate import _Accumulator, _FedAccumulator, _Series, add_step
from detectors.isolation_forest.config import IsolationForestConfig
from detectors.isolation_forest.features import (
    DEFAULT_BUFFER_BYTES,
    DEFAULT_SPEED_MBPS,
    FEATURES,
    KINDS,
    NIC_METRICS,
    PORT_METRICS,
    S,
    _nic_features,
    _port_features,
)
from detectors.isolation_forest.model import (
    CompiledForest,
    ForestModel,
    KindModel,
    _statics,
    _transform,
    fit_kind,
)
from detectors.windows import Step
from rocewatch.core.errors import ConfigError
from rocewatch.core.model import (
    ECN_CONGESTION,
    FABRIC_INCIDENT,
    PCIE_DOWNGRADE,
    PFC_STORM,
    PORT_ANOMALY,
    QUEUE_BUILDUP,
    ROCE_CONFIG_MISMATCH,
    STRAGGLER,
)
from rocewatch.core.state import Stateful
from rocewatch.core.topology import NicEnd, PortEnd, Topology

log = logging.getLogger(__name__)

ALERTNAME = PORT_ANOMALY
# rule alerts that say "this switch is congested": they may explain congestion symptoms of the
# switch's other ports and of the NICs cabled to it
CONGESTION_RULES = frozenset({PFC_STORM, ECN_CONGESTION, QUEUE_BUILDUP, STRAGGLER, PCIE_DOWNGRADE})


# --- thresholding -------------------------------------------------------------------------------


class Threshold:
    """Scores -> alerting entities: above the threshold ``sustain`` windows in a row enters,
    ``clear`` windows in a row at or below it leaves. Entities not judged keep their state.

    >>> t = Threshold(sustain=2, clear=1)
    >>> [t.update(np.array([0]), np.array([x]), 1)[0].tolist() for x in (0.9, 0.9, 0.9)]
    [[], [0], []]
    >>> t.update(np.array([0]), np.array([0.1]), 1)[1].tolist()
    [0]
    """

    PARAMS: ClassVar[tuple[str, ...]] = ("sustain", "clear")  # a restored one takes today's

    def __init__(self, sustain: int, clear: int) -> None:
        self.sustain = sustain
        self.clear = clear
        self.streak = np.zeros(0, dtype=np.int64)  # windows in a row above
        self.calm = np.zeros(0, dtype=np.int64)  # windows in a row at or below
        self.alerting = np.zeros(0, dtype=bool)

    def _grow(self, n: int) -> None:
        if n > len(self.streak):
            k = n - len(self.streak)
            self.streak = np.concatenate([self.streak, np.zeros(k, dtype=np.int64)])
            self.calm = np.concatenate([self.calm, np.zeros(k, dtype=np.int64)])
            self.alerting = np.concatenate([self.alerting, np.zeros(k, dtype=bool)])

    def update(
        self, idx: np.ndarray, scores: np.ndarray, n: int, threshold: float = 0.5
    ) -> tuple[np.ndarray, np.ndarray]:
        """Judge entities ``idx`` (of ``n``) by ``scores``; return (entered, cleared) indices."""
        self._grow(n)
        above = scores > threshold
        self.streak[idx] = np.where(above, self.streak[idx] + 1, 0)
        self.calm[idx] = np.where(above, 0, self.calm[idx] + 1)
        was = self.alerting[idx]
        now = np.where(was, self.calm[idx] < self.clear, self.streak[idx] >= self.sustain)
        self.alerting[idx] = now
        return idx[now & ~was], idx[was & ~now]

    def reset(self, idx: np.ndarray) -> None:
        """Forget ``idx``'s history (a rule alert explains them: they start over afterwards)."""
        self._grow(int(idx.max()) + 1 if len(idx) else 0)
        self.streak[idx] = 0
        self.calm[idx] = 0
        self.alerting[idx] = False


# --- the detector -------------------------------------------------------------------------------

Key = tuple[str, str, str]  # (kind "nic"|"port", node-or-switch, nic-or-port)


@dataclass
class _Kind:
    """Everything one entity kind keeps between windows."""

    acc: _Accumulator
    threshold: Threshold
    # static per entity, filled when an entity is first seen
    group: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    speed: np.ndarray = field(default_factory=lambda: np.zeros(0))
    buffer: np.ndarray = field(default_factory=lambda: np.zeros(0))
    role: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    # each entity's place in key order: slots follow arrival order, which the window engine's
    # aggregation does not fix, so training rows are put in this order (determinism)
    rank: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    switch: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))  # its own
    # switch (a port) or the one it is cabled to (a NIC): index in switch_ids, -1 unknown
    # training rows of the recent windows: (window end, raw rows)
    rows: deque[tuple[int, np.ndarray]] = field(default_factory=deque)
    last_idx: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    last_scores: np.ndarray = field(default_factory=lambda: np.zeros(0))
    shifted: bool = False  # the last window had most entities above the threshold


@dataclass
class IsolationForestDetector(Stateful):
    topology: Topology
    config: IsolationForestConfig = field(default_factory=IsolationForestConfig)
    name: str = "isolation_forest"
    # the record types its state holds (rocewatch.core.state; the checkpoint codec reads no other)
    STATE_TYPES: ClassVar[tuple[type, ...]] = (
        _Kind,
        _Accumulator,
        _FedAccumulator,
        _Series,
        Threshold,
        Finding,
        ForestModel,
        KindModel,
        CompiledForest,
    )
    # derived from its configuration and topology when built: never restored
    NOT_STATE: ClassVar[frozenset[str]] = frozenset({"window_ns"})
    # the metrics it reads from the window engine (steps carry no others to the detect stage)
    reads: ClassVar[frozenset[str]] = frozenset({*NIC_METRICS, *PORT_METRICS})

    @property
    def window_s(self) -> float:
        """Reads only the newest step: its feature window is accumulated here."""
        return 0.0

    def __post_init__(self) -> None:
        cfg = self.config
        self.kinds = {
            k: _Kind(_Accumulator(k), Threshold(cfg.sustain_windows, cfg.clear_windows))
            for k in KINDS
        }
        self.groups: dict[str, int] = {}  # NIC peer groups (job and rail)
        self.switch_ids: dict[str, int] = {}
        self.model: ForestModel | None = None
        if cfg.model_path:
            self.model = ForestModel.load(cfg.model_path)
            if self.model.meta.get("feature_window_s", cfg.feature_window_s) != (
                cfg.feature_window_s
            ):
                log.warning(
                    "%s was trained on %s s windows, scoring %s s ones",
                    cfg.model_path,
                    self.model.meta.get("feature_window_s"),
                    cfg.feature_window_s,
                )
        self.window_ns = round(cfg.feature_window_s * S)
        self.window_end: int | None = None
        self.windows = 0  # closed windows that held data
        self.fits = 0
        self.next_fit_ns: int | None = None
        self.active: dict[Key, Finding] = {}
        self.fit_seconds: list[float] = []
        self.shifted_windows = 0

    def restore(self, data: dict[str, object]) -> None:
        """As every part (``Stateful``); a model the configuration names (``model_path``) is
        the one it scores with, not the one the state learned."""
        if self.config.model_path:
            data = {k: v for k, v in data.items() if k != "model"}
        super().restore(data)

    # --- per step --------------------------------------------------------------------------------
    def evaluate(self, ctx: StepContext) -> list[Finding]:
        fed = getattr(self, "fed", None)
        if fed is not None:  # stage 1 accumulates (scale-out): its windows come by ``offer``
            # the first window once the steps reach its end (a partition that went idle may
            # have sent a later one before the others sent theirs)
            if self.window_end is None and fed and ctx.end >= min(fed):
                self.window_end = min(fed)
        else:
            cur = ctx.engine.current()
            if cur is not None and self._add(cur) and self.window_end is None:
                self.window_end = (cur.start // self.window_ns + 1) * self.window_ns
        if self.window_end is not None and ctx.end >= self.window_end:
            self._close(ctx)
            self.window_end = (ctx.end // self.window_ns + 1) * self.window_ns
        if not self.active:
            return []
        explained, _ = self._explained(ctx)
        return [f for k, f in self.active.items() if k not in explained]

    # --- scale-out: window values from stage 1 (``FeatureFeed``) ---------------------------------
    def feed_from_stage1(self) -> None:
        """Take each window's values from the telemetry partitions (``offer``) instead of
        accumulating the steps' rows here: the steps then need none of the forest's metrics
        that no rule detector reads. Only before the first step."""
        if any(k.acc.n_entities for k in self.kinds.values()):
            raise RuntimeError("the forest has accumulated steps already")
        for kind, k in self.kinds.items():
            k.acc = _FedAccumulator(kind)  # type: ignore[assignment]
        # window end -> telemetry partition -> its window values; and the last window used
        self.fed: dict[int, dict[int, pl.DataFrame]] = {}
        self.fed_done = -1
        self.fed_newest: dict[int, int] = {}  # per partition, the newest window end offered

    def offer(self, partition: int, frame: pl.DataFrame) -> int:
        """One partition's window values (``FeatureFeed.take``); a window sent again after a
        restart replaces its first copy, or is dropped once scored. Returns the rows of windows
        scored without them (late: left out, as late step rows are)."""
        late = 0
        newest = self.fed_newest.get(partition, -1)
        for (end,), part in frame.partition_by("end", as_dict=True).items():
            end = int(end)  # type: ignore[call-overload]
            if end <= self.fed_done:
                late += 0 if end <= newest else part.height
            else:
                self.fed.setdefault(end, {})[partition] = part
            self.fed_newest[partition] = max(self.fed_newest.get(partition, -1), end)
        return late

    def _take_fed(self) -> None:
        """Put the windows that end by this one into the kinds' accumulators, in partition
        order (describing the entities new to them)."""
        assert self.window_end is not None
        for end in sorted(e for e in self.fed if e <= self.window_end):
            for _, frame in sorted(self.fed.pop(end).items()):
                for (kind,), part in frame.partition_by("kind", as_dict=True).items():
                    k = self.kinds.get(str(kind))
                    if k is None:
                        continue
                    fresh = k.acc.put(part)  # type: ignore[attr-defined]
                    if fresh:
                        self._describe(str(kind), fresh)
        self.fed_done = self.window_end

    def _add(self, step: Step) -> bool:
        """Add the step's rows of the forest's metrics; False if it has none (only the metrics
        it reads count, so a step that carries just those behaves the same)."""
        fresh = add_step({kind: k.acc for kind, k in self.kinds.items()}, step)
        if fresh is None:
            return False
        for kind, new in fresh.items():
            if new:
                self._describe(kind, new)
        return True

    def _describe(self, kind: str, fresh: list[int]) -> None:
        """Static facts of entities seen for the first time: peer group, speed, buffer, role."""
        k, topo = self.kinds[kind], self.topology
        groups, speeds, buffers, roles, switches = [], [], [], [], []
        for i in fresh:
            dev, port = k.acc.entities[i]
            if kind == "nic":
                leaf = topo.peer(NicEnd(dev, port))
                switches.append(
                    self.switch_ids.setdefault(leaf.switch, len(self.switch_ids))
                    if isinstance(leaf, PortEnd)
                    else -1
                )
                # peers: the job's NICs on the same rail (one NCCL ring), else the job, the
                # rail, or every NIC
                jobs = topo.node_jobs.get(dev)
                rail = topo.nic_rail(dev, port)
                parts = ([f"job:{jobs[0]}"] if jobs else []) + (
                    [f"rail:{rail}"] if rail is not None else []
                )
                name = "|".join(parts) or "all"
                groups.append(self.groups.setdefault(name, len(self.groups)))
                speeds.append(topo.nic_speed_mbps(dev, port) or DEFAULT_SPEED_MBPS)
                buffers.append(math.nan)
                roles.append(-1)
            else:
                switches.append(self.switch_ids.setdefault(dev, len(self.switch_ids)))
                peer = topo.peer_of_port(dev, port)
                sw = topo.switches.get(dev)
                speed = None
                if isinstance(peer, NicEnd):
                    role = 0
                    speed = topo.nic_speed_mbps(peer.node, peer.nic)
                elif isinstance(peer, PortEnd):
                    role = 1 if sw is not None and sw.role == "leaf" else 2
                else:
                    role = 3
                groups.append(-1)
                speeds.append(speed or DEFAULT_SPEED_MBPS)
                buffers.append(float(sw.buffer_bytes or 0) if sw else 0.0)
                roles.append(role)
        k.group = np.concatenate([k.group, np.array(groups, dtype=np.int64)])
        k.speed = np.concatenate([k.speed, np.array(speeds, dtype=float)])
        b = np.array(buffers, dtype=float)
        k.buffer = np.concatenate([k.buffer, np.where(b > 0, b, DEFAULT_BUFFER_BYTES)])
        k.role = np.concatenate([k.role, np.array(roles, dtype=np.int64)])
        k.switch = np.concatenate([k.switch, np.array(switches, dtype=np.int64)])
        order = sorted(range(len(k.acc.entities)), key=k.acc.entities.__getitem__)
        k.rank = np.empty(len(order), dtype=np.int64)
        k.rank[order] = np.arange(len(order))

    # --- per window ------------------------------------------------------------------------------
    def _close(self, ctx: StepContext) -> None:
        cfg = self.config
        if getattr(self, "fed", None) is not None:
            self._take_fed()
        explained = self._explained(ctx)
        held = False
        for kind, k in self.kinds.items():
            if k.acc.n_entities == 0:
                continue
            v, cov, ts = k.acc.close()
            w = cfg.feature_window_s
            valid = (cov >= cfg.min_coverage * w) & (cov <= cfg.max_coverage * w)
            if kind == "nic":
                raw = _nic_features(v, valid, k.speed, k.group, len(self.groups))
            else:
                raw = _port_features(v, k.speed, k.buffer, k.role)
            idx = np.flatnonzero(valid)
            if len(idx) == 0:
                continue
            idx = idx[np.argsort(k.rank[idx])]  # key order: see _Kind.rank
            held = True
            self._judge(kind, k, idx, raw[idx], ts, explained, ctx)
        if not held:
            return
        self.windows += 1
        if self.model is None:
            if self.windows >= round(cfg.baseline_s / cfg.feature_window_s):
                self._fit(ctx, "baseline")
        elif self.next_fit_ns is None:
            if cfg.retrain_every_s > 0:
                self.next_fit_ns = ctx.end + round(cfg.retrain_every_s * S)
        elif ctx.end >= self.next_fit_ns:
            self._fit(ctx, "retrain")

    def _judge(
        self,
        kind: str,
        k: _Kind,
        idx: np.ndarray,
        raw: np.ndarray,
        ts: np.ndarray,
        explained: tuple[set[Key], set[str]],
        ctx: StepContext,
    ) -> None:
        """Score one kind's entities, update their alert state, keep the clean rows."""
        cfg = self.config
        ents = k.acc.entities
        n = len(ents)
        entities, congested = explained
        clean = np.ones(len(idx), dtype=bool)
        if entities:
            hit = [k.acc.entity_index.get(e[1:]) for e in entities if e[0] == kind]
            mask = np.zeros(n, dtype=bool)
            mask[[i for i in hit if i is not None]] = True
            clean = ~mask[idx]
        model = self.model.kinds.get(kind) if self.model is not None else None
        if model is None or self.model is None:
            self._keep(kind, k, raw[clean], ctx.end)
            return
        x = _transform(kind, raw)
        scores = self.model.score(kind, x, cfg.envelope_scales)
        k.last_idx, k.last_scores = idx, scores
        if congested:
            # a congestion rule alert on the entity's switch explains its congestion symptoms:
            # an outlier there that is normal without them is explained (its other features,
            # physical-layer or transport errors, still count)
            ids = [self.switch_ids[sw] for sw in congested if sw in self.switch_ids]
            near = np.flatnonzero(clean & (scores > model.threshold) & np.isin(k.switch[idx], ids))
            if len(near):
                cols = [j for j, f in enumerate(FEATURES[kind]) if f.congestion]
                cf = x[near].copy()
                cf[:, cols] = model.median[cols]
                clean[near] = self.model.score(kind, cf, cfg.envelope_scales) > model.threshold
        if not clean.all():  # a rule explains them: they start over once it is gone
            gone = idx[~clean]
            k.threshold.reset(gone)
            for i in gone.tolist():
                self.active.pop((kind, *ents[i]), None)
        judged = idx[clean]
        high = int((scores[clean] > model.threshold).sum())
        shifted = high > max(3, cfg.max_share * len(judged))
        if shifted:
            # most of the fabric at once: the workload changed, not the entities; nobody fires
            # from this window, and its rows train the next fit
            if not k.shifted:
                log.warning(
                    "isolation forest: %d of %d %s entities score above the threshold at once: "
                    "a regime the model never saw (no PortAnomaly until it passes or a retrain "
                    "learns it)",
                    high,
                    len(judged),
                    kind,
                )
            k.shifted = True
            entered, cleared = k.threshold.update(judged, np.zeros(len(judged)), n, 1.0)
        else:
            k.shifted = False
            entered, cleared = k.threshold.update(judged, scores[clean], n, model.threshold)
        for i in cleared.tolist():
            self.active.pop((kind, *ents[i]), None)
        if len(entered):
            where = {int(i): p for p, i in enumerate(idx.tolist())}
            for i in entered.tolist():  # the few that fire
                p = where[i]
                key: Key = (kind, *ents[i])
                self.active[key] = self._finding(
                    kind, key, float(scores[p]), x[p], raw[p], int(ts[i]), model
                )
        calm = clean & (k.threshold.streak[idx] == 0) & ~k.threshold.alerting[idx]
        self._keep(kind, k, raw[calm], ctx.end)
        if shifted:
            self.shifted_windows += 1

    def _keep(self, kind: str, k: _Kind, rows: np.ndarray, end: int) -> None:
        """Keep a window's clean rows for training, sampled so a kind keeps at most about
        ``max_training_rows`` over its training span; forget windows beyond it."""
        cfg = self.config
        if len(rows) == 0:
            return
        span = cfg.baseline_s if self.model is None else cfg.training_s
        cap = max(1, math.ceil(cfg.max_training_rows * cfg.feature_window_s / max(span, 1e-9)))
        if len(rows) > cap:
            rng = np.random.default_rng([cfg.seed, end // self.window_ns, KINDS.index(kind)])
            rows = rows[np.sort(rng.choice(len(rows), cap, replace=False))]
        k.rows.append((end, rows))
        horizon = end - round(max(cfg.training_s, cfg.baseline_s) * S)
        while k.rows and k.rows[0][0] <= horizon:
            k.rows.popleft()

    def _fit(self, ctx: StepContext, why: str) -> None:
        cfg = self.config
        t0 = time.process_time()
        kinds: dict[str, KindModel] = dict(self.model.kinds) if self.model is not None else {}
        rows: dict[str, int] = {}
        for i, (kind, k) in enumerate(self.kinds.items()):
            if not k.rows:
                continue
            data = np.concatenate([r for _, r in k.rows])
            if len(data) < cfg.min_training_rows:
                continue
            seed = np.random.SeedSequence([int(cfg.seed), self.fits, i]).generate_state(1)[0]
            kinds[kind] = fit_kind(kind, data, cfg, int(seed))
            rows[kind] = len(data)
        spent = time.process_time() - t0
        self.fit_seconds.append(spent)
        self.fits += 1
        since = min((k.rows[0][0] for k in self.kinds.values() if k.rows), default=ctx.end)
        self.model = ForestModel(
            kinds=kinds,
            meta={
                "trained": why,
                "from_ns": int(since - self.window_ns),
                "to_ns": int(ctx.end),
                "rows": rows,
                "seed": int(cfg.seed),
                "fit": self.fits,
                "feature_window_s": cfg.feature_window_s,
                "threshold_quantile": cfg.threshold_quantile,
                "threshold_margin": cfg.threshold_margin,
                "n_estimators": int(cfg.n_estimators),
                "max_samples": int(cfg.max_samples),
            },
        )
        if cfg.retrain_every_s > 0:
            self.next_fit_ns = ctx.end + round(cfg.retrain_every_s * S)
        log.info(
            "isolation forest %s fit on %s rows in %.2f s CPU; thresholds %s",
            why,
            rows or "no",
            spent,
            {k: round(m.threshold, 3) for k, m in kinds.items()},
        )
        if cfg.save_path:
            self.model.save(cfg.save_path)

    # --- explanations and suppression ------------------------------------------------------------
    def _finding(
        self,
        kind: str,
        key: Key,
        score: float,
        x: np.ndarray,
        raw: np.ndarray,
        ts: int,
        model: KindModel,
    ) -> Finding:
        cfg = self.config
        assert self.model is not None
        _, dev, port = key
        z = self.model.zscores(kind, x[None, :])[0]
        _, direction = _statics(kind)
        push = np.where(direction > 0, z, np.where(direction < 0, -z, np.abs(z)))
        push = np.where([f.name == "role" for f in FEATURES[kind]], -np.inf, push)
        top = [int(j) for j in np.argsort(-push, kind="stable")[: cfg.top_features]]
        feats = FEATURES[kind]

        def show(j: int) -> str:
            f = feats[j]
            unit = f" {f.unit}" if f.unit else ""
            return (
                f"{f.name} {_num(raw[j])}{unit} (training median {_num(model.raw_median[j])}, "
                f"z {z[j]:+.1f})"
            )

        who = f"{dev}/{port}"
        what = "NIC" if kind == "nic" else "switch port"
        labels = (
            node_labels(self.topology, dev, port)
            if kind == "nic"
            else port_labels(self.topology, dev, port)
        )
        meta = self.model.meta
        trained = (
            f"model trained on {model.rows} rows ({meta.get('trained', 'loaded')}, seed "
            f"{meta.get('seed', '?')})"
        )
        q = cfg.threshold_quantile
        return Finding(
            ALERTNAME,
            labels,
            "warning",
            ts,
            summary=f"{who}: {what} behaves unlike anything in its baseline "
            f"({', '.join(feats[j].name for j in top)})",
            description=f"{who}'s {what} features together are an outlier for the isolation "
            "forest trained on this fabric's healthy baseline, and no rule alert explains it.",
            evidence=f"anomaly score {score:.3f} above threshold {model.threshold:.3f} "
            f"(the {q:g} quantile of training scores + {cfg.threshold_margin:g}) in "
            f"{cfg.sustain_windows} windows of {cfg.feature_window_s:g} s in a row; "
            f"features that pushed it: {'; '.join(show(j) for j in top)}; {trained}",
            extra={
                "score": f"{score:.3f}",
                "threshold": f"{model.threshold:.3f}",
                "features": ", ".join(f"{feats[j].name}={z[j]:+.1f}" for j in top),
            },
        )

    def _explained(self, ctx: StepContext) -> tuple[set[Key], set[str]]:
        """Entities with a rule alert firing (with the other end of their cable), and the
        switches where a congestion rule fires (on a port, or on a NIC cabled to it)."""
        if not self.config.suppress_explained or ctx.firing is None:
            return set(), set()
        out: set[Key] = set()
        congested: set[str] = set()
        for labels in ctx.firing():
            name = labels.get("alertname")
            # a configuration mismatch explains no outlier (it names a setting, not a symptom)
            if name in (ALERTNAME, FABRIC_INCIDENT, ROCE_CONFIG_MISMATCH):
                continue
            ends: list[NicEnd | PortEnd] = []
            if "node" in labels and "nic" in labels:
                ends.append(NicEnd(labels["node"], labels["nic"]))
            if "switch" in labels and "port" in labels:
                ends.append(PortEnd(labels["switch"], labels["port"]))
            for e in ends:
                peer = self.topology.peer(e)
                for end in (e, peer) if peer is not None else (e,):
                    if isinstance(end, NicEnd):
                        out.add(("nic", end.node, end.nic))
                    else:
                        out.add(("port", end.switch, end.port))
                        if name in CONGESTION_RULES:
                            congested.add(end.switch)
        return out, congested

    # --- introspection and persistence -----------------------------------------------------------
    def scores(self, kind: str) -> dict[tuple[str, str], float]:
        """The last window's scores of ``kind``'s entities (empty before a model exists)."""
        k = self.kinds[kind]
        ents = k.acc.entities
        return {ents[i]: float(s) for i, s in zip(k.last_idx.tolist(), k.last_scores, strict=True)}

    def save(self, path: str | Path) -> None:
        """Persist the current model (``ConfigError`` before there is one)."""
        if self.model is None:
            raise ConfigError("isolation forest: no model yet (the baseline is not complete)")
        self.model.save(path)

    def load(self, path: str | Path) -> None:
        """Score with a saved model from now on."""
        self.model = ForestModel.load(path)


def _num(x: float) -> str:
    if not math.isfinite(x):
        return "n/a"
    return f"{x:.3g}"


def build(
    topology: Topology, config: IsolationForestConfig | None = None
) -> IsolationForestDetector:
    return IsolationForestDetector(topology, config or IsolationForestConfig())
