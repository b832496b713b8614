"""Collectors by name: what the rest of rocewatch knows of each input. A collector is one
folder (its decoder, its frozen config dataclass validated at start, its command's flags) plus
one entry here; the product config validates each collector's section when the file is loaded
(not when the collector first runs), the configuration reference lists them, and the
``rocewatch`` command line offers each entry's command with its flags (rocewatch/cli.py names
no collector command of its own but ``collect``).

An entry names its functions as ``"module:function"``, resolved when they are needed: building
the command line imports no collector (the agent starts lean), and a command's runner may sit in
the layer that wires a collector to Kafka and the configuration (``rocewatch.runtime``), which a
collector may not import.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class CollectorEntry:
    section: str  # its config section (top-level key), or "" when it has none
    load: str  # "module:function": that section's mapping -> its validated config ("": none)
    command: str  # the rocewatch command that runs it
    help: str
    # "module:function" adding the command's flags to its argparse parser, and running the
    # command (parsed args -> exit status); "" where rocewatch/cli.py defines the command
    arguments: str = ""
    run: str = ""


COLLECTORS: dict[str, CollectorEntry] = {
    "gnmi": CollectorEntry(
        "gnmi", "collector.gnmi.config:gnmi_config", "collect", "gNMI subscriptions to switches"
    ),
    "gnmic": CollectorEntry("", "", "collect --gnmic-topic", "gnmic's Kafka event output"),
    "inband": CollectorEntry(
        "",
        "",
        "int-listen",
        "receive INT Telemetry Reports over UDP and publish per-queue aggregates to Kafka "
        "(or a JSON lines file)",
        arguments="collector.inband.command:add_arguments",
        run="rocewatch.runtime.collectors:int_listen",
    ),
    "nic": CollectorEntry(
        "agent",
        "collector.nic.config:agent_config",
        "agent",
        "the node agent: sample NIC counters (ethtool, RDMA hw_counters, PCIe) and send "
        "snapshots to Kafka, spooled to disk while the broker is away",
        arguments="rocewatch.agent_cli:add_arguments",
        run="rocewatch.agent_cli:run",
    ),
    "nccl": CollectorEntry(
        "",
        "",
        "nccl-collect",
        "follow a job's NCCL Inspector directory and publish its telemetry to Kafka "
        "(or a JSON lines file); docs/nccl.md",
        arguments="collector.nccl.command:add_arguments",
        run="rocewatch.runtime.collectors:nccl_collect",
    ),
}


def resolve(ref: str) -> Callable[..., Any]:
    """The function a ``"module:function"`` reference names (imported now)."""
    module, _, name = ref.partition(":")
    fn = getattr(importlib.import_module(module), name)
    if not callable(fn):
        raise TypeError(f"{ref}: not a function")
    return fn  # type: ignore[no-any-return]


def commands() -> dict[str, CollectorEntry]:
    """The command-line commands the entries bring (those with flags and a runner), by name."""
    return {e.command: e for e in COLLECTORS.values() if e.arguments and e.run}


def validate_sections(doc: dict[str, Any], where: str = "config") -> None:
    """Each collector's section of a config document, validated now (``ConfigError`` naming
    the key): a typo in ``gnmi:`` stops every command at start, not the collector later."""
    for entry in COLLECTORS.values():
        if entry.load and entry.section in doc:
            resolve(entry.load)(doc[entry.section])
