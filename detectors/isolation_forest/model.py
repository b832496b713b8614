"""The fitted model: one scikit-learn isolation forest per entity kind, compiled to arrays for
scoring, saved as a rocewatch checkpoint (its trees as arrays, nothing a load executes)."""

from __future__ import annotations

import importlib.metadata
import logging
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from detectors.isolation_forest.config import IsolationForestConfig
from detectors.isolation_forest.features import _FLOOR, FEATURES, KINDS, feature_names
from rocewatch.core import checkpoint
from rocewatch.core.checkpoint import CheckpointError
from rocewatch.core.errors import ConfigError

if TYPE_CHECKING:
    from sklearn.ensemble import IsolationForest

log = logging.getLogger(__name__)


def sklearn_version() -> str:
    """The installed scikit-learn's version, read without importing it (about 1 s at start-up:
    a process that never fits a forest, as one that loads its model, does not need it)."""
    try:
        return importlib.metadata.version("scikit-learn")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


FORMAT = "rocewatch-isolation-forest"
# 2: the trees as arrays in a rocewatch checkpoint (1 was a joblib pickle, no longer read)
MODEL_VERSION = 2
MODEL_KIND = "isolation-forest-model"  # the checkpoint kind of a model file


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


# the record types a model file holds besides data (its arrays are in them)
MODEL_TYPES = checkpoint.StateTypes([KindModel, CompiledForest])


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
                    "sklearn": sklearn_version(),
                },
                MODEL_KIND,
                MODEL_TYPES,
            )
        )
        tmp.replace(p)

    @classmethod
    def load(cls, path: str | Path) -> ForestModel:
        """Read a saved model; ``ConfigError`` when it is missing, foreign, of another version,
        or built on another feature list than this rocewatch computes. Nothing in the file is
        executed: it holds arrays and numbers."""
        try:
            doc = checkpoint.loads(Path(path).read_bytes(), MODEL_KIND, MODEL_TYPES)
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
        if doc.get("sklearn") != sklearn_version():
            log.warning(
                "%s: trained with scikit-learn %s, running %s",
                path,
                doc.get("sklearn"),
                sklearn_version(),
            )
        return cls(kinds=kinds, meta=dict(doc.get("meta") or {}), features=got)


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
    from sklearn.ensemble import IsolationForest  # here: see sklearn_version

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
