"""Process-wide tuning for the long-running and bulk commands (detect, replay, evaluate, demo).

The detection loop allocates many short-lived containers per step (alert objects, small dicts,
NumPy/Polars wrappers) but keeps few of them, so CPython's cyclic garbage collector, at its
default gen-0 threshold of 700 allocations, runs thousands of times a minute over the same
long-lived objects (modules, config, topology, detector state). ``tune_gc`` moves everything
alive at start-up into the permanent generation (``gc.freeze``) and lets gen-0 fill longer
before a collection. Reference counting still frees almost everything at once; only cycles wait
for the (rarer) collections.

Those cycles are not small: a 1,024-GPU soak lifted the detector's resident size by 30-40 MB a
minute until the services called ``reclaim`` (a full collection, then ``trim_heap``) after each
checkpoint, every few seconds, for about 40 ms of CPU each time; with it the soak is flat.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import time
from typing import Any

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


_libc: Any = None


def trim_heap() -> bool:
    """Give the C heap's free pages back to the system (glibc ``malloc_trim``); False where
    that is not available.

    The detect loop's working set churns by hundreds of MB a minute (decoded Kafka records,
    Arrow buffers, NumPy arrays) from several threads. glibc keeps what those free in its
    arenas, and without a trim the resident size creeps up although nothing is kept. Call it
    now and then (the detect services do after each checkpoint); it takes a few milliseconds.
    """
    global _libc
    if _libc is None:
        try:
            _libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
            _libc.malloc_trim.argtypes = [ctypes.c_size_t]
        except (OSError, AttributeError):
            _libc = False
    if not _libc:
        return False
    _libc.malloc_trim(0)
    return True


def reclaim() -> tuple[int, float]:
    """A full collection, then the C heap trimmed: (objects freed, CPU milliseconds spent).

    For long-running services, every few seconds (after a checkpoint): with ``tune_gc``'s
    thresholds the cyclic garbage of the Kafka clients and the detectors would otherwise wait
    minutes for a full collection, and the resident size would creep up meanwhile."""
    t0 = time.process_time()
    freed = gc.collect()
    trim_heap()
    return freed, (time.process_time() - t0) * 1000
