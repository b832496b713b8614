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

Modules: ``features`` (what a window's counters become), ``accumulate`` (the per-series sums,
in the detector or in stage 1), ``model`` (the forests, compiled and saved), ``config``,
``detector`` (scoring, thresholds, explanations, alerts). Every class of them is exported here,
and a checkpoint names it by this package (``detectors.isolation_forest:<class>``), so moving a
class between the modules changes no record.
"""

from __future__ import annotations

from detectors.isolation_forest.accumulate import (
    FeatureFeed,
    _Accumulator,
    _FedAccumulator,
    _Series,
    add_step,
    window_frame,
)
from detectors.isolation_forest.config import IsolationForestConfig
from detectors.isolation_forest.detector import (
    ALERTNAME,
    CONGESTION_RULES,
    IsolationForestDetector,
    Threshold,
    _Kind,
    build,
)
from detectors.isolation_forest.features import (
    FEATURES,
    KINDS,
    METRICS,
    NIC_FEATURES,
    NIC_METRICS,
    PORT_FEATURES,
    PORT_METRICS,
    Feature,
    feature_names,
)
from detectors.isolation_forest.model import (
    FORMAT,
    MODEL_KIND,
    MODEL_VERSION,
    CompiledForest,
    ForestModel,
    KindModel,
    _transform,
    fit_kind,
)

__all__ = [
    "ALERTNAME",
    "CONGESTION_RULES",
    "FEATURES",
    "FORMAT",
    "KINDS",
    "METRICS",
    "MODEL_KIND",
    "MODEL_VERSION",
    "NIC_FEATURES",
    "NIC_METRICS",
    "PORT_FEATURES",
    "PORT_METRICS",
    "CompiledForest",
    "Feature",
    "FeatureFeed",
    "ForestModel",
    "IsolationForestConfig",
    "IsolationForestDetector",
    "KindModel",
    "Threshold",
    "_Accumulator",
    "_FedAccumulator",
    "_Kind",
    "_Series",
    "_transform",
    "add_step",
    "build",
    "feature_names",
    "fit_kind",
    "window_frame",
]
