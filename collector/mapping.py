"""The vendor-path mapping table: data in collector/mappings/*.yaml, looked up with a memo.

Every distinct path is resolved once (exact match, then the regexes in file order) and
remembered, so decoding a stream costs one dict lookup per value.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import yaml

from rocewatch.core.errors import ConfigError

MAPPINGS_DIR = Path(__file__).parent / "mappings"
_PREFIX = re.compile(r"(?<=/)[A-Za-z0-9_.-]+:")  # "openconfig-interfaces:" module prefixes


@dataclass(frozen=True)
class Target:
    """Where one vendor value lands: canonical metric, optional port/qual from the path."""

    metric: str
    scale: float = 1.0
    port: str | None = None
    qual: str | None = None


def _check_metric(name: str, where: str) -> None:
    # here, not at the top: the node agent maps its counters without the telemetry model
    # (Polars); see NicMapper's check_metrics
    from rocewatch.core.model import METRICS, UNKNOWN_PREFIXES

    if name not in METRICS and not name.startswith(UNKNOWN_PREFIXES):
        raise ConfigError(f"{where}: unknown canonical metric {name!r}")


class _Table:
    def __init__(self, entries: list[dict[str, Any]], where: str, check: bool = True) -> None:
        self.exact: dict[str, Target] = {}
        self.regexes: list[tuple[re.Pattern[str], Target]] = []
        for i, e in enumerate(entries):
            metric = str(e.get("metric", ""))
            if check:
                _check_metric(metric, f"{where} entry {i}")
            t = Target(metric, float(e.get("scale", 1.0)), None, e.get("qual"))
            if "path" in e:
                self.exact.setdefault(str(e["path"]), t)
            elif "regex" in e:
                try:
                    self.regexes.append((re.compile(str(e["regex"])), t))
                except re.error as err:
                    raise ConfigError(f"{where} entry {i}: bad regex: {err}") from err
            else:
                raise ConfigError(f"{where} entry {i}: needs 'path' or 'regex'")
        self.memo: dict[str, Target | None] = {}

    def lookup(self, key: str) -> Target | None:
        try:
            return self.memo[key]
        except KeyError:
            pass
        t = self.exact.get(key)
        if t is None:
            for rx, base in self.regexes:
                m = rx.search(key)
                if m:
                    g = m.groupdict()
                    t = Target(base.metric, base.scale, g.get("port"), g.get("qual") or base.qual)
                    break
        if len(self.memo) < 100_000:  # bound the memo against a flood of distinct paths
            self.memo[key] = t
        return t


def _load(files: list[Path]) -> list[dict[str, Any]]:
    docs = []
    for f in files:
        try:
            doc = yaml.safe_load(f.read_text())
        except (OSError, yaml.YAMLError) as err:
            raise ConfigError(f"{f}: cannot read mapping table: {err}") from err
        if not isinstance(doc, dict) or not isinstance(doc.get("entries"), list):
            raise ConfigError(f"{f}: mapping table needs a list 'entries'")
        doc["_file"] = str(f)
        docs.append(doc)
    return docs


class GnmiMapper:
    """Maps gNMI paths (OpenConfig, Cumulus, SONiC) to canonical metrics."""

    def __init__(self, extra_files: list[Path] | None = None) -> None:
        docs = [d for d in _load(sorted(MAPPINGS_DIR.glob("*.yaml"))) if d.get("source") == "gnmi"]
        docs += _load(extra_files or [])
        entries: list[dict[str, Any]] = []
        self.port_tags: list[str] = []
        self.qual_tags: list[str] = []
        for d in docs:
            entries += d["entries"]
            self.port_tags += [t for t in d.get("port_tags", []) if t not in self.port_tags]
            self.qual_tags += [t for t in d.get("qual_tags", []) if t not in self.qual_tags]
        self._table = _Table(entries, "gnmi mapping")

    def lookup(self, path: str) -> Target | None:
        t = self._table.memo.get(path)
        if t is not None or path in self._table.memo:
            return t
        norm = _PREFIX.sub("", path if path.startswith("/") else "/" + path)
        t = self._table.lookup(norm)
        self._table.memo[path] = t
        return t


# counters a NIC mapping table does not list are kept under these names; other sections' are not
UNMAPPED_PREFIX = {"ethtool": "ethtool:", "hw_counters": "hw:", "port_counters": "port:"}


class NicMapper:
    """Maps node-agent counters (ethtool, hw_counters, port_counters, pcie, mlxlink) to canonical
    metrics.

    ``check_metrics=False`` skips checking that each target is a known canonical metric (which
    needs the telemetry model, and Polars): the node agent's own tables are checked by the
    services that decode what it sends, and by the tests."""

    def __init__(self, extra_files: list[Path] | None = None, check_metrics: bool = True) -> None:
        docs = [d for d in _load(sorted(MAPPINGS_DIR.glob("*.yaml"))) if d.get("source") == "nic"]
        docs += _load(extra_files or [])
        by_section: dict[str, list[dict[str, Any]]] = {}
        for d in docs:
            for e in d["entries"]:
                by_section.setdefault(str(e.get("section", "ethtool")), []).append(e)
        self._tables = {
            s: _Table(es, f"nic mapping [{s}]", check_metrics) for s, es in by_section.items()
        }

    def lookup(self, section: str, name: str) -> Target | None:
        table = self._tables.get(section)
        t = table.lookup(name) if table else None
        if t is None and section in UNMAPPED_PREFIX:
            t = Target(UNMAPPED_PREFIX[section] + name)
            if table is not None:
                table.memo[name] = t
        return t


@cache
def default_gnmi_mapper() -> GnmiMapper:
    return GnmiMapper()


@cache
def default_nic_mapper() -> NicMapper:
    return NicMapper()


# --- the reverse direction, for the simulator and tests that write vendor formats ---------------

OPENCONFIG_PATH: dict[str, str] = {}
for _e in _load([MAPPINGS_DIR / "openconfig.yaml"])[0]["entries"]:
    OPENCONFIG_PATH.setdefault(_e["metric"], _e["path"])

NIC_NAME: dict[str, str] = {
    "nic_rx_pause_frames": "rx_prio{q}_pause",
    "nic_tx_pause_frames": "tx_prio{q}_pause",
    "nic_rx_pause_us": "rx_prio{q}_pause_duration",
    "nic_tx_pause_us": "tx_prio{q}_pause_duration",
}
NIC_SECTION: dict[str, tuple[str, str]] = {}
_UNMAPPED = tuple(UNMAPPED_PREFIX.values())  # rocewatch.core.model.UNKNOWN_PREFIXES
for _e in _load([MAPPINGS_DIR / "mlx5.yaml"])[0]["entries"]:
    if "path" in _e and not str(_e["metric"]).startswith(_UNMAPPED) and "qual" not in _e:
        NIC_SECTION.setdefault(_e["metric"], (_e["section"], _e["path"]))
for _m, _n in NIC_NAME.items():
    NIC_SECTION[_m] = ("ethtool", _n)

# gNMI tags that carry the port and the qualifier, by metric scope
QOS_PORT_TAG = "interface_interface-id"
IF_PORT_TAG = "interface_name"
PRIORITY_TAG = "switch-priority_priority"
QUEUE_TAG = "queue_name"


def pcie_speed_gts(text: str | float | int) -> float:
    """'32.0 GT/s PCIe' or '32 GT/s' (or a bare number) -> 32.0; unparsable -> nan."""
    if isinstance(text, (int, float)):
        return float(text)
    try:
        return float(str(text).split()[0])
    except (ValueError, IndexError):
        return float("nan")
