"""Elephant flows over a leaf's uplinks: a static-ECMP hash collision, or adaptive spraying.

Training traffic that leaves a leaf is a few elephant flows (RoCE v2: UDP to port 4791, the
source port drawn from the queue pair). Static ECMP picks each flow's uplink from a hash of its
5-tuple, so all of a flow's packets take one uplink: two elephants may share an uplink while
another of the group carries none of them. ``EcmpCollision`` (rocewatch/sim/faults.py) is such a
phase on one leaf: ``resolve`` draws flows (5-tuples from the fabric's addresses) until the
hash puts two on one uplink and none on another, and ``Elephants`` replaces the leaf's usual
uplink traffic with theirs while it lasts:

- an uplink with one flow carries it at its demand (``demand`` of line rate);
- an uplink with two or more carries them together at 88-94 % of line rate (DCQCN sharing one
  link between flows that each want all of it loses a little to queue oscillation); its egress
  queue stands at 2-6 % of the buffer (past the RED profile's Kmin: far from the buffer's limit)
  and marks 15-30 % of its packets (the marks that throttle both flows to half);
- an uplink with none carries only the non-RDMA trickle;
- the spine->leaf direction is left as it was (the spines hash the return traffic themselves).

On an adaptive-routing fabric (``SprayedElephants``: not a fault) the same flows are sprayed
packet by packet over every uplink that is up: each carries an equal share, nothing stands in a
queue. Either way an uplink that is down (a flapping cable, ``FlakyLink(uplink=True)``) carries
nothing, and static ECMP rehashes over the uplinks left.

The group delivers the demand of its flows on the uplinks they hash to; with one flow per spine
on four spines and one collision that is about 74 % of the traffic asked for, and the two
colliding flows run at under half their rate (a ring collective waits for them: ~50 % of its
bus bandwidth). The source NICs' own counters are left as the traffic model draws them (the
simulator does not slow them: a documented simplification).

>>> from rocewatch.sim.simulator import SimConfig
>>> from rocewatch.sim.fabric import Fabric
>>> fab = Fabric(SimConfig(nodes=4, nics_per_node=2, spines=4))
>>> flows = draw_flows(fab, leaf=0, n=4, rng=np.random.default_rng(1), collide=True)
>>> sorted(np.bincount([f.uplink for f in flows], minlength=4).tolist())
[0, 1, 1, 2]
"""

from __future__ import annotations

import ipaddress
import zlib
from dataclasses import dataclass
from typing import Any

import numpy as np

from rocewatch.core.errors import ConfigError
from rocewatch.sim.fabric import Fabric

ROCE_PORT = 4791  # RoCE v2's UDP destination port (IANA)
SPORT_RANGE = (49152, 65536)  # NICs draw the UDP source port from the queue pair: ephemeral range
SHARED_UTIL = (0.88, 0.94)  # line-rate share an uplink shared by two or more elephants carries
HOT_DEPTH = (0.02, 0.06)  # share of the buffer its queue holds
HOT_MARKS = (0.15, 0.30)  # share of its packets marked
MAX_DRAWS = 10_000


@dataclass(frozen=True)
class Flow:
    """One elephant flow: its 5-tuple and the uplink (spine index) static ECMP gives it."""

    src: str  # "node/nic"
    dst: str
    src_ip: str
    dst_ip: str
    sport: int
    uplink: int

    def to_dict(self) -> dict[str, Any]:
        return {
            "src": self.src,
            "dst": self.dst,
            "five_tuple": {
                "src_ip": self.src_ip,
                "dst_ip": self.dst_ip,
                "proto": 17,
                "src_port": self.sport,
                "dst_port": ROCE_PORT,
            },
            "uplink": self.uplink,
        }


def nic_ip(fab: Fabric, e: int) -> str:
    """A NIC's RoCE address: 10.<rail>.<node / 256>.<node % 256 + 1> (one subnet per rail)."""
    node, rail = int(fab.nic_node[e]), int(fab.nic_rail[e])
    return f"10.{rail}.{node // 256}.{node % 256 + 1}"


def ecmp_hash(src_ip: str, dst_ip: str, sport: int, n: int) -> int:
    """The uplink (0..n-1) a switch's static ECMP hash picks for a RoCE v2 flow: CRC-32 of its
    5-tuple, modulo the group's size (switches use CRC variants over the same fields)."""
    key = (
        ipaddress.IPv4Address(src_ip).packed
        + ipaddress.IPv4Address(dst_ip).packed
        + bytes([17])
        + sport.to_bytes(2, "big")
        + ROCE_PORT.to_bytes(2, "big")
    )
    return zlib.crc32(key) % n


def draw_flows(
    fab: Fabric, leaf: int, n: int, rng: np.random.Generator, collide: bool
) -> tuple[Flow, ...]:
    """``n`` elephant flows from the NICs of ``leaf`` to NICs behind other leaves, with the
    uplink static ECMP hashes each to; ``collide``: drawn again until two share an uplink and
    another uplink carries none (what an unlucky hash does)."""
    S = fab.n_spines
    if S < 2:
        raise ConfigError("EcmpCollision: a leaf needs two or more spines (an ECMP group)")
    mine = fab.nics_on_leaf(leaf)
    others = np.flatnonzero(fab.nic_leaf != leaf)
    if len(mine) == 0 or len(others) == 0:
        raise ConfigError("EcmpCollision: the fabric needs NICs behind two leaves or more")
    for _ in range(MAX_DRAWS):
        src = rng.choice(mine, size=n, replace=len(mine) < n)
        dst = rng.choice(others, size=n, replace=len(others) < n)
        sport = rng.integers(*SPORT_RANGE, size=n)
        flows = tuple(
            Flow(
                "{node}/{nic}".format(**fab.nic_labels(int(s))),
                "{node}/{nic}".format(**fab.nic_labels(int(d))),
                nic_ip(fab, int(s)),
                nic_ip(fab, int(d)),
                int(p),
                ecmp_hash(nic_ip(fab, int(s)), nic_ip(fab, int(d)), int(p), S),
            )
            for s, d, p in zip(src, dst, sport, strict=True)
        )
        counts = np.bincount([f.uplink for f in flows], minlength=S)
        # an unlucky hash: two flows share an uplink while exactly one other carries none
        if not collide or (counts.max() == 2 and np.count_nonzero(counts == 0) == 1):
            return flows
    raise ConfigError("EcmpCollision: no colliding hash found")  # pragma: no cover


class Elephants:
    """The uplink load and queues of the leaves whose elephant phases are on (module doc)."""

    def __init__(self, fab: Fabric, seed: int) -> None:
        self.fab = fab
        # (t0, t1, leaf, flows' uplinks, demand, sprayed)
        self.phases: list[tuple[float, float, int, np.ndarray, float, bool]] = []
        self.seed = seed
        self.rng = np.random.default_rng([seed, 11])  # its own stream: other runs unchanged
        self.hot: list[tuple[np.ndarray, float]] = []  # this tick's shared uplinks' directions

    def restart(self) -> None:
        """From the first tick again (the same run gives the same telemetry)."""
        self.rng = np.random.default_rng([self.seed, 11])
        self.hot = []

    def add(
        self,
        t0: float,
        t1: float,
        leaf: int,
        uplinks: tuple[int, ...],
        demand: float,
        sprayed: bool,
    ) -> None:
        self.phases.append((t0, t1, leaf, np.array(uplinks, dtype=int), demand, sprayed))

    def carry(
        self, by: np.ndarray, up: np.ndarray, t0: float, t1: float, line: float, T: float
    ) -> None:
        """Replace the leaf->spine bytes ``by`` (this tick's) of the leaves in a phase (for the
        share of the tick it covers) with their elephants'; ``line``: an uplink's bytes a tick
        at line rate; ``up``: each uplink's share of the tick it was up (leaves x spines)."""
        S, E = self.fab.n_spines, self.fab.n_nics
        self.hot = []
        for p0, p1, leaf, uplinks, demand, sprayed in self.phases:
            f = max(0.0, min(p1, t1) - max(p0, t0)) / T
            if f <= 0:
                continue
            alive = up[leaf] > 0.5
            n_up = int(alive.sum())
            util = np.zeros(S)
            shared = np.zeros(0, dtype=int)
            if n_up and sprayed:
                util[alive] = min(0.97, len(uplinks) * demand / n_up)
            elif n_up:
                # static ECMP rehashes over the uplinks that are up (the hash's own order)
                live = np.flatnonzero(alive)
                took = live[uplinks % n_up] if n_up < S else uplinks
                counts = np.bincount(took, minlength=S)
                util = np.where(counts == 1, demand, 0.0)
                shared = np.flatnonzero(counts >= 2)
                if len(shared):
                    util[shared] = self.rng.uniform(*SHARED_UTIL, len(shared))
            trickle = self.rng.uniform(0.5e6, 2e6, S) * T
            d = 2 * (E + leaf * S + np.arange(S))  # the leaf->spine directions
            by[d] = f * (util * line * up[leaf] + trickle) + (1 - f) * by[d]
            if len(shared):
                self.hot.append((2 * (E + leaf * S + shared), f))

    def queues(self, depth: np.ndarray, peak: np.ndarray, pm: np.ndarray, B: float) -> None:
        """The egress queues of this tick's shared uplinks stand past Kmin and mark."""
        for d, f in self.hot:
            depth[d] = f * self.rng.uniform(*HOT_DEPTH, len(d)) * B + (1 - f) * depth[d]
            peak[d] = np.maximum(peak[d], depth[d] * self.rng.uniform(1.0, 1.3, len(d)))
            pm[d] = f * self.rng.uniform(*HOT_MARKS, len(d)) + (1 - f) * pm[d]


def uplink_names(fab: Fabric, leaf: int, spines: list[int]) -> list[dict[str, str]]:
    """The leaf ends of ``spines``' uplinks, as port labels."""
    return [fab.port_labels(fab.uplink_port(leaf, s)) for s in spines]


def truth_entry(fab: Fabric, leaf: int, flows: tuple[Flow, ...]) -> dict[str, Any]:
    """What the ground truth says of a collision: the leaf, the hot and cold uplinks (both
    ends) and the colliding flows."""
    S = fab.n_spines
    counts = np.bincount([f.uplink for f in flows], minlength=S)
    hot = [int(s) for s in np.flatnonzero(counts >= 2)]
    cold = [int(s) for s in np.flatnonzero(counts == 0)]
    sw = {"switch": fab.leaves[leaf]}
    hot_ends = uplink_names(fab, leaf, hot) + [
        fab.port_labels(fab.spine_port(leaf, s)) for s in hot
    ]
    return {
        "labels": sw,
        # the collision itself, or the congestion it causes on its hot uplinks' queues
        "match": [sw, *hot_ends],
        "culprit_node": None,
        "victims": [],
        "details": {
            "hot_uplinks": uplink_names(fab, leaf, hot),
            "cold_uplinks": uplink_names(fab, leaf, cold),
            "flows": [f.to_dict() for f in flows],
            "colliding_flows": [f.to_dict() for f in flows if counts[f.uplink] >= 2],
        },
    }


__all__ = ["Elephants", "Flow", "draw_flows", "ecmp_hash", "nic_ip", "truth_entry"]
