"""The simulated fabric: a rail-optimised leaf/spine topology and the index arrays behind it.

NIC ``k`` of every node plugs into a leaf of rail ``k`` (one leaf per rail per pod of
``nodes_per_leaf`` nodes, 64 by default, named ``leaf-r{rail}-p{pod}``); every leaf has one
uplink to every spine (``spine-{i}``). Port names follow the config's ``naming``, as the three
switch operating systems name front-panel ports:

- ``openconfig`` (the default; EOS/NX-OS style): ``Ethernet1/<n>`` (leaf downlinks, spine
  ports) and ``Ethernet2/<n>`` (leaf uplinks), so every "device/port" reference exercises the
  slash rule of docs/formats.md section 1;
- ``cumulus``: ``swp<n>``, downlinks first, then the uplinks;
- ``sonic``: ``Ethernet<first lane>``, 8 serdes lanes per port at 400G and 800G, 4 below
  (``Ethernet0``, ``Ethernet8``, ...).

The simulator works on cable *directions*: cable ``c`` has direction ``2c`` (NIC->leaf, or
leaf->spine) and ``2c + 1`` (leaf->NIC, or spine->leaf). NIC cables come first (cable ``e`` for
NIC ``e = node * nics_per_node + nic``), then the leaf uplinks (cable ``E + leaf * spines +
spine``). A switch port transmits on its ``out`` direction and receives on its ``in`` one; the
pause a receiver sends on a direction pauses that direction's sender.

>>> from rocewatch.sim.simulator import SimConfig
>>> t = build_topology(SimConfig(nodes=2, nics_per_node=2, spines=2))
>>> sorted(t.switches)
['leaf-r0-p0', 'leaf-r1-p0', 'spine-0', 'spine-1']
>>> str(t.nodes['gpu-002'].nics[1].switch_port)
'leaf-r1-p0/Ethernet1/2'
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from rocewatch.core.topology import Topology

if TYPE_CHECKING:
    from rocewatch.sim.config import SimConfig

NODES_PER_LEAF = 64
LINE_GBPS = 400  # the default link speed
BUFFER_BYTES = 64 * 1024 * 1024  # default shared buffer per switch (one lossless queue may use it)
NAMINGS = ("openconfig", "cumulus", "sonic")
INT_CELL_BYTES = 256  # INT occupancy unit: 24 bits of cells must cover the whole buffer
GNMI_PORT = 9339

# port roles
LEAF_DOWN, LEAF_UP, SPINE_PORT = 0, 1, 2


@dataclass(frozen=True)
class JobSpec:
    """A job (one tenant's workload) over a set of nodes, on one PFC priority.

    ``traffic`` is ``"allreduce"`` (NCCL ring all-reduce bursts) or ``"moe"`` (all-to-all
    bursts); ``None`` takes the config's ``traffic``.
    """

    name: str
    tenant: str | None = None
    nodes: tuple[str, ...] = ()
    priority: int = 3
    traffic: str | None = None


def node_name(i: int) -> str:
    return f"gpu-{i + 1:03d}"


def port_names(
    naming: str, link_gbps: int, per_leaf: int
) -> tuple[Callable[[int], str], Callable[[int], str], Callable[[int], str]]:
    """Name functions for leaf downlink ``i``, the leaf uplink to spine ``s`` and the spine port
    facing leaf ``lf``, in ``naming``'s convention (module docstring)."""
    if naming == "cumulus":
        return (
            lambda i: f"swp{i + 1}",
            lambda s: f"swp{per_leaf + s + 1}",
            lambda lf: f"swp{lf + 1}",
        )
    if naming == "sonic":
        lanes = 8 if link_gbps >= 400 else 4
        return (
            lambda i: f"Ethernet{i * lanes}",
            lambda s: f"Ethernet{(per_leaf + s) * lanes}",
            lambda lf: f"Ethernet{lf * lanes}",
        )
    return (
        lambda i: f"Ethernet1/{i + 1}",
        lambda s: f"Ethernet2/{s + 1}",
        lambda lf: f"Ethernet1/{lf + 1}",
    )


def default_jobs(cfg: SimConfig) -> tuple[JobSpec, ...]:
    """Two jobs of two tenants over the two halves of the nodes (one job for a single node)."""
    names = [node_name(i) for i in range(cfg.nodes)]
    if cfg.nodes < 2:
        return (JobSpec("llm-train-a", "team-a", tuple(names)),)
    half = cfg.nodes // 2
    return (
        JobSpec("llm-train-a", "team-a", tuple(names[:half])),
        JobSpec("llm-train-b", "team-b", tuple(names[half:])),
    )


class Fabric:
    """Names and index arrays of a simulated fabric (see the module docstring for the layout)."""

    def __init__(self, cfg: SimConfig) -> None:
        self.n_nodes = n = cfg.nodes
        self.n_rails = k = cfg.nics_per_node
        self.n_spines = s = cfg.spines
        self.per_leaf = per = getattr(cfg, "nodes_per_leaf", NODES_PER_LEAF)
        self.pod_domains = bool(getattr(cfg, "pod_domains", False))
        self.link_gbps = int(getattr(cfg, "link_gbps", LINE_GBPS))
        self.buffer_bytes = int(getattr(cfg, "buffer_mb", BUFFER_BYTES >> 20)) << 20
        self.naming = str(getattr(cfg, "naming", "openconfig"))
        # an 800G NIC needs PCIe Gen6 x16 to run at line rate; slower ones come with Gen5 x16
        self.pcie_max_gts = 64.0 if self.link_gbps >= 800 else 32.0
        self.pcie_max_width = 16
        down, up, spine_facing = port_names(self.naming, self.link_gbps, per)
        self.n_pods = pods = -(-n // per)
        self.n_leaves = nl = k * pods
        self.nodes = [node_name(i) for i in range(n)]
        self.node_index = {name: i for i, name in enumerate(self.nodes)}
        self.rail_nics = [f"mlx5_{r}" for r in range(k)]
        self.rail_netdevs = [f"eth{r}" for r in range(k)]
        self.leaves = [f"leaf-r{r}-p{p}" for r in range(k) for p in range(pods)]
        self.spines = [f"spine-{i}" for i in range(s)]
        self.switches = self.leaves + self.spines
        self.switch_index = {name: i for i, name in enumerate(self.switches)}

        # NICs
        self.n_nics = e = n * k
        self.nic_node = np.repeat(np.arange(n), k)
        self.nic_rail = np.tile(np.arange(k), n)
        self.nic_leaf = self.nic_rail * pods + self.nic_node // per
        self.nic_port_name = [down(int(i) % per) for i in self.nic_node]

        # cables, directions, ports
        self.n_uplinks = u = nl * s
        self.n_cables = e + u
        self.n_dirs = 2 * self.n_cables
        self.uplink_leaf = np.repeat(np.arange(nl), s)
        self.uplink_spine = np.tile(np.arange(s), nl)
        self.n_ports = e + 2 * u
        ue = np.arange(u)
        cab_u = e + ue
        self.port_role = np.concatenate(
            [np.full(e, LEAF_DOWN), np.full(u, LEAF_UP), np.full(u, SPINE_PORT)]
        )
        self.port_switch = np.concatenate([self.nic_leaf, self.uplink_leaf, nl + self.uplink_spine])
        self.port_cable = np.concatenate([np.arange(e), cab_u, cab_u])
        self.port_out_dir = np.concatenate([2 * np.arange(e) + 1, 2 * cab_u, 2 * cab_u + 1])
        self.port_in_dir = self.port_out_dir ^ 1
        self.port_name = (
            self.nic_port_name
            + [up(int(i)) for i in self.uplink_spine]
            + [spine_facing(int(i)) for i in self.uplink_leaf]
        )
        self.port_index = {
            (self.switches[int(sw)], name): i
            for i, (sw, name) in enumerate(zip(self.port_switch, self.port_name, strict=True))
        }
        # the switch (not NIC) receives on these directions: NIC->leaf and both uplink directions
        self.dir_switch_rx = np.ones(self.n_dirs, dtype=bool)
        self.dir_switch_rx[2 * np.arange(e) + 1] = False

        # jobs
        self.jobs = list(cfg.jobs) if cfg.jobs else list(default_jobs(cfg))
        self.job_of_node = np.full(n, -1)
        for j, job in enumerate(self.jobs):
            for name in job.nodes:
                if name in self.node_index and self.job_of_node[self.node_index[name]] < 0:
                    self.job_of_node[self.node_index[name]] = j
        self.nic_job = self.job_of_node[self.nic_node]
        self.priority = self.jobs[0].priority if self.jobs else 3
        kube = set(cfg.kubernetes_nodes)
        self.scheduler = ["kubernetes" if nm in kube else "slurm" for nm in self.nodes]

    # --- lookups ---------------------------------------------------------------------------------
    def nic_index(self, node: str, nic: str) -> int:
        return self.node_index[node] * self.n_rails + self.rail_nics.index(nic)

    def nic_labels(self, e: int) -> dict[str, str]:
        return {
            "node": self.nodes[int(self.nic_node[e])],
            "nic": self.rail_nics[int(self.nic_rail[e])],
        }

    def port_labels(self, p: int) -> dict[str, str]:
        return {"switch": self.switches[int(self.port_switch[p])], "port": self.port_name[p]}

    def uplink_port(self, leaf: int, spine: int) -> int:
        """Port index of the leaf end of the leaf<->spine cable."""
        return self.n_nics + leaf * self.n_spines + spine

    def spine_port(self, leaf: int, spine: int) -> int:
        """Port index of the spine end of the leaf<->spine cable."""
        return self.n_nics + self.n_uplinks + leaf * self.n_spines + spine

    def nics_on_leaf(self, leaf: int) -> np.ndarray:
        return np.flatnonzero(self.nic_leaf == leaf)

    # --- the topology file -----------------------------------------------------------------------
    def topology_dict(self) -> dict[str, Any]:
        switches: list[dict[str, Any]] = []
        for i, name in enumerate(self.switches):
            ports = [self.port_name[p] for p in np.flatnonzero(self.port_switch == i)]
            d: dict[str, Any] = {"name": name, "role": "leaf" if i < self.n_leaves else "spine"}
            if i < self.n_leaves:
                d["rail"] = i // self.n_pods
                if self.pod_domains:
                    d["domain"] = f"pod-{i % self.n_pods}"
            d["address"] = f"127.0.{i // 250 + 1}.{i % 250 + 1}"
            d["int_node_id"] = i + 1
            d["int_ports"] = {j + 1: p for j, p in enumerate(ports)}
            d["int_cell_bytes"] = INT_CELL_BYTES
            d["buffer_bytes"] = self.buffer_bytes
            switches.append(d)
        links = []
        for c in range(self.n_uplinks):
            a, b = self.n_nics + c, self.n_nics + self.n_uplinks + c
            links.append(
                {
                    "a": f"{self.switches[int(self.port_switch[a])]}/{self.port_name[a]}",
                    "b": f"{self.switches[int(self.port_switch[b])]}/{self.port_name[b]}",
                }
            )
        nodes = []
        for i, name in enumerate(self.nodes):
            nics = []
            for r in range(self.n_rails):
                e = i * self.n_rails + r
                nics.append(
                    {
                        "nic": self.rail_nics[r],
                        "netdev": self.rail_netdevs[r],
                        "speed_gbps": self.link_gbps,
                        "rail": r,
                        "switch_port": (
                            f"{self.leaves[int(self.nic_leaf[e])]}/{self.nic_port_name[e]}"
                        ),
                    }
                )
            nodes.append({"name": name, "scheduler": self.scheduler[i], "nics": nics})
        jobs = [
            {"name": j.name, "tenant": j.tenant, "priority": j.priority, "nodes": list(j.nodes)}
            for j in self.jobs
        ]
        return {
            "fabric": f"sim-{self.n_nodes}x{self.n_rails}",
            "switches": switches,
            "links": links,
            "nodes": nodes,
            "jobs": [{k: v for k, v in j.items() if v is not None} for j in jobs],
        }


def build_topology(cfg: SimConfig) -> Topology:
    """The validated topology of the fabric ``cfg`` describes (docs/formats.md section 1)."""
    return Topology.from_dict(Fabric(cfg).topology_dict())
