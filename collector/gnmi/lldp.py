"""Cabling from LLDP over gNMI: discover a topology, and check the one in use against it.

Switches report each port's LLDP neighbour under
``/lldp/interfaces/interface[name=P]/neighbors/neighbor[id=N]/state`` (``system-name``,
``port-id``, ``port-description``, ``chassis-id``). A neighbour whose system name is a switch
we collect from is a switch-to-switch cable; any other is a host, whose ``port-id`` is its
netdev (lldpd's default) and whose ``port-description`` may name the RDMA device.
"""

from __future__ import annotations

from typing import Any

from collector.gnmi.decode import LldpTable
from rocewatch.core.topology import NicEnd, PortEnd, Topology


def cabling_problems(topology: Topology, lldp: LldpTable) -> list[str]:
    """One line per port whose LLDP neighbour disagrees with the topology's cable."""
    out: list[str] = []
    for (switch, port), (r_sys, r_port) in sorted(lldp.neighbours().items()):
        want = topology.peer_of_port(switch, port)
        if want is None:
            if r_sys in topology.switches or r_sys in topology.nodes:
                out.append(
                    f"{switch}/{port}: LLDP sees {r_sys}/{r_port}, the topology has no cable there"
                )
            continue
        if isinstance(want, PortEnd):
            if (r_sys, r_port) != (want.switch, want.port):
                out.append(f"{switch}/{port}: cabled to {r_sys}/{r_port}, topology says {want}")
        elif isinstance(want, NicEnd):
            nic = topology.nics.get((want.node, want.nic))
            names = {want.nic} | ({nic.netdev} if nic is not None and nic.netdev else set())
            desc = lldp_description(lldp, switch, port)
            if r_sys != want.node or not (r_port in names or desc in names):
                out.append(f"{switch}/{port}: cabled to {r_sys}/{r_port}, topology says {want}")
    return out


def lldp_description(lldp: LldpTable, switch: str, port: str) -> str:
    for leaves in lldp.rows.get((switch, port), {}).values():
        if leaves.get("port-description"):
            return leaves["port-description"]
    return ""


def discover(
    lldp: LldpTable,
    switches: dict[str, str],
    fabric: str = "discovered",
    base: Topology | None = None,
) -> dict[str, Any]:
    """A topology document (docs/formats.md section 1) from what LLDP reports.

    ``switches`` maps each collected switch to its gNMI address. Roles: a switch with host
    neighbours is a leaf, others are spines. ``base`` (an existing topology) supplies roles,
    rails, node schedulers and the NIC names LLDP cannot know.
    """
    nb = lldp.neighbours()
    links: set[tuple[str, str]] = set()
    hosts: dict[str, dict[str, dict[str, Any]]] = {}
    has_hosts: set[str] = set()
    for (sw, port), (r_sys, r_port) in sorted(nb.items()):
        if r_sys in switches:
            a, b = f"{sw}/{port}", f"{r_sys}/{r_port}"
            links.add((a, b) if a < b else (b, a))
        else:
            has_hosts.add(sw)
            desc = lldp_description(lldp, sw, port)
            nic_name = desc or r_port
            if base is not None:
                for (node, nic), n in base.nics.items():
                    if node == r_sys and r_port in (n.netdev, n.nic):
                        nic_name = nic
            hosts.setdefault(r_sys, {})[nic_name] = {
                "nic": nic_name,
                "netdev": r_port,
                "switch_port": f"{sw}/{port}",
            }
    sw_docs = []
    for name, addr in sorted(switches.items()):
        d: dict[str, Any] = {"name": name, "role": "leaf" if name in has_hosts else "spine"}
        if base is not None and name in base.switches:
            bs = base.switches[name]
            d["role"] = bs.role
            if bs.rail is not None:
                d["rail"] = bs.rail
        d["address"] = addr
        sw_docs.append(d)
    nodes = []
    for node, nics in sorted(hosts.items()):
        sched = "slurm"
        if base is not None and node in base.nodes:
            sched = base.nodes[node].scheduler
        nodes.append({"name": node, "scheduler": sched, "nics": [nics[k] for k in sorted(nics)]})
    return {
        "fabric": fabric,
        "switches": sw_docs,
        "links": [{"a": a, "b": b} for a, b in sorted(links)],
        "nodes": nodes,
    }
