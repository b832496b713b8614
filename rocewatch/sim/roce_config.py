"""The simulated fabric's RoCE configuration, written as ``nic_config.jsonl`` and
``switch_config.jsonl`` (docs/formats/roce_config.md), correct by default, with configuration
faults and their ground truth (``config_truth.json``).

NICs: one snapshot each, ``dcb`` objects as iproute2's ``dcb -j`` prints them, mlx5's ``ecn``
sysfs, the GID table (link-local and IPv4-mapped GIDs, RoCE v1 and v2 each). Switches: SONiC
CONFIG_DB tables as SONiC's gNMI server serves them, in gnmic's event format (target
``CONFIG_DB``, one event per table entry); fabrics named ``openconfig`` or ``cumulus`` serve the
port MTU through OpenConfig (``/interfaces/interface/config/mtu``) instead of the PORT table.

Faults (``ConfigFault.kind``), each expected to make exactly one check fire:

| kind | what | check |
|---|---|---|
| ``nic_pcp_trust`` | a NIC trusts PCP (``dcb apptrust`` order pcp) | trust |
| ``pfc_wrong_priority`` | a leaf has PFC on priority 4 on every port | pfc |
| ``uplink_mtu`` | a leaf's end of one uplink has MTU 1500 | mtu |
| ``spine_no_ecn`` | a spine's RoCE queues have no WRED/ECN profile | ecn |
| ``no_roce_v2_gid`` | a NIC's netdev has no address: link-local GIDs only | gid |
"""

from __future__ import annotations

import random
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import orjson

from rocewatch.core.errors import ConfigError
from rocewatch.sim.fabric import GNMI_PORT, LEAF_UP, Fabric

if TYPE_CHECKING:
    from rocewatch.sim.simulator import SimConfig

NIC_CONFIG = "nic_config.jsonl"
SWITCH_CONFIG = "switch_config.jsonl"
CONFIG_TRUTH = "config_truth.json"
SUBSCRIPTION = "roce-config"

ROCE_DSCP, CNP_DSCP, CNP_PRIO = 26, 48, 6
NIC_MTU, SWITCH_MTU = 9000, 9216
WRONG_PRIORITY = 4
BAD_MTU = 1500

CONFIG_FAULTS = {
    "nic_pcp_trust": "trust",
    "pfc_wrong_priority": "pfc",
    "uplink_mtu": "mtu",
    "spine_no_ecn": "ecn",
    "no_roce_v2_gid": "gid",
}


@dataclass(frozen=True)
class ConfigFault:
    """A configuration fault; ``target`` ("node/nic", a leaf, "leaf/port" of an uplink, a
    spine) is picked from the seed when not given."""

    kind: str
    target: str | None = None


def parse_fault(spec: str) -> ConfigFault:
    """'nic_pcp_trust' or 'nic_pcp_trust=gpu-003/mlx5_1'."""
    kind, _, target = spec.partition("=")
    if kind not in CONFIG_FAULTS:
        raise ConfigError(
            f"unknown configuration fault {kind!r}: one of {', '.join(CONFIG_FAULTS)}"
        )
    return ConfigFault(kind, target or None)


def _resolve(fab: Fabric, faults: Iterable[ConfigFault], seed: int) -> list[ConfigFault]:
    rng = random.Random(seed)
    nics = [
        f"{fab.nodes[int(fab.nic_node[e])]}/{fab.rail_nics[int(fab.nic_rail[e])]}"
        for e in range(fab.n_nics)
    ]
    uplinks = [
        f"{fab.switches[int(fab.port_switch[p])]}/{fab.port_name[p]}"
        for p in np.flatnonzero(fab.port_role == LEAF_UP)
    ]
    pick = {
        "nic_pcp_trust": nics,
        "no_roce_v2_gid": nics,
        "pfc_wrong_priority": fab.leaves,
        "uplink_mtu": uplinks,
        "spine_no_ecn": fab.spines,
    }
    out = []
    for f in faults:
        choices = pick[f.kind]
        if f.target is not None and f.target not in choices:
            raise ConfigError(f"{f.kind}: {f.target!r} is not in the simulated fabric")
        if not choices:
            raise ConfigError(f"{f.kind}: the simulated fabric has nothing to fault")
        out.append(ConfigFault(f.kind, f.target or rng.choice(choices)))
    return out


def _ipv4_gid(i: int, rail: int) -> str:
    a, b = 10, rail
    c, d = (i + 1) // 256, (i + 1) % 256
    return f"0000:0000:0000:0000:0000:ffff:{a:02x}{b:02x}:{c:02x}{d:02x}"


def _link_local_gid(i: int, rail: int) -> str:
    return f"fe80:0000:0000:0000:0e42:a1ff:fe{rail:02x}:{i // 256:02x}{i % 256:02x}"


def nic_snapshot(
    node: str, nic: str, netdev: str, index: int, rail: int, ts: int, faults: set[str], prio: int
) -> dict[str, Any]:
    """One NIC's snapshot; ``faults`` holds the fault kinds that hit this NIC."""
    pfc = [p == prio for p in range(8)]
    tsa = ["ets" if t in (0, prio) else "strict" for t in range(8)]
    bw = [50 if t in (0, prio) else 0 for t in range(8)]
    ll, v4 = _link_local_gid(index, rail), _ipv4_gid(index, rail)
    gids = [
        {"port": 1, "index": 0, "gid": ll, "type": "IB/RoCE v1", "ndev": netdev},
        {"port": 1, "index": 1, "gid": ll, "type": "RoCE v2", "ndev": netdev},
    ]
    if "no_roce_v2_gid" not in faults:
        gids += [
            {"port": 1, "index": 2, "gid": v4, "type": "IB/RoCE v1", "ndev": netdev},
            {"port": 1, "index": 3, "gid": v4, "type": "RoCE v2", "ndev": netdev},
        ]
    trust = "pcp" if "nic_pcp_trust" in faults else "dscp"
    enable = {str(p): int(p == prio) for p in range(8)}
    return {
        "timestamp": ts,
        "node": node,
        "nic": nic,
        "netdev": netdev,
        "mtu": NIC_MTU,
        "dcb": {
            "app": {"dscp_prio": [[ROCE_DSCP, prio], [CNP_DSCP, CNP_PRIO]]},
            "apptrust": {"order": [trust]},
            "pfc": {"pfc_cap": 8, "macsec_bypass": False, "delay": 0, "prio_pfc": pfc},
            "ets": {
                "willing": False,
                "ets_cap": 8,
                "cbs": False,
                "tc_bw": bw,
                "pg_bw": [0] * 8,
                "tc_tsa": tsa,
                "prio_tc": list(range(8)),
                "reco_tc_bw": [0] * 8,
                "reco_tc_tsa": ["strict"] * 8,
                "reco_prio_tc": [0] * 8,
            },
            "buffer": {
                "prio_buffer": [int(p == prio) for p in range(8)],
                "buffer_size": [262016, 262016, 0, 0, 0, 0, 0, 0],
                "total_size": 1048320,
            },
        },
        "pause": {"autonegotiate": False, "rx": False, "tx": False},
        "ecn": {
            "roce_np": {"enable": enable, "cnp_dscp": CNP_DSCP, "cnp_802p_prio": CNP_PRIO},
            "roce_rp": {"enable": dict(enable)},
        },
        "gids": gids,
        "roce_tos": ROCE_DSCP << 2,
        "pcie_acs": None,
    }


def _event(switch: str, ts: int, path: str, fields: dict[str, Any]) -> dict[str, Any]:
    return {
        "name": SUBSCRIPTION,
        "timestamp": ts,
        "tags": {
            "source": f"{switch}:{GNMI_PORT}",
            "subscription-name": SUBSCRIPTION,
            "target": "CONFIG_DB",
        },
        "values": {f"{path}/{k}": v for k, v in fields.items()},
    }


ConfigDb = dict[str, dict[str, dict[str, Any]]]  # table -> key -> field -> value


def config_db(fab: Fabric, faults: list[ConfigFault], prio: int) -> dict[str, ConfigDb]:
    """Every switch's CONFIG_DB RoCE tables, faults applied: what SONiC's gNMI server serves for
    target ``CONFIG_DB`` (values strings, as CONFIG_DB holds them)."""
    wrong_pfc = {f.target for f in faults if f.kind == "pfc_wrong_priority"}
    no_ecn = {f.target for f in faults if f.kind == "spine_no_ecn"}
    bad_mtu = {f.target for f in faults if f.kind == "uplink_mtu"}
    dscp = {str(d): str(d // 8) for d in range(64)}
    dscp |= {str(ROCE_DSCP): str(prio), str(CNP_DSCP): str(CNP_PRIO)}
    out: dict[str, ConfigDb] = {}
    for si, sw in enumerate(fab.switches):
        db: ConfigDb = {
            "DSCP_TO_TC_MAP": {"ROCE": dscp},
            "TC_TO_PRIORITY_GROUP_MAP": {
                "ROCE": {str(t): "0" for t in range(8)} | {str(prio): str(prio)}
            },
            "TC_TO_QUEUE_MAP": {"ROCE": {str(t): str(t) for t in range(8)}},
            "WRED_PROFILE": {
                "ROCE_LOSSLESS": {
                    "ecn": "ecn_all",
                    "wred_green_enable": "true",
                    "green_min_threshold": "153600",
                    "green_max_threshold": "1536000",
                    "green_drop_probability": "5",
                }
            },
            "SCHEDULER": {
                "scheduler.0": {"type": "DWRR", "weight": "50"},
                "scheduler.strict": {"type": "STRICT"},
            },
            "PFC_WD": {"GLOBAL": {"POLL_INTERVAL": "200"}},
            "PORT": {},
            "PORT_QOS_MAP": {},
            "QUEUE": {},
        }
        # every port of the fabric carries RoCE: the same QoS on all of them
        for p in np.flatnonzero(fab.port_switch == si):
            port = fab.port_name[p]
            mtu = BAD_MTU if f"{sw}/{port}" in bad_mtu else SWITCH_MTU
            db["PORT"][port] = {
                "admin_status": "up",
                "mtu": str(mtu),
                "speed": str(fab.link_gbps * 1000),
            }
            pfc = str(WRONG_PRIORITY if sw in wrong_pfc else prio)
            db["PORT_QOS_MAP"][port] = {
                "dscp_to_tc_map": "ROCE",
                "tc_to_pg_map": "ROCE",
                "tc_to_queue_map": "ROCE",
                "pfc_to_queue_map": "ROCE",
                "pfc_enable": pfc,
                "pfcwd_sw_enable": pfc,
            }
            q: dict[str, Any] = {"scheduler": "scheduler.0"}
            if sw not in no_ecn:
                q["wred_profile"] = "ROCE_LOSSLESS"
            db["QUEUE"][f"{port}|{prio}"] = q
            db["QUEUE"][f"{port}|{CNP_PRIO}"] = {"scheduler": "scheduler.strict"}
            db["QUEUE"][f"{port}|0"] = {"scheduler": "scheduler.0"}
            db["PFC_WD"][port] = {
                "action": "drop",
                "detection_time": "200",
                "restoration_time": "200",
            }
        out[sw] = db
    return out


def switch_events(fab: Fabric, ts: int, faults: list[ConfigFault], prio: int) -> list[Any]:
    """gnmic events of every switch's configuration: a CONFIG_DB entry per event; fabrics not
    named ``sonic`` serve the port MTU as OpenConfig leaves instead of the PORT table."""
    out: list[Any] = []
    for sw, db in config_db(fab, faults, prio).items():
        for table, entries in db.items():
            if table == "PORT" and fab.naming != "sonic":
                for port, fields in entries.items():
                    out.append(
                        {
                            "name": SUBSCRIPTION,
                            "timestamp": ts,
                            "tags": {
                                "source": f"{sw}:{GNMI_PORT}",
                                "subscription-name": SUBSCRIPTION,
                                "interface_name": port,
                            },
                            "values": {"/interfaces/interface/config/mtu": int(fields["mtu"])},
                        }
                    )
                continue
            for key, fields in entries.items():
                out.append(_event(sw, ts, f"/{table}/{key}", fields))
    return out


def config_records(
    cfg: SimConfig, fab: Fabric, faults: Iterable[ConfigFault] = (), ts: int | None = None
) -> tuple[list[dict[str, Any]], list[Any], list[ConfigFault]]:
    """The NIC snapshots and switch events of the fabric's configuration at ``ts`` (the run's
    start by default), faults applied, and the faults with their targets resolved: what
    ``write_roce_config`` writes, for a caller that feeds a pipeline in process (the demo)."""
    resolved = _resolve(fab, faults, int(getattr(cfg, "seed", 0)))
    ts = int(cfg.start_ns) if ts is None else ts
    prio = fab.priority
    by_nic: dict[str, set[str]] = {}
    for f in resolved:
        if f.kind in ("nic_pcp_trust", "no_roce_v2_gid") and f.target:
            by_nic.setdefault(f.target, set()).add(f.kind)
    nics = []
    for e in range(fab.n_nics):
        i, r = int(fab.nic_node[e]), int(fab.nic_rail[e])
        node, nic = fab.nodes[i], fab.rail_nics[r]
        nics.append(
            nic_snapshot(
                node,
                nic,
                fab.rail_netdevs[r],
                i,
                r,
                ts,
                by_nic.get(f"{node}/{nic}", set()),
                prio,
            )
        )
    return nics, switch_events(fab, ts, resolved, prio), resolved


def port_pfc_change(switch: str, port: str, ts: int, pfc: int) -> dict[str, Any]:
    """The CONFIG_DB update of one switch port's ``PORT_QOS_MAP`` moving PFC to priority
    ``pfc``, as gnmic writes a Subscribe's update (the demo's configuration change)."""
    return _event(
        switch,
        ts,
        f"/PORT_QOS_MAP/{port}",
        {"pfc_enable": str(pfc), "pfcwd_sw_enable": str(pfc)},
    )


def write_roce_config(
    out_dir: str | Path,
    cfg: SimConfig,
    faults: Iterable[ConfigFault] = (),
    fabric: Fabric | None = None,
) -> list[ConfigFault]:
    """Write ``nic_config.jsonl``, ``switch_config.jsonl`` and ``config_truth.json`` for the
    fabric ``cfg`` describes; returns the faults with their targets resolved."""
    out = Path(out_dir)
    fab = fabric if fabric is not None else Fabric(cfg)
    nics, events, resolved = config_records(cfg, fab, faults)
    with (out / NIC_CONFIG).open("wb") as fh:
        for snap in nics:
            fh.write(orjson.dumps(snap) + b"\n")
    with (out / SWITCH_CONFIG).open("wb") as fh:
        for ev in events:
            fh.write(orjson.dumps(ev) + b"\n")
    truth = {
        "generator": "rocewatch.sim.roce_config",
        "config_faults": [asdict(f) | {"check": CONFIG_FAULTS[f.kind]} for f in resolved],
    }
    (out / CONFIG_TRUTH).write_bytes(orjson.dumps(truth, option=orjson.OPT_INDENT_2))
    return resolved


__all__ = [
    "CONFIG_FAULTS",
    "ConfigFault",
    "config_records",
    "parse_fault",
    "port_pfc_change",
    "write_roce_config",
]
