"""Collectors by name: what the rest of rocewatch knows of each input. A collector is one
folder (its decoder, its frozen config dataclass validated at start, its runner) plus one entry
here; the product config validates each collector's section when the file is loaded (not when
the collector first runs), and the configuration reference lists them."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from collector.gnmi.config import gnmi_config
from collector.nic.config import AgentConfig
from rocewatch.core.config import build


@dataclass(frozen=True)
class CollectorEntry:
    section: str  # its config section (top-level key), or "" when it has none
    load: Callable[[Any], Any] | None  # that section's mapping -> its validated config
    command: str  # the rocewatch command that runs it
    help: str


COLLECTORS: dict[str, CollectorEntry] = {
    "gnmi": CollectorEntry("gnmi", gnmi_config, "collect", "gNMI subscriptions to switches"),
    "gnmic": CollectorEntry("", None, "collect --gnmic-topic", "gnmic's Kafka event output"),
    "inband": CollectorEntry("", None, "int-listen", "INT telemetry reports over UDP"),
    "nic": CollectorEntry(
        "agent", lambda d: build(AgentConfig, d, "agent"), "agent", "the node agent (NICs)"
    ),
    "nccl": CollectorEntry("", None, "nccl-collect", "NCCL Inspector output of a job"),
}


def validate_sections(doc: dict[str, Any], where: str = "config") -> None:
    """Each collector's section of a config document, validated now (``ConfigError`` naming
    the key): a typo in ``gnmi:`` stops every command at start, not the collector later."""
    for entry in COLLECTORS.values():
        if entry.load is not None and entry.section in doc:
            entry.load(doc[entry.section])
