"""The fabric's topology file (docs/formats.md section 1): switches, cables, nodes and jobs.

>>> t = Topology.from_dict({"switches": [{"name": "leaf-0", "role": "leaf"}],
...     "nodes": [{"name": "gpu-001", "nics": [{"nic": "mlx5_0",
...                "switch_port": "leaf-0/Ethernet1/1"}]}]})
>>> t.peer_of_port("leaf-0", "Ethernet1/1")
NicEnd(node='gpu-001', nic='mlx5_0')
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from rocewatch.core.errors import ConfigError

ROLES = ("leaf", "spine", "core")
SCHEDULERS = ("slurm", "kubernetes")


@dataclass(frozen=True)
class PortEnd:
    switch: str
    port: str

    def __str__(self) -> str:
        return f"{self.switch}/{self.port}"


@dataclass(frozen=True)
class NicEnd:
    node: str
    nic: str

    def __str__(self) -> str:
        return f"{self.node}/{self.nic}"


End = PortEnd | NicEnd


@dataclass(frozen=True)
class Switch:
    name: str
    role: str
    rail: int | None = None
    address: str | None = None
    int_node_id: int | None = None
    int_ports: dict[int, str] = field(default_factory=dict)
    int_cell_bytes: int = 1
    buffer_bytes: int | None = None
    domain: str | None = None  # the fabric domain (pod, scalable unit) it belongs to


@dataclass(frozen=True)
class Nic:
    node: str
    nic: str
    netdev: str | None
    speed_gbps: float | None
    rail: int | None
    switch_port: PortEnd | None


@dataclass(frozen=True)
class Node:
    name: str
    scheduler: str
    nics: tuple[Nic, ...]
    domain: str | None = None


@dataclass(frozen=True)
class Job:
    name: str
    tenant: str | None
    priority: int | None
    nodes: tuple[str, ...]


def split_ref(ref: str) -> tuple[str, str]:
    """'leaf-1/Ethernet1/1' -> ('leaf-1', 'Ethernet1/1'): device names never hold a slash."""
    dev, sep, port = ref.partition("/")
    if not sep or not dev or not port:
        raise ValueError(ref)
    return dev, port


class Topology:
    """A validated topology with the lookups detectors need (cable peers, rails, jobs)."""

    def __init__(
        self,
        fabric: str,
        switches: list[Switch],
        links: list[tuple[PortEnd, PortEnd]],
        nodes: list[Node],
        jobs: list[Job],
        extra: dict[str, Any] | None = None,
    ) -> None:
        self.fabric = fabric
        self.switches = {s.name: s for s in switches}
        self.links = links
        self.nodes = {n.name: n for n in nodes}
        self.jobs = {j.name: j for j in jobs}
        self.extra = extra or {}
        self._peer: dict[End, End] = {}
        for a, b in links:
            self._peer[a] = b
            self._peer[b] = a
        self.nics: dict[tuple[str, str], Nic] = {}
        for n in nodes:
            for nic in n.nics:
                self.nics[(n.name, nic.nic)] = nic
                if nic.switch_port is not None:
                    end = NicEnd(n.name, nic.nic)
                    self._peer[nic.switch_port] = end
                    self._peer[end] = nic.switch_port
        self.by_address = {s.address: s.name for s in switches if s.address}
        self.by_int_node_id = {s.int_node_id: s.name for s in switches if s.int_node_id is not None}
        self.domains, self.domain = _domains(switches, nodes)
        self.node_jobs: dict[str, list[str]] = {}
        self.jobs_version = 0  # bumped by set_jobs, so detectors know to regroup peers
        for j in jobs:
            for nn in j.nodes:
                self.node_jobs.setdefault(nn, []).append(j.name)

    # --- lookups -------------------------------------------------------------------------------
    def peer(self, end: End) -> End | None:
        return self._peer.get(end)

    def peer_of_port(self, switch: str, port: str) -> End | None:
        return self._peer.get(PortEnd(switch, port))

    def resolve_device(self, source: str) -> str | None:
        """A gnmic `source` tag ('name:port' or 'address:port') -> switch name, or None."""
        host = source
        if host.count(":") == 1:
            host = host.rsplit(":", 1)[0]
        elif host.startswith("[") and "]" in host:
            host = host[1 : host.index("]")]
        if host in self.switches:
            return host
        return self.by_address.get(host)

    def domain_of(self, device: str) -> str:
        """The fabric domain of a switch or node ('' for a device of none). A device the
        topology does not know is in the domain '' if there is one, else in the first."""
        # (a topology pickled in a checkpoint before domains existed has no map: all in '')
        found = getattr(self, "domain", {}).get(device)
        if found is not None:
            return str(found)
        domains = getattr(self, "domains", [""])
        return "" if "" in domains else domains[0]

    def cross_domain_ends(self) -> dict[tuple[str, str], set[str]]:
        """(device, port) of every cable end whose other end is in another domain -> the
        domains of its other ends. A NIC end is listed under its RDMA device and its netdev
        (NIC telemetry names either)."""
        out: dict[tuple[str, str], set[str]] = {}
        for a, b in self.links:
            da, db = self.domain_of(a.switch), self.domain_of(b.switch)
            if da != db:
                out.setdefault((a.switch, a.port), set()).add(db)
                out.setdefault((b.switch, b.port), set()).add(da)
        for (node, _), nic in self.nics.items():
            sp = nic.switch_port
            if sp is None:
                continue
            dn, ds = self.domain_of(node), self.domain_of(sp.switch)
            if dn != ds:
                for port in {nic.nic, nic.netdev} - {None}:
                    out.setdefault((node, str(port)), set()).add(ds)
                out.setdefault((sp.switch, sp.port), set()).add(dn)
        return out

    def nic_rail(self, node: str, nic: str) -> int | None:
        n = self.nics.get((node, nic))
        if n is None:
            return None
        if n.rail is not None:
            return n.rail
        if n.switch_port is not None:
            sw = self.switches.get(n.switch_port.switch)
            return sw.rail if sw else None
        return None

    def nic_speed_mbps(self, node: str, nic: str) -> float | None:
        n = self.nics.get((node, nic))
        return n.speed_gbps * 1000 if n and n.speed_gbps else None

    def scheduler_of(self, node: str) -> str:
        n = self.nodes.get(node)
        return n.scheduler if n else "slurm"

    def set_jobs(self, jobs: list[Job]) -> None:
        """Replace job membership (live from the schedulers); nodes outside the topology drop."""
        known = [
            Job(j.name, j.tenant, j.priority, tuple(n for n in j.nodes if n in self.nodes))
            for j in jobs
        ]
        self.jobs = {j.name: j for j in known if j.nodes}
        self.jobs_version = getattr(self, "jobs_version", 0) + 1
        self.node_jobs = {}
        for j in self.jobs.values():
            for nn in j.nodes:
                self.node_jobs.setdefault(nn, []).append(j.name)

    # --- loading -------------------------------------------------------------------------------
    @classmethod
    def load(cls, path: str | Path) -> Topology:
        try:
            doc = yaml.safe_load(Path(path).read_text())
        except OSError as e:
            raise ConfigError(f"{path}: cannot read topology: {e.strerror}") from e
        except UnicodeDecodeError as e:  # a binary file given by mistake
            raise ConfigError(f"{path}: not UTF-8 text (byte {e.start})") from e
        except yaml.YAMLError as e:
            raise ConfigError(f"{path}: not valid YAML: {e}") from e
        try:
            return cls.from_dict(doc)
        except ConfigError as e:
            raise ConfigError(f"{path}: invalid topology:\n{e}") from e

    @classmethod
    def from_dict(cls, doc: Any) -> Topology:
        problems: list[str] = []
        if not isinstance(doc, dict):
            raise ConfigError("topology must be a mapping with 'switches' and 'nodes'")
        switches: list[Switch] = []
        names: set[str] = set()
        for i, s in enumerate(_list(doc, "switches", problems)):
            where = f"switches[{i}]"
            if not isinstance(s, dict) or not s.get("name"):
                problems.append(f"{where}: needs a name")
                continue
            name = str(s["name"])
            if "/" in name:
                problems.append(f"{where}: switch name {name!r} must not contain '/'")
            if name in names:
                problems.append(f"{where}: duplicate switch name {name!r}")
            names.add(name)
            role = str(s.get("role", "leaf"))
            if role not in ROLES:
                problems.append(f"{where} ({name}): role {role!r} is not one of {', '.join(ROLES)}")
            try:
                int_ports = {int(k): str(v) for k, v in (s.get("int_ports") or {}).items()}
                sw = Switch(
                    name=name,
                    role=role,
                    rail=_opt_int(s.get("rail")),
                    address=str(s["address"]) if s.get("address") is not None else None,
                    int_node_id=_opt_int(s.get("int_node_id")),
                    int_ports=int_ports,
                    int_cell_bytes=int(s.get("int_cell_bytes", 1)),
                    buffer_bytes=_opt_int(s.get("buffer_bytes")),
                    domain=_opt_str(s.get("domain")),
                )
            except (TypeError, ValueError, AttributeError, OverflowError) as e:
                problems.append(f"{where} ({name}): bad value: {e}")
                continue
            switches.append(sw)

        used: dict[PortEnd, str] = {}

        def port_ref(ref: Any, where: str) -> PortEnd | None:
            try:
                dev, port = split_ref(str(ref))
            except ValueError:
                problems.append(f"{where}: {ref!r} is not a 'device/port' reference")
                return None
            if dev not in names:
                problems.append(f"{where}: {ref!r} references undefined switch {dev!r}")
                return None
            end = PortEnd(dev, port)
            if end in used:
                problems.append(f"{where}: port {end} is already used by {used[end]}")
                return None
            used[end] = where
            return end

        links: list[tuple[PortEnd, PortEnd]] = []
        for i, lk in enumerate(_list(doc, "links", problems)):
            where = f"links[{i}]"
            if not isinstance(lk, dict) or "a" not in lk or "b" not in lk:
                problems.append(f"{where}: needs 'a' and 'b'")
                continue
            a = port_ref(lk["a"], where)
            b = port_ref(lk["b"], where)
            if a and b:
                links.append((a, b))

        nodes: list[Node] = []
        node_names: set[str] = set()
        for i, n in enumerate(_list(doc, "nodes", problems)):
            where = f"nodes[{i}]"
            if not isinstance(n, dict) or not n.get("name"):
                problems.append(f"{where}: needs a name")
                continue
            name = str(n["name"])
            where = f"{where} ({name})"
            if name in node_names:
                problems.append(f"{where}: duplicate node name")
            node_names.add(name)
            sched = str(n.get("scheduler", "slurm"))
            if sched not in SCHEDULERS:
                problems.append(f"{where}: scheduler {sched!r} is not slurm or kubernetes")
            raw_nics = n.get("nics") or []
            if not isinstance(raw_nics, list) or not raw_nics:
                problems.append(f"{where}: has no NICs")
                continue
            nics: list[Nic] = []
            seen: set[str] = set()
            for j, c in enumerate(raw_nics):
                w = f"{where}.nics[{j}]"
                if not isinstance(c, dict) or not c.get("nic"):
                    problems.append(f"{w}: needs 'nic'")
                    continue
                nic = str(c["nic"])
                if nic in seen:
                    problems.append(f"{w}: duplicate NIC {nic!r}")
                seen.add(nic)
                sp = (
                    port_ref(c["switch_port"], f"{w} ({name}/{nic})")
                    if c.get("switch_port")
                    else None
                )
                try:
                    speed = float(c["speed_gbps"]) if c.get("speed_gbps") is not None else None
                    nics.append(Nic(name, nic, c.get("netdev"), speed, _opt_int(c.get("rail")), sp))
                except (TypeError, ValueError, OverflowError) as e:
                    problems.append(f"{w}: bad value: {e}")
            nodes.append(Node(name, sched, tuple(nics), _opt_str(n.get("domain"))))

        jobs: list[Job] = []
        for i, j in enumerate(_list(doc, "jobs", problems)):
            where = f"jobs[{i}]"
            if not isinstance(j, dict) or not j.get("name"):
                problems.append(f"{where}: needs a name")
                continue
            raw_members = j.get("nodes") or []
            if not isinstance(raw_members, list):
                problems.append(f"{where} ({j['name']}): nodes must be a list")
                continue
            members = [str(x) for x in raw_members]
            for m in members:
                if m not in node_names:
                    problems.append(f"{where} ({j['name']}): references undefined node {m!r}")
            try:
                jobs.append(
                    Job(
                        str(j["name"]), j.get("tenant"), _opt_int(j.get("priority")), tuple(members)
                    )
                )
            except (TypeError, ValueError, OverflowError) as e:
                problems.append(f"{where}: bad value: {e}")
        if problems:
            raise ConfigError("\n".join(problems))
        known = {"fabric", "switches", "links", "nodes", "jobs"}
        return cls(
            str(doc.get("fabric", "")),
            switches,
            links,
            nodes,
            jobs,
            {k: v for k, v in doc.items() if k not in known},
        )

    def to_dict(self) -> dict[str, Any]:
        """The topology in the file's own shape (what ``load`` reads back)."""
        sw = []
        for s in self.switches.values():
            d: dict[str, Any] = {"name": s.name, "role": s.role}
            for k in ("rail", "address", "int_node_id", "buffer_bytes", "domain"):
                if getattr(s, k) is not None:
                    d[k] = getattr(s, k)
            if s.int_ports:
                d["int_ports"] = dict(s.int_ports)
            if s.int_cell_bytes != 1:
                d["int_cell_bytes"] = s.int_cell_bytes
            sw.append(d)
        nodes = []
        for n in self.nodes.values():
            nics = []
            for c in n.nics:
                cd: dict[str, Any] = {"nic": c.nic}
                if c.netdev:
                    cd["netdev"] = c.netdev
                if c.speed_gbps:
                    cd["speed_gbps"] = c.speed_gbps
                if c.rail is not None:
                    cd["rail"] = c.rail
                if c.switch_port:
                    cd["switch_port"] = str(c.switch_port)
                nics.append(cd)
            nd: dict[str, Any] = {"name": n.name, "scheduler": n.scheduler, "nics": nics}
            if getattr(n, "domain", None) is not None:
                nd["domain"] = n.domain
            nodes.append(nd)
        out: dict[str, Any] = {"fabric": self.fabric, "switches": sw}
        if self.links:
            out["links"] = [{"a": str(a), "b": str(b)} for a, b in self.links]
        out["nodes"] = nodes
        if self.jobs:
            out["jobs"] = [
                {
                    k: v
                    for k, v in (
                        ("name", j.name),
                        ("tenant", j.tenant),
                        ("priority", j.priority),
                        ("nodes", list(j.nodes)),
                    )
                    if v is not None
                }
                for j in self.jobs.values()
            ]
        return out


def _list(doc: dict[str, Any], key: str, problems: list[str]) -> list[Any]:
    v = doc.get(key)
    if v is None:
        return []
    if not isinstance(v, list):
        problems.append(f"{key}: must be a list")
        return []
    return v


def _opt_int(v: Any) -> int | None:
    return None if v is None else int(v)


def _opt_str(v: Any) -> str | None:
    return None if v is None or v == "" else str(v)


def _domains(switches: list[Switch], nodes: list[Node]) -> tuple[list[str], dict[str, str]]:
    """(the fabric's domains in sorted order, device -> its domain).

    A switch's domain is its ``domain`` key; a node's is its own, else that of the switch its
    first cabled NIC plugs into. A device with none is in the domain ''. A fabric where no
    device names a domain is one domain, ''. Domains let the scale-out detect stage run on
    more than one core: each domain's steps are evaluated on their own.
    """
    of: dict[str, str] = {}
    for sw in switches:
        of[sw.name] = sw.domain or ""
    for n in nodes:
        d = n.domain
        if d is None:
            cabled = [c.switch_port.switch for c in n.nics if c.switch_port is not None]
            d = of.get(cabled[0], "") if cabled else ""
        of[n.name] = d
    return sorted(set(of.values()) or {""}), of
