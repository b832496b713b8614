"""The normalised RoCE configuration of one end of a cable: a NIC or a switch port.

Every parser (``collector/roce_config``: iproute2 ``dcb -j`` and sysfs on the NIC, gnmic events of
OpenConfig QoS paths and SONiC CONFIG_DB tables, Cumulus NVUE JSON) fills the same
:class:`RoceEnd`, so the checks (``rocewatch/roce/checks.py``) compare a NIC with the switch port
it is cabled to without knowing where either value came from.

``None`` everywhere means *unknown* (the tool, file or path was missing); the checks never call an
unknown value wrong.

Terms, as NetQ's ``netq show roce-config`` uses them:

- *switch priority* (SP, 0-7): the internal class a packet is given at ingress, from its DSCP
  (``dscp_to_prio``) or its 802.1p PCP; on a NIC the same number is the 802.1p priority.
- *priority group* (PG): the ingress buffer a priority uses (``prio_to_pg``; SONiC
  ``tc_to_pg_map``; on a NIC ``dcb buffer`` ``prio_buffer``).
- *traffic class* (TC): the egress queue a priority is scheduled in (``prio_to_tc``; SONiC
  ``tc_to_queue_map``; on a NIC ``dcb ets`` ``prio_tc``). ECN/WRED thresholds and the scheduler
  (``tc_tsa``: ``strict`` or ``ets``) are per TC.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

NIC = "nic"
SWITCH = "switch"


@dataclass
class Wred:
    """ECN/WRED on one egress queue: thresholds in bytes, whether it marks (ECN) or drops."""

    min_bytes: int | None = None
    max_bytes: int | None = None
    ecn: bool | None = None
    profile: str | None = None


@dataclass
class PfcWatchdog:
    """A port's PFC watchdog (SONiC ``PFC_WD``): what it does to a stormed queue, and when."""

    action: str | None = None  # drop | forward | alert
    detection_ms: int | None = None
    restoration_ms: int | None = None


@dataclass
class Gid:
    """One populated entry of ``/sys/class/infiniband/<nic>/ports/<p>/gids/``."""

    port: int
    index: int
    gid: str
    type: str | None  # "RoCE v2", "IB/RoCE v1"
    ndev: str | None


@dataclass
class RoceEnd:
    """RoCE configuration of a NIC (``kind`` nic: ``device`` node, ``port`` RDMA device) or of a
    switch port (``kind`` switch: ``device`` switch, ``port`` interface)."""

    kind: str
    device: str
    port: str
    source: str = ""  # what it was read from: "dcb+sysfs", "CONFIG_DB", "openconfig", "nvue"
    timestamp: int | None = None
    mode: str | None = None  # explicit RoCE mode when the device states one (NVUE: lossless)
    trust: str | None = None  # dscp | pcp | both | port
    dscp_to_prio: dict[int, int] | None = None
    prio_to_pg: dict[int, int] | None = None
    prio_to_tc: dict[int, int] | None = None
    pfc: frozenset[int] | None = None  # priorities with PFC enabled
    tc_tsa: dict[int, str] | None = None  # strict | ets
    tc_bw: dict[int, int] | None = None  # ETS share (NIC percent; switch DWRR weight)
    wred: dict[int, Wred] | None = None  # by TC (egress queue)
    mtu: int | None = None
    pause_rx: bool | None = None  # global (802.3x) pause
    pause_tx: bool | None = None
    # NIC only
    netdev: str | None = None
    ecn_np: dict[int, bool] | None = None  # /sys/class/net/<if>/ecn/roce_np/enable/<p>
    ecn_rp: dict[int, bool] | None = None
    cnp_dscp: int | None = None
    cnp_prio: int | None = None
    gids: list[Gid] | None = None
    roce_tos: int | None = None
    # PCIe switch downstream ports above the NIC that redirect peer-to-peer traffic (ACS
    # ReqRedir/CmpltRedir on): GPUDirect RDMA detours through the root complex
    acs_redirect: list[str] | None = None
    # switch only
    pfc_watchdog: PfcWatchdog | None = None

    @property
    def name(self) -> str:
        return f"{self.device}/{self.port}"

    def merge(self, other: RoceEnd) -> None:
        """Fill what this end does not know from ``other`` (another source for the same end)."""
        for f in fields(self):
            if f.name in ("kind", "device", "port"):
                continue
            if getattr(self, f.name) in (None, "") and getattr(other, f.name) not in (None, ""):
                setattr(self, f.name, getattr(other, f.name))

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in fields(self):
            v = getattr(self, f.name)
            if v is None:
                continue
            out[f.name] = _plain(v)
        return out


def _plain(v: Any) -> Any:
    if isinstance(v, frozenset):
        return sorted(v)
    if isinstance(v, dict):
        return {str(k): _plain(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_plain(x) for x in v]
    if hasattr(v, "__dataclass_fields__"):
        return {f.name: _plain(getattr(v, f.name)) for f in fields(v)}
    return v


@dataclass
class RoceFabric:
    """Every end's configuration, keyed by ``(device, port)``, plus what was skipped."""

    ends: dict[tuple[str, str], RoceEnd] = field(default_factory=dict)
    # switch-wide settings (NVUE's ``nv show qos roce``): what a port of that switch inherits
    defaults: dict[str, RoceEnd] = field(default_factory=dict)
    skipped: dict[str, int] = field(default_factory=dict)

    def add(self, end: RoceEnd) -> None:
        key = (end.device, end.port)
        have = self.ends.get(key)
        if have is None:
            self.ends[key] = end
        elif (end.timestamp or 0) >= (have.timestamp or 0):
            # a newer snapshot wins; what it does not say is kept from the older one
            end.merge(have)
            self.ends[key] = end
        else:
            have.merge(end)

    def skip(self, reason: str, n: int = 1) -> None:
        self.skipped[reason] = self.skipped.get(reason, 0) + n

    def get(self, device: str, port: str) -> RoceEnd | None:
        """The end's configuration, completed from its switch's defaults; None if nothing is
        known of it."""
        end = self.ends.get((device, port))
        dflt = self.defaults.get(device)
        if dflt is None:
            return end
        out = RoceEnd(kind=dflt.kind, device=device, port=port)
        if end is not None:
            out.merge(end)
            out.source = end.source
        out.merge(dflt)
        return out


@dataclass(frozen=True)
class ConfigChange:
    """One setting of one cable end that differs between two consecutive configuration
    snapshots of its device: ``entity`` is "device/port", ``field`` a :class:`RoceEnd` field
    (``pfc``, ``trust``, ``mtu``, ...), ``old`` / ``new`` its values as short text, ``ts`` the
    telemetry time of the snapshot that showed the new value (ns)."""

    ts: int
    kind: str  # nic | switch
    device: str
    port: str
    field: str
    old: str
    new: str
    source: str = ""

    @property
    def entity(self) -> str:
        return f"{self.device}/{self.port}"

    def to_json(self) -> dict[str, Any]:
        from rocewatch.core.model import rfc3339

        return {
            "time": rfc3339(self.ts),
            "kind": self.kind,
            "entity": self.entity,
            "device": self.device,
            "port": self.port,
            "field": self.field,
            "old": self.old,
            "new": self.new,
            "source": self.source,
        }


def show_value(v: Any) -> str:
    """A normalised value as the short text a change event and an annotation show
    (``pfc`` {3} -> "3", a map -> "26:3 48:6", None -> "unknown")."""
    if v is None:
        return "unknown"
    if isinstance(v, frozenset | set):
        return ",".join(str(x) for x in sorted(v)) or "none"
    if isinstance(v, dict):
        if not v:
            return "none"
        return " ".join(
            f"{k}:{show_value(x)}" for k, x in sorted(v.items(), key=lambda kv: str(kv[0]))
        )
    if isinstance(v, list):
        return " ".join(show_value(x) for x in v) or "none"
    if hasattr(v, "__dataclass_fields__"):
        return "/".join(show_value(getattr(v, f.name)) for f in fields(v))
    if isinstance(v, bool):
        return "on" if v else "off"
    return str(v)


# fields of a RoceEnd that are bookkeeping, not configuration: never a change
NOT_CONFIG = frozenset({"kind", "device", "port", "source", "timestamp"})


def diff_ends(old: RoceEnd, new: RoceEnd, ts: int) -> list[ConfigChange]:
    """The configuration fields that differ between two snapshots of one end. A value that
    became unknown is not a change (unknown is never wrong: the tool or path was missing), nor
    is one known for the first time (a snapshot that arrived in parts: its baseline)."""
    out = []
    for f in fields(new):
        if f.name in NOT_CONFIG:
            continue
        a, b = getattr(old, f.name), getattr(new, f.name)
        if a is None or b is None or a == b:
            continue
        out.append(
            ConfigChange(
                ts, new.kind, new.device, new.port, f.name, show_value(a), show_value(b), new.source
            )
        )
    return out
