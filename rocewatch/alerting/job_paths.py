"""The join on alerts: fabric alerts carry the NCCL jobs and ranks behind them, job alerts the
fabric on their path.

The NCCL collector sends the rank -> host, GPU, NIC join as ``nccl_rank_gpu`` samples (device
the host, port ``rank<r>``, qual ``<comm>/<nic>``, value the GPU; docs/nccl.md). ``JobPaths``
keeps it (``learn``, each step) and annotates each alert as it fires (``annotate``):

- an alert about a NIC (``node`` + ``nic``) or a switch port (``switch`` + ``port``) gets
  ``jobs`` (the jobs whose ranks use it, and the topology's jobs on its nodes) and ``ranks``
  (``<job or comm> rank <r> (<host> GPU <g> <nic>)``, at most ``MAX_LISTED``). A port reaches
  the NIC cabled to it; a leaf's uplink (or the spine's end of it) every NIC under that leaf.
- a job alert (SlowRank, SlowEdge, BusBandwidthDrop: those with a ``comm`` label) gets
  ``path_nics`` and ``path_ports`` (the NICs of the ranks it is about and their leaf ports;
  for SlowEdge the whole path between its two NICs, rocewatch/core/paths.py) and
  ``path_alerts``: the fabric alerts firing on that path as it fires, and those that fire on
  it while it fires (``refresh``, when an alert fires), separated by ``; ``.

The annotations are set on the alert's event and on the lifecycle's record of it, so the
notification, the store and ``alerts.jsonl`` carry them. Tenant labels on congestion alerts
are another stage's business (not this module's).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any, ClassVar

import polars as pl

from rocewatch.core.model import BUS_BANDWIDTH_DROP, SLOW_EDGE, SLOW_RANK, Alert
from rocewatch.core.paths import FABRIC_ALERTS, Path, alerts_on, nic_path, path_between, say
from rocewatch.core.state import Stateful
from rocewatch.core.topology import NicEnd, PortEnd, Topology

JOIN = "nccl_rank_gpu"
JOB_ALERTS = (SLOW_RANK, SLOW_EDGE, BUS_BANDWIDTH_DROP)
MAX_LISTED = 20  # ranks, NICs, ports or alerts listed in one annotation
MAX_PLACES = 200_000
STORE_EVERY_NS = 60 * 1_000_000_000  # a rank still placed is stored again (last_seen) this often


def _listing(items: list[str]) -> str:
    more = len(items) - MAX_LISTED
    return ", ".join(items[:MAX_LISTED]) + (f" (+{more} more)" if more > 0 else "")


class JobPaths(Stateful):
    """The rank join, kept for annotating alerts (module docstring)."""

    NOT_STATE: ClassVar[frozenset[str]] = frozenset({"under_leaf"})

    def __init__(self, topology: Topology) -> None:
        self.topology = topology
        # (comm, rank) -> host, nic, gpu, telemetry time of the newest join sample
        self.places: dict[tuple[str, int], tuple[str, str, int, int]] = {}
        self.stored: dict[tuple[str, int], int] = {}  # when each was last handed to storage
        self.under_leaf: dict[str, set[tuple[str, str]]] = {}
        for (node, nic), n in topology.nics.items():
            if n.switch_port is not None:
                self.under_leaf.setdefault(n.switch_port.switch, set()).add((node, nic))

    # --- the join ------------------------------------------------------------------------------
    def learn(self, join: pl.DataFrame) -> list[dict[str, Any]]:
        """Take a step's ``nccl_rank_gpu`` rows (the window engine's aggregate columns); the
        ranks newly placed, moved, or not stored for ``STORE_EVERY_NS``, as storage rows
        (storage.store.Store.write_ranks)."""
        if not join.height:
            return []
        out: list[dict[str, Any]] = []
        for dev, port, qual, v, ts in join.select("device", "port", "qual", "last", "ts").rows():
            comm, _, nic = str(qual).partition("/")
            r = str(port).removeprefix("rank")
            if not r.isdigit() or not nic:
                continue
            key = (comm, int(r))
            old = self.places.get(key)
            if old is None or int(ts) >= old[3]:
                new = (str(dev), nic, int(v), int(ts))
                self.places[key] = new
                if (
                    old is None
                    or old[:3] != new[:3]
                    or new[3] - self.stored.get(key, 0) >= (STORE_EVERY_NS)
                ):
                    self.stored[key] = new[3]
                    host, nic_, gpu, t = new
                    out.append(
                        {"job": self.job_of(host, comm), "comm": comm, "rank": key[1],
                         "host": host, "gpu": gpu, "nic": nic_, "seen_ns": t}
                    )  # fmt: skip
        if len(self.places) > MAX_PLACES:  # ranks of long-gone jobs: keep the newest
            keep = sorted(self.places.items(), key=lambda kv: kv[1][3])[-MAX_PLACES // 2 :]
            self.places = dict(keep)
            self.stored = {k: t for k, t in self.stored.items() if k in self.places}
        return out

    def job_of(self, host: str, comm: str) -> str:
        jobs = self.topology.node_jobs.get(host)
        return jobs[0] if jobs else comm

    # --- what an alert is about ------------------------------------------------------------------
    def nics_of(self, labels: Mapping[str, str]) -> set[tuple[str, str]]:
        """The NICs a fabric alert's entity carries the traffic of."""
        node, nic = labels.get("node"), labels.get("nic")
        if node is not None and nic is not None:
            return {(node, nic)}
        sw, port = labels.get("switch"), labels.get("port")
        if sw is None or port is None:
            return set()
        peer = self.topology.peer_of_port(sw, port)
        if isinstance(peer, NicEnd):
            return {(peer.node, peer.nic)}
        if isinstance(peer, PortEnd):  # a switch-to-switch cable: the NICs under its leaf end
            return set(self.under_leaf.get(sw, ())) | set(self.under_leaf.get(peer.switch, ()))
        return set()

    def path_of(self, labels: Mapping[str, str]) -> Path:
        """The fabric a job alert's ranks use."""
        name, comm = labels.get("alertname"), labels.get("comm", "")
        if name == SLOW_EDGE and labels.get("peer_node") and labels.get("peer_nic"):
            a = (labels.get("node", ""), labels.get("nic", ""))
            b = (labels["peer_node"], labels["peer_nic"])
            return path_between(self.topology, a, b)
        if name == SLOW_RANK and labels.get("node") and labels.get("nic"):
            return nic_path(self.topology, labels["node"], labels["nic"])
        p = Path()
        for (c, _), (host, nic, _, _) in sorted(self.places.items()):
            if c == comm:
                p = p | nic_path(self.topology, host, nic)
        return p

    # --- annotation ------------------------------------------------------------------------------
    def annotations(
        self, labels: Mapping[str, str], firing: Iterable[Mapping[str, str]]
    ) -> dict[str, str]:
        name = labels.get("alertname")
        if name in JOB_ALERTS and labels.get("comm"):
            path = self.path_of(labels)
            on = [a for a in alerts_on(path, firing) if a.get("comm") is None]
            return {
                "path_nics": _listing([f"{h}/{n}" for h, n in sorted(path.nics)]),
                "path_ports": _listing(sorted(str(p) for p in path.ports)),
                "path_alerts": "; ".join(say(a) for a in on[:MAX_LISTED]) or "none",
            }
        if name not in FABRIC_ALERTS:
            return {}
        nics = self.nics_of(labels)
        if not nics:
            return {}
        ranks: list[tuple[str, str, int, str, str, int]] = []
        jobs = {j for node, _ in nics for j in self.topology.node_jobs.get(node, [])}
        for (comm, r), (host, nic, gpu, _) in self.places.items():
            if (host, nic) in nics:
                job = self.job_of(host, comm)
                jobs.add(job)
                ranks.append((job, comm, r, host, nic, gpu))
        out: dict[str, str] = {}
        if jobs:
            out["jobs"] = _listing(sorted(jobs))
        if ranks:
            out["ranks"] = _listing(
                [f"{j} rank {r} ({h} GPU {g} {n})" for j, _, r, h, n, g in sorted(ranks)]
            )
        return out

    def annotate(
        self,
        events: list[Alert],
        records: Mapping[str, Alert],
        firing: Callable[[], Iterable[Mapping[str, str]]],
    ) -> None:
        """Annotate each event of an alert that just fired, and the lifecycle's record of it
        (``records``: the alerts firing, by fingerprint; ``firing``: their label sets, asked
        only when an alert fired); then ``refresh`` the firing job alerts' ``path_alerts``."""
        fired = [e for e in events if not e.ends_at]
        if not fired:
            return
        now = list(firing())
        self._annotate(fired, records, now)
        self.refresh(records, now)

    def _annotate(
        self, fired: list[Alert], records: Mapping[str, Alert], now: list[Mapping[str, str]]
    ) -> None:
        for ev in fired:
            ann = self.annotations(ev.labels, now)
            if not ann:
                continue
            ev.annotations.update(ann)
            rec = records.get(ev.fingerprint)
            if rec is not None and rec.starts_at == ev.starts_at:
                rec.annotations.update(ann)

    def fill(
        self, records: Mapping[str, Alert], firing: Callable[[], Iterable[Mapping[str, str]]]
    ) -> None:
        """Give the firing alerts of a restored state what this module adds and they lack (a
        state written before it annotated alerts): the annotations they would have had."""
        now: list[Mapping[str, str]] | None = None
        for a in records.values():
            if a.labels.get("alertname") not in (*FABRIC_ALERTS, *JOB_ALERTS):
                continue
            if now is None:
                now = list(firing())
            for k, v in self.annotations(a.labels, now).items():
                a.annotations.setdefault(k, v)

    def refresh(self, records: Mapping[str, Alert], firing: Iterable[Mapping[str, str]]) -> None:
        """Add to each firing job alert's ``path_alerts`` the fabric alerts on its path that
        fired since (what its path had while it fired, not only when it began)."""
        jobs = [a for a in records.values() if a.labels.get("alertname") in JOB_ALERTS]
        if not jobs:
            return
        now = list(firing)
        for a in jobs:
            if not a.labels.get("comm"):
                continue
            had = a.annotations.get("path_alerts", "none")
            seen = [] if had == "none" else had.split("; ")
            path = self.path_of(a.labels)
            new = [say(x) for x in alerts_on(path, now) if x.get("comm") is None]
            add = [x for x in new if x not in seen]
            if add:
                a.annotations["path_alerts"] = "; ".join((seen + add)[:MAX_LISTED])
