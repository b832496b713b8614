"""PortAnomaly's configuration (``detectors.isolation_forest`` in the config file)."""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

from rocewatch.core.errors import ConfigError

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
