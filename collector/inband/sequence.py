"""Lost telemetry reports, from the group header's 22-bit Sequence Number.

Telemetry Report v2.0, section "Telemetry Report Group Header": the Sequence Number "reflects
the sequence of reports from a specific combination of (Node ID, hw_id) to a particular
telemetry report destination" and wraps at 22 bits. One number per telemetry report packet (a
datagram may carry several individual reports), so a gap counts missing datagrams.

Per (Node ID, hw_id) the tracker keeps the last number seen and how far the highest one seen is
ahead of it. A number up to ``late_window`` behind the previous one is a late or duplicate
datagram (counted in ``late``; the gap it was counted in stays counted, as a duplicate cannot be
told from a late one without a bitmap); further behind, or more than half the 22-bit space ahead,
the exporter has restarted (``restarts``: counting starts afresh). ``update`` is vectorised over a
whole batch and gives what calling it datagram by datagram gives.

>>> import numpy as np
>>> t = SequenceTracker()
>>> t.update(np.array([7, 7, 7]), np.array([0, 0, 0]), np.array([0x3FFFFE, 0x3FFFFF, 2]))
>>> t.take_lost()
{(7, 0): 2}
"""

from __future__ import annotations

from collections import Counter

import numpy as np

SEQ_BITS = 22
SEQ_MOD = 1 << SEQ_BITS
_HALF = SEQ_MOD >> 1


class SequenceTracker:
    """Counts sequence gaps per (Node ID, hw_id); state is bounded by ``max_keys``."""

    def __init__(self, late_window: int = 4096, max_keys: int = 65536) -> None:
        self.late_window = late_window
        # a flood of garbage with random Node IDs must not grow the state without bound
        self.max_keys = max_keys
        self._state: dict[int, tuple[int, int]] = {}  # key -> (last seq, highest - last)
        self.lost_total = 0
        self.late = 0  # behind the previous one by at most late_window (reordered, duplicated)
        self.restarts = 0  # jumped back further: counting restarted
        self.untracked = 0  # datagrams of keys beyond max_keys
        self._pending: Counter[tuple[int, int]] = Counter()

    def take_lost(self) -> dict[tuple[int, int], int]:
        """Reports lost per (Node ID, hw_id) since the last call."""
        out = dict(self._pending)
        self._pending.clear()
        return out

    def update(self, node: np.ndarray, hw: np.ndarray, seq: np.ndarray) -> None:
        """Datagrams' group header fields, in arrival order."""
        n = int(seq.shape[0])
        if n == 0:
            return
        key = (node.astype(np.int64) << 6) | hw.astype(np.int64)
        s = seq.astype(np.int64) & (SEQ_MOD - 1)
        if n > 1:
            order = np.argsort(key, kind="stable")
            key, s = key[order], s[order]
        first = np.ones(n, dtype=bool)
        first[1:] = key[1:] != key[:-1]
        gstart = np.flatnonzero(first)
        gid = np.cumsum(first) - 1
        ng = int(gstart.shape[0])
        prev = np.empty(n, dtype=np.int64)
        prev[1:] = s[:-1]
        prev[0] = s[0]
        has = np.zeros(ng, dtype=bool)
        ahead = np.zeros(ng, dtype=np.int64)
        tracked = np.ones(ng, dtype=bool)
        room = self.max_keys - len(self._state)
        for j, k in enumerate(key[gstart].tolist()):
            got = self._state.get(k)
            if got is not None:
                prev[gstart[j]], ahead[j] = got
                has[j] = True
            elif room > 0:
                room -= 1
            else:
                tracked[j] = False
        d = (s - prev) & (SEQ_MOD - 1)
        sd = np.where(d >= _HALF, d - SEQ_MOD, d)  # signed step from the previous datagram
        cont = first & has[gid]  # continues the stored state
        restart = (sd < -self.late_window) & (~first | cont)
        segstart = (first & ~cont) | restart  # a new count: first sight or a restart
        resume = cont & ~restart
        sd = np.where(segstart, 1, sd)  # one past a base of 0: neither lost nor late
        seg_at = np.flatnonzero(segstart | resume)
        seg = np.cumsum(segstart | resume) - 1
        cs = np.cumsum(sd)
        u = cs - (cs[seg_at] - sd[seg_at])[seg]  # position relative to the segment's base
        base = np.where(resume[seg_at], ahead[gid[seg_at]], 0)  # highest seen, before the batch
        run = self._running_max(np.maximum(u, base[seg]), seg, seg_at)
        before = np.empty(n, dtype=np.int64)
        before[1:] = run[:-1]
        before[seg_at] = base
        lost = np.maximum(u - before - 1, 0)
        keep = tracked[gid]
        self.late += int(np.count_nonzero((u <= before) & keep))
        self.restarts += int(np.count_nonzero(restart & keep))
        self.untracked += n - int(np.count_nonzero(keep))
        per = np.bincount(gid, weights=np.where(keep, lost, 0), minlength=ng).astype(np.int64)
        gend = np.append(gstart[1:], n) - 1
        last, top = s[gend].tolist(), (run[gend] - u[gend]).tolist()
        for j, k in enumerate(key[gstart].tolist()):
            if not tracked[j]:
                continue
            self._state[k] = (last[j], top[j])
            if per[j]:
                self._pending[(k >> 6, k & 0x3F)] += int(per[j])
                self.lost_total += int(per[j])

    @staticmethod
    def _running_max(v: np.ndarray, seg: np.ndarray, seg_at: np.ndarray) -> np.ndarray:
        """Running maximum of ``v`` restarting at every segment."""
        lo, hi = int(v.min()), int(v.max())
        big = hi - lo + 1
        if big * (int(seg_at.shape[0]) + 1) < (1 << 62):
            # segments lifted apart so that one accumulate never carries over between them
            lift = seg * big
            return np.maximum.accumulate(v - lo + lift) - lift + lo
        out = np.empty_like(v)
        ends = np.append(seg_at[1:], v.shape[0])
        for a, b in zip(seg_at.tolist(), ends.tolist(), strict=True):
            out[a:b] = np.maximum.accumulate(v[a:b])
        return out
