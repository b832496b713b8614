"""SQL storage: alerts, actions and metric rollups for Grafana and the audit trail."""

from rocewatch.core.rollups import ROLLUP_COLUMNS
from storage.models import SCHEMA_VERSION
from storage.store import Store, redact

__all__ = ["ROLLUP_COLUMNS", "SCHEMA_VERSION", "Store", "redact"]
