"""SQL storage: alerts, actions and metric rollups for Grafana and the audit trail."""

from storage.models import SCHEMA_VERSION
from storage.store import ROLLUP_COLUMNS, Store, redact

__all__ = ["ROLLUP_COLUMNS", "SCHEMA_VERSION", "Store", "redact"]
