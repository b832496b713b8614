"""PortAnomaly: multivariate outliers per NIC and switch port, by an isolation forest.

Every ``feature_window_s`` (1 s) each NIC and switch port becomes one feature vector, built
from what its counters added over the window (accumulated here step by step, per series, in
numpy arrays: the detector reads only the newest step, never the window engine's history).
Features are relative wherever the raw level depends on the workload rather than on health:
pause time as a share of the window, ECN marks, CNPs and out-of-sequence packets per MB carried,
throughput against the median of the NIC's peers (its job's NICs on the same rail: one NCCL
ring), pre-FEC BER from corrected bits over the link speed, queue occupancy as a share of the
switch buffer. ``NIC_FEATURES`` and ``PORT_FEATURES`` list them.

Scoring and thresholding are separate (``ForestModel.score``, ``Threshold``):

- **score**: one scikit-learn ``IsolationForest`` per entity kind scores all entities of the kind
  at once, once a window. An isolation forest cannot see a value beyond anything in its training
  data (the point follows the splits of the most extreme training points, and a feature that
  never varied in training is never split on), yet "a counter that never moved now moves" is the
  commonest failure. So the score combines the forest's (~0.4-0.5 normal, towards 1 isolated)
  with an *envelope* term, growing with the distance in robust training scales beyond the
  training range on the side where leaving it means trouble:
  ``1 - (1 - forest) * (1 - envelope)``.
- **threshold**: a high quantile (``threshold_quantile``) of the training scores plus
  ``threshold_margin``; an entity fires after ``sustain_windows`` windows above it in a row and
  clears after ``clear_windows`` below. When more than ``max_share`` of a kind's entities are
  above it at once, the workload changed (a regime the model never saw), not the entities:
  nobody fires, and those windows train the next fit.

Each alert names the features that pushed its score: robust z-scores (median, MAD) against the
training distribution, the ``top_features`` largest, with their values and training medians.

"A multivariate outlier that no rule explains" (``StepContext.firing``):

- an entity with a rule alert firing, or the other end of its cable, raises no PortAnomaly;
- a congestion rule alert (``CONGESTION_RULES``) explains congestion symptoms on its switch: an
  outlier among that switch's ports and the NICs cabled to it is explained when, with its
  congestion features set to their training medians, it scores below the threshold (its
  physical-layer and transport features still count). So the victims of an incast or of a slow
  NIC, pausing and receiving CNPs, are not blamed.

Explained entities start over (their streaks reset) and their rows do not train the model.
This stays in the detector because an inhibit rule cannot say it: the cable's other end, the
congestion counterfactual and what trains the model need the forest's own view, and without
them victims of a storm or an incast would raise PortAnomaly. What a rule can say, it says: the
default inhibit rules (docs/alerting.md) also inhibit a PortAnomaly that fired a moment before
a rule alert on the same NIC or port. Grouped alerts (a storm's victims) are read member by
member (``StepContext.firing``), as before grouping.

Baseline: with no model (``model_path``) the detector learns from the first ``baseline_s`` of
telemetry and raises nothing until then (120 s: the simulator's 20-40 s scenarios stay silent
unless it is set shorter). It retrains every ``retrain_every_s`` from the last ``training_s`` of
windows in which the entity was neither alerting, nor above the threshold, nor explained (at most
about ``max_training_rows`` rows a kind, sampled per window with the seed). ``save_path`` writes
the model after every fit; ``ForestModel.load`` refuses (``ConfigError``) a model of another
version or feature list. A model file is a rocewatch checkpoint (docs/formats/checkpoint.md):
the trees as arrays, nothing that loading would execute.

Randomness comes only from ``seed``: the same telemetry and config give the same forest, scores
and alerts (training rows are put in entity-key order, whatever order the steps' rows came in).

Cost: a step adds its rows to the per-series sums (one concat of the step's per-metric frames,
one hash, ``np.add.at``); a window computes the features in numpy and scores each kind in one
pass over the trees (``CompiledForest``); a fit takes ~0.3 s CPU for ~10k rows.
"""

from __future__ import annotations

import logging
import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import polars as pl

from detectors.base import Finding, StepContext, node_labels, port_labels
from detectors.windows import Step, sorted_lookup
from rocewatch import checkpoint
from rocewatch.checkpoint import CheckpointError
from rocewatch.errors import ConfigError
from rocewatch.topology import NicEnd, PortEnd, Topology

if TYPE_CHECKING:
    from sklearn.ensemble import IsolationForest

log = logging.getLogger(__name__)

S = 1_000_000_000
FORMAT = "rocewatch-isolation-forest"
# 2: the trees as arrays in a rocewatch checkpoint (1 was a joblib pickle, no longer read)
MODEL_VERSION = 2
MODEL_KIND = "isolation-forest-model"  # the checkpoint kind of a model file
ALERTNAME = "PortAnomaly"
# rule alerts that say "this switch is congested": they may explain congestion symptoms of the
# switch's other ports and of the NICs cabled to it
CONGESTION_RULES = frozenset(
    {"PFCStorm", "ECNCongestion", "QueueBuildup", "Straggler", "PCIeDowngrade"}
)
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


# --- config ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class IsolationForestConfig:
    enabled: bool = True
    model_path: str | None = None  # a saved model to score with (``replay --model``); else learn
    save_path: str | None = None  # write the model here after every fit
    feature_window_s: float = 1.0  # one vector per entity and one scoring per window
    # learned from the first minutes of telemetry when no model is given; the simulator's
    # 20-40 s scenarios therefore stay silent unless configured shorter
    baseline_s: float = 120.0
    retrain_every_s: float = 3600.0  # 0: never retrain
    training_s: float = 3600.0  # how far back a retraining looks
    max_training_rows: int = 50_000  # per entity kind
    min_training_rows: int = 64  # a kind with fewer rows gets no model (and raises nothing)
    n_estimators: int = 100
    max_samples: int = 256
    seed: int = 0
    threshold_quantile: float = 0.999
    threshold_margin: float = 0.03  # added to the quantile: unseen healthy data scores a bit higher
    envelope_scales: float = 8.0  # this many robust scales beyond the training range: 0.5
    # more than this share of a kind's entities above the threshold in one window is a workload
    # the model never saw, not that many anomalies: nobody fires (see _judge)
    max_share: float = 0.3
    sustain_windows: int = 3
    clear_windows: int = 2
    min_coverage: float = 0.5  # an entity's counters must span this share of the window...
    max_coverage: float = 1.5  # ...and no more (a gap's catch-up is not comparable)
    top_features: int = 3
    suppress_explained: bool = True  # no PortAnomaly where a rule alert explains the entity

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        where = "detectors.isolation_forest"
        for f in fields(self):
            v = getattr(self, f.name)
            if f.name in ("model_path", "save_path"):
                if v is not None and not isinstance(v, str):
                    raise ConfigError(f"{where}.{f.name}: {v!r} is not a file path")
                continue
            if f.name in ("enabled", "suppress_explained"):
                if not isinstance(v, bool):
                    raise ConfigError(f"{where}.{f.name}: {v!r} is not true or false")
                continue
            if not isinstance(v, int | float) or isinstance(v, bool) or not math.isfinite(v):
                raise ConfigError(f"{where}.{f.name}: {v!r} is not a number")
            if v < 0:
                raise ConfigError(f"{where}.{f.name}: must be >= 0, not {v!r}")
        for name in (
            "max_training_rows",
            "min_training_rows",
            "n_estimators",
            "max_samples",
            "seed",
            "sustain_windows",
            "clear_windows",
            "top_features",
        ):
            if int(getattr(self, name)) != getattr(self, name):
                raise ConfigError(f"{where}.{name}: must be a whole number")
        if self.feature_window_s <= 0 or self.n_estimators < 1 or self.max_samples < 2:
            raise ConfigError(
                f"{where}: feature_window_s must be > 0, n_estimators >= 1, max_samples >= 2"
            )
        if self.sustain_windows < 1 or self.clear_windows < 1 or self.min_training_rows < 2:
            raise ConfigError(
                f"{where}: sustain_windows and clear_windows must be >= 1, min_training_rows >= 2"
            )
        if not 0 < self.max_share <= 1:
            raise ConfigError(f"{where}.max_share: must be within (0, 1]")
        if not 0 < self.threshold_quantile <= 1:
            raise ConfigError(f"{where}.threshold_quantile: must be within (0, 1]")
        if not 0 < self.min_coverage <= 1 <= self.max_coverage:
            raise ConfigError(f"{where}: need 0 < min_coverage <= 1 <= max_coverage")
        if self.envelope_scales <= 0 or self.baseline_s < self.feature_window_s:
            raise ConfigError(
                f"{where}: envelope_scales must be > 0, baseline_s >= feature_window_s"
            )


# --- the model (scoring) --------------------------------------------------------------------------


def _path_length(n: np.ndarray) -> np.ndarray:
    """Average path length of an unsuccessful search in a binary tree of ``n`` points (the
    isolation-forest normaliser ``c(n)``)."""
    n = np.asarray(n, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        c = 2.0 * (np.log(n - 1.0) + np.euler_gamma) - 2.0 * (n - 1.0) / n
    return np.where(n <= 1, 0.0, np.where(n == 2, 1.0, c))


class CompiledForest:
    """A fitted ``IsolationForest`` as plain arrays, scored without scikit-learn.

    Every tree's nodes are laid end to end (``left``, ``right``, the column each splits on,
    its threshold, the path length of a row that ends there: node depth + ``c(samples
    left)``); a leaf points at itself. Scoring walks all rows down all trees at once, one
    level per step, comparing as scikit-learn's trees do (the row's value as float32 against
    the float64 threshold), so the scores are ``-score_samples``'s (the tests hold it to
    that). The arrays are the model: a checkpoint or model file stores them, never the
    scikit-learn object, and a loaded model scores exactly as the one saved.
    """

    def __init__(
        self,
        left: np.ndarray,
        right: np.ndarray,
        column: np.ndarray,
        threshold: np.ndarray,
        path: np.ndarray,
        roots: np.ndarray,
        depth: int,
        norm: float,
    ) -> None:
        self.left, self.right, self.column = left, right, column
        self.threshold, self.path, self.roots = threshold, path, roots
        self.depth, self.norm = depth, norm

    @classmethod
    def of(cls, forest: IsolationForest) -> CompiledForest:
        """The arrays of a fitted forest."""
        lefts, rights, cols, thrs, paths, roots = [], [], [], [], [], []
        at, depth = 0, 0
        for e, features in zip(forest.estimators_, forest.estimators_features_, strict=True):
            tr = e.tree_
            n = int(tr.node_count)
            leaf = tr.children_left < 0
            own = np.arange(at, at + n, dtype=np.int64)
            lefts.append(np.where(leaf, own, tr.children_left + at))
            rights.append(np.where(leaf, own, tr.children_right + at))
            cols.append(np.where(leaf, 0, np.asarray(features, dtype=np.int64)[tr.feature]))
            thrs.append(np.where(leaf, np.inf, tr.threshold))
            paths.append(tr.compute_node_depths() - 1.0 + _path_length(tr.n_node_samples))
            roots.append(at)
            depth = max(depth, int(tr.max_depth))
            at += n
        norm = len(roots) * float(_path_length(np.array([forest.max_samples_]))[0])
        return cls(
            np.concatenate(lefts).astype(np.int64),
            np.concatenate(rights).astype(np.int64),
            np.concatenate(cols).astype(np.int64),
            np.concatenate(thrs).astype(np.float64),
            np.concatenate(paths).astype(np.float64),
            np.asarray(roots, dtype=np.int64),
            depth,
            norm,
        )

    def score(self, x: np.ndarray) -> np.ndarray:
        """Isolation scores 2^(-E[h(x)]/c(max_samples)) of rows ``x``: ~0.5 normal, 1 isolated."""
        # what scikit-learn's trees compare: the value as float32, widened to the threshold's
        x64 = np.ascontiguousarray(x, dtype=np.float32).astype(np.float64)
        rows = np.arange(len(x))[:, None]
        node = np.broadcast_to(self.roots, (len(x), len(self.roots)))
        for _ in range(self.depth):
            go_left = x64[rows, self.column[node]] <= self.threshold[node]
            node = np.where(go_left, self.left[node], self.right[node])
        depth = self.path[node].sum(axis=1) if len(self.roots) else np.zeros(len(x))
        return np.asarray(np.exp2(-depth / self.norm) if self.norm > 0 else np.ones(len(x)))


@dataclass
class KindModel:
    """The forest of one entity kind, with the training statistics scoring and explaining use."""

    features: list[str]
    forest: CompiledForest  # the trees, as arrays
    median: np.ndarray  # transformed units; also fills missing values
    scale: np.ndarray  # robust scale: max(1.4826 * MAD, floor)
    lo: np.ndarray  # training range
    hi: np.ndarray
    raw_median: np.ndarray  # in the features' own units, for the evidence
    threshold: float
    train_quantiles: dict[str, float]
    rows: int


def _transform(kind: str, raw: np.ndarray) -> np.ndarray:
    """Raw feature values (rows x features) -> what the forest sees."""
    x = np.empty_like(raw)
    for j, f in enumerate(FEATURES[kind]):
        v = raw[:, j]
        if f.transform == "share":
            x[:, j] = np.clip(v, 0.0, 1.0)
        elif f.transform == "log1p":
            x[:, j] = np.log1p(np.maximum(v, 0.0))
        elif f.transform == "log10":
            x[:, j] = np.log10(np.maximum(v, 1e-13))
        elif f.transform == "log2":
            x[:, j] = np.log2(np.clip(v, 1 / 64, 64))
        else:
            x[:, j] = v
    return x


def _statics(kind: str) -> tuple[np.ndarray, np.ndarray]:
    """Per feature: the scale floor, and the envelope direction (NaN: not judged)."""
    fs = FEATURES[kind]
    floor = np.array([_FLOOR[f.transform] for f in fs])
    direction = np.array([np.nan if f.direction is None else f.direction for f in fs], dtype=float)
    return floor, direction


@dataclass
class ForestModel:
    """What ``save`` persists: a forest per entity kind, thresholds, and how it was trained.

    >>> m = ForestModel(meta={"seed": 0})
    >>> m.kinds, sorted(m.features)
    ({}, ['nic', 'port'])
    """

    kinds: dict[str, KindModel] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)
    features: dict[str, list[str]] = field(
        default_factory=lambda: {k: feature_names(k) for k in KINDS}
    )
    version: int = MODEL_VERSION

    # --- scoring ---------------------------------------------------------------------------------
    def score(self, kind: str, x: np.ndarray, envelope_scales: float) -> np.ndarray:
        """Anomaly scores in [0, 1) of transformed rows ``x`` (NaN: filled with the medians)."""
        m = self.kinds[kind]
        x = np.where(np.isnan(x), m.median, x)
        forest = m.forest.score(x)  # = -IsolationForest.score_samples(x)
        _, direction = _statics(kind)
        above = np.maximum(x - m.hi, 0.0) / m.scale
        below = np.maximum(m.lo - x, 0.0) / m.scale
        beyond = np.where(direction > 0, above, 0.0) + np.where(direction < 0, below, 0.0)
        beyond += np.where(direction == 0, above + below, 0.0)
        envelope = 1.0 - np.exp2(-beyond.max(axis=1) / envelope_scales)
        return np.asarray(1.0 - (1.0 - forest) * (1.0 - envelope))

    def zscores(self, kind: str, x: np.ndarray) -> np.ndarray:
        """Robust z-scores of transformed rows against the training distribution."""
        m = self.kinds[kind]
        return np.asarray((np.where(np.isnan(x), m.median, x) - m.median) / m.scale)

    # --- persistence -----------------------------------------------------------------------------
    def save(self, path: str | Path) -> None:
        """Write the model (a rocewatch checkpoint: docs/formats/checkpoint.md), with its
        version, feature lists and training metadata."""
        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        tmp = p.with_name(p.name + ".tmp")
        tmp.write_bytes(
            checkpoint.dumps(
                {
                    "format": FORMAT,
                    "version": self.version,
                    "features": self.features,
                    "meta": self.meta,
                    "kinds": self.kinds,
                    "sklearn": _sklearn_version(),
                },
                MODEL_KIND,
            )
        )
        tmp.replace(p)

    @classmethod
    def load(cls, path: str | Path) -> ForestModel:
        """Read a saved model; ``ConfigError`` when it is missing, foreign, of another version,
        or built on another feature list than this rocewatch computes. Nothing in the file is
        executed: it holds arrays and numbers."""
        try:
            doc = checkpoint.loads(Path(path).read_bytes(), MODEL_KIND)
        except FileNotFoundError as e:
            raise ConfigError(f"{path}: no such model file") from e
        except (OSError, CheckpointError) as e:  # a torn, foreign or older (joblib) file
            raise ConfigError(f"{path}: not an isolation-forest model ({e}); retrain it") from e
        if not isinstance(doc, dict) or doc.get("format") != FORMAT:
            raise ConfigError(f"{path}: not a rocewatch isolation-forest model")
        if doc.get("version") != MODEL_VERSION:
            raise ConfigError(
                f"{path}: model version {doc.get('version')!r}, this rocewatch reads "
                f"{MODEL_VERSION}: retrain it"
            )
        want = {k: feature_names(k) for k in KINDS}
        got = doc.get("features")
        if got != want:
            raise ConfigError(
                f"{path}: model built on another feature list ({_feature_diff(got, want)}); "
                "retrain it"
            )
        kinds = doc.get("kinds")
        if not isinstance(kinds, dict) or not all(
            isinstance(v, KindModel)
            and isinstance(v.forest, CompiledForest)
            and v.features == want[k]
            for k, v in kinds.items()
        ):
            raise ConfigError(f"{path}: model holds no usable forest")
        if doc.get("sklearn") != _sklearn_version():
            log.warning(
                "%s: trained with scikit-learn %s, running %s",
                path,
                doc.get("sklearn"),
                _sklearn_version(),
            )
        return cls(kinds=kinds, meta=dict(doc.get("meta") or {}), features=got)


def _sklearn_version() -> str:
    """The installed scikit-learn's version, read from its package metadata: scikit-learn
    (with SciPy, about 1.3 s) is imported only when a forest is trained (``fit_kind``), so a
    detector that scores a saved model, or has not trained yet, starts without it."""
    try:
        return metadata.version("scikit-learn")
    except metadata.PackageNotFoundError:
        return "none"


def _feature_diff(got: Any, want: dict[str, list[str]]) -> str:
    """What differs between a model's feature lists and this rocewatch's, in a few words."""
    got = got if isinstance(got, dict) else {}
    out = []
    for kind, names in want.items():
        have = got.get(kind)
        have = list(have) if isinstance(have, list | tuple) else []
        if have == names:
            continue
        lacks = [n for n in names if n not in have]
        extra = [n for n in have if n not in names]
        why = []
        if lacks:
            why.append(f"lacks {', '.join(lacks)}")
        if extra:
            why.append(f"has {', '.join(extra)}")
        out.append(f"{kind}: {'; '.join(why) or 'another order'}")
    return ", ".join(out)


def fit_kind(
    kind: str,
    raw: np.ndarray,
    config: IsolationForestConfig,
    random_state: int,
) -> KindModel:
    """Fit one kind's forest on raw training rows and learn its threshold from their scores."""
    from sklearn.ensemble import IsolationForest  # here, not at import: see _sklearn_version

    x = _transform(kind, raw)
    med = np.nanmedian(np.where(np.isnan(x).all(axis=0), 0.0, x), axis=0)
    x = np.where(np.isnan(x), med, x)
    floor, _ = _statics(kind)
    mad = np.median(np.abs(x - med), axis=0)
    scale = np.maximum(1.4826 * mad, floor)
    raw_med = np.nanmedian(np.where(np.isnan(raw).all(axis=0), 0.0, raw), axis=0)
    forest = CompiledForest.of(
        IsolationForest(
            n_estimators=int(config.n_estimators),
            max_samples=min(int(config.max_samples), len(x)),
            random_state=random_state,
        ).fit(x)
    )
    m = KindModel(
        features=feature_names(kind),
        forest=forest,
        median=med,
        scale=scale,
        lo=x.min(axis=0),
        hi=x.max(axis=0),
        raw_median=raw_med,
        threshold=math.inf,
        train_quantiles={},
        rows=len(x),
    )
    tmp = ForestModel(kinds={kind: m})
    s = tmp.score(kind, x, config.envelope_scales)
    qs = {f"q{q:g}": float(np.quantile(s, q)) for q in (0.5, 0.99, 0.999, 1.0)}
    m.train_quantiles = qs
    m.threshold = float(np.quantile(s, config.threshold_quantile)) + config.threshold_margin
    return m


# --- per-entity accumulation ----------------------------------------------------------------------


class _Series:
    """Stable slots for (device, port, qual) series, assigned to a frame's rows at once.

    Pickles as its key list; hashes are rebuilt on load (a checkpoint survives a Polars upgrade).
    """

    SEED = 0x1F0E57

    def __init__(self) -> None:
        self.keys: list[tuple[str, str, str]] = []
        self._sorted = np.empty(0, dtype=np.uint64)
        self._order = np.empty(0, dtype=np.int64)
        self._forget_positions()

    def _forget_positions(self, epoch: int | None = None) -> None:
        # the slot of each window-engine series position (-1: not looked up yet)
        self._epoch = epoch
        self._by_pos = np.empty(0, dtype=np.int64)

    def __len__(self) -> int:
        return len(self.keys)

    def __getstate__(self) -> list[tuple[str, str, str]]:
        return self.keys

    def __setstate__(self, keys: list[tuple[str, str, str]]) -> None:
        self.keys = keys
        self._forget_positions()
        self._rebuild()

    @classmethod
    def hash_expr(cls) -> pl.Expr:
        return pl.struct("device", "port", "qual").hash(seed=cls.SEED)

    def _lookup(self, h: np.ndarray) -> np.ndarray:
        if len(self._sorted) == 0:
            return np.full(len(h), -1, dtype=np.int64)
        return sorted_lookup(self._sorted, self._order, h)

    def _rebuild(self) -> None:
        if not self.keys:
            self._sorted = np.empty(0, dtype=np.uint64)
            self._order = np.empty(0, dtype=np.int64)
            return
        d, p, q = zip(*self.keys, strict=True)
        frame = pl.DataFrame({"device": list(d), "port": list(p), "qual": list(q)})
        h = frame.select(self.hash_expr()).to_series().to_numpy()
        self._order = np.argsort(h, kind="stable").astype(np.int64)
        self._sorted = h[self._order]

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
        epoch, pos = positions
        if epoch != self._epoch:
            self._forget_positions(epoch)
        if len(pos) and int(pos.max()) >= len(self._by_pos):
            grow = np.full(int(pos.max()) + 1 - len(self._by_pos), -1, dtype=np.int64)
            self._by_pos = np.concatenate([self._by_pos, grow])
        slots = self._by_pos[pos]
        miss = np.flatnonzero(slots < 0)
        new: list[tuple[str, str, str]] = []
        if len(miss):
            found, new = self.rows(hashes(miss), lambda i: keys_of(miss[i]))
            slots[miss] = found
            self._by_pos[pos[miss]] = found
        return slots, new

    def rows(
        self, h: np.ndarray, keys_of: Callable[[np.ndarray], list[tuple[str, str, str]]]
    ) -> tuple[np.ndarray, list[tuple[str, str, str]]]:
        """The slot of every row (by its ``hash_expr`` hash), and the keys seen for the first
        time (``keys_of(row indices)`` names them; only new series cost a Python step)."""
        slots = self._lookup(h)
        missing = np.flatnonzero(slots < 0)
        new: list[tuple[str, str, str]] = []
        if len(missing):
            _, first = np.unique(h[missing], return_index=True)
            new = keys_of(missing[np.sort(first)])
            self.keys += new
            self._rebuild()
            slots = self._lookup(h)
        return slots, new


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


class FeatureFeed:
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
class IsolationForestDetector:
    topology: Topology
    config: IsolationForestConfig = field(default_factory=IsolationForestConfig)
    name: str = "isolation_forest"
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
            if name in (ALERTNAME, "FabricIncident"):
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


__all__ = [
    "ForestModel",
    "IsolationForestConfig",
    "IsolationForestDetector",
    "Threshold",
    "build",
    "feature_names",
]
