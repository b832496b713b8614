"""rocewatch: streaming telemetry and anomaly detection for RoCE v2 fabrics."""

__version__ = "0.1.0"
