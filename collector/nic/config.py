"""The node agent's config section (``agent:``), kept apart from the sampling code so that the
config loader can know it without importing anything else of the agent."""

from __future__ import annotations

import socket
from dataclasses import dataclass

from rocewatch.core.errors import ConfigError


@dataclass(frozen=True)
class AgentConfig:
    node: str = ""  # the scheduler's node name; default: this host's name
    interval_s: float = 1.0
    sysfs_root: str = "/sys"
    nics: tuple[str, ...] = ()  # RDMA devices to sample; default: every one in sysfs
    netdevs: tuple[str, ...] = ()  # more netdevs without an RDMA device
    ethtool: str = "ioctl"  # ioctl | command (fork `ethtool -S`) | off
    mlxlink: str = "auto"  # auto (when the tool exists) | off
    mlxlink_interval_s: float = 10.0
    spool_dir: str = "./rocewatch-agent-spool"
    spool_max_bytes: int = 256 << 20
    spool_segment_bytes: int = 256 << 10
    kafka_format: str = "batch"  # batch (TelemetryBatch on the telemetry topic) | json
    kafka_topic: str = ""  # default: the telemetry topic

    def validate(self) -> None:
        if not 0.1 <= self.interval_s <= 3600:
            raise ConfigError(f"agent.interval_s: {self.interval_s} (0.1 .. 3600)")
        if self.ethtool not in ("ioctl", "command", "off"):
            raise ConfigError(f"agent.ethtool: {self.ethtool!r} (ioctl, command or off)")
        if self.mlxlink not in ("auto", "off"):
            raise ConfigError(f"agent.mlxlink: {self.mlxlink!r} (auto or off)")
        if self.kafka_format not in ("batch", "json"):
            raise ConfigError(f"agent.kafka_format: {self.kafka_format!r} (batch or json)")
        if self.spool_max_bytes < 2 * self.spool_segment_bytes or self.spool_segment_bytes < 1024:
            raise ConfigError("agent.spool_max_bytes must hold two spool_segment_bytes (>= 1 KiB)")

    def node_name(self) -> str:
        return self.node or socket.gethostname()


def agent_config(d: object) -> AgentConfig:
    """The ``agent:`` section's mapping, validated (collector/registry.py ``nic``)."""
    from rocewatch.core.config import build

    return build(AgentConfig, d, "agent")
