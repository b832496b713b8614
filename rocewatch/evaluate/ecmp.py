"""The matrix's ECMP cells: elephant flows over a leaf's uplinks, hashed or sprayed.

A cell with ``ecmp="collision"`` has, in each round's fault slot, a static-ECMP collision on a
leaf (``EcmpCollision``: two elephant flows on one uplink, another uplink idle; the leaves
taken in turn) and no other fault: each round is one ECMPImbalance to find within the bound
(three intervals of the switch counters, at least 10 s). ``ecmp="adaptive"`` (a healthy cell)
has the same flows sprayed by adaptive routing (``SprayedElephants``: not a fault), so any
alert is a false one. The cells' counter clears and agent gaps are the matrix's own.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rocewatch.sim.faults import EcmpCollision, Fault, SprayedElephants

if TYPE_CHECKING:
    from rocewatch.evaluate.matrix import Cell

ECMP_KINDS = ("", "collision", "adaptive")


def ecmp_faults(cell: Cell) -> list[Fault]:
    """The elephant phases of an ECMP cell, one per round in the round's fault slot (after
    the storm slot, which stays quiet: the cells judge this detector alone)."""
    if cell.ecmp not in ECMP_KINDS:
        raise ValueError(f"{cell.name}: ecmp {cell.ecmp!r} is not one of {ECMP_KINDS[1:]}")
    if not cell.ecmp:
        return []
    tl = cell.timeline()
    kind = SprayedElephants if cell.ecmp == "adaptive" else EcmpCollision
    rounds = min(2, cell.rounds) if cell.healthy else cell.rounds
    out: list[Fault] = []
    for i in range(rounds):
        r0 = tl["lead_s"] + i * tl["round_s"]
        f0 = r0 + tl["storm_s"] + tl["pair_s"] + tl["storm_gap_s"]
        out.append(kind(onset_s=round(f0, 2), duration_s=tl["fault_s"]))
    return out


__all__ = ["ECMP_KINDS", "ecmp_faults"]
