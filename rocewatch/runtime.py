"""Process-wide tuning for the long-running and bulk commands (detect, replay, evaluate, demo).

The detection loop allocates many short-lived containers per step (alert objects, small dicts,
NumPy/Polars wrappers) but keeps few of them, so CPython's cyclic garbage collector, at its
default gen-0 threshold of 700 allocations, runs thousands of times a minute over the same
long-lived objects (modules, config, topology, detector state). ``tune_gc`` moves everything
alive at start-up into the permanent generation (``gc.freeze``) and lets gen-0 fill longer
before a collection. Reference counting still frees almost everything at once; only cycles wait
for the (rarer) collections, so memory stays flat.
"""

from __future__ import annotations

import gc

# Measured over benchmarks/detectors.py's 100 steps (1,024 GPUs): with the defaults the collector
# ran 72 times, about 4% of the CPU; frozen with gen-0 at 10,000, twice; at 50,000, not at all
# (margin for larger fabrics). A gen-0 of this size holds a few MB of garbage at most: max RSS
# was unchanged.
GEN0_THRESHOLD = 50_000
GEN1_THRESHOLD = 20
GEN2_THRESHOLD = 20


def tune_gc(
    gen0: int = GEN0_THRESHOLD, gen1: int = GEN1_THRESHOLD, gen2: int = GEN2_THRESHOLD
) -> None:
    """Freeze the objects alive now (imports, config) and raise the collection thresholds.

    Call once, after start-up and before the main loop. Safe to call again (a later freeze adds
    the objects alive by then)."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(gen0, gen1, gen2)
