"""Telemetry time that a bad clock cannot move.

Every watermark in rocewatch is built from the newest sample time a source has delivered. One
node whose clock jumped a year ahead would, unguarded, drag that newest time with it: every step
up to next year closes, and every honest sample after it arrives "late" and is dropped. So each
source (a recorded file, a Kafka partition) passes its samples through a ``ClockGuard`` first.

The guard keeps the source's reference time: the newest accepted sample time. A sample stamped
more than ``max_ahead_s`` past it (or, live, past the wall clock) is set aside and counted
(``clock_ahead_samples``); one more than ``max_behind_s`` before it is counted
(``clock_behind_samples``) and set aside too, since the windows closed long ago. Neither ever
advances the reference, so neither can close a window. The device is logged once.

Time may also genuinely jump: a whole recording resumes after an outage, a collector restarts
after a pause. Then every device is ahead at once. The guard tells the two apart by majority:
while samples are being set aside, it counts the distinct devices that are ahead and those that
still report on the reference's time; once the ahead devices outnumber the others, time has
moved, the reference jumps to the oldest ahead sample, and the samples held since the jump
began (up to ``max_held_rows``) are released in order. A single lying device never outvotes a
fabric; a fabric never waits on one device.

>>> import numpy as np
>>> g = ClockGuard(max_ahead_s=30.0)
>>> s = 1_000_000_000
>>> g.admit(np.array([10 * s, 11 * s]), np.array(["a", "b"])).tolist()
[True, True]
>>> year = 365 * 86400 * s
>>> g.admit(np.array([12 * s, year, 12 * s]), np.array(["a", "c", "b"])).tolist()
[True, False, True]
>>> g.reference == 12 * s, g.stats.get("clock_ahead_samples")
(True, 1)
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import numpy as np
import polars as pl

from rocewatch.core.stats import Stats

log = logging.getLogger(__name__)
NS = 1_000_000_000


class ClockGuard:
    """One source's reference time, and the samples whose clocks disagree with it."""

    def __init__(
        self,
        max_ahead_s: float = 30.0,
        max_behind_s: float = 600.0,
        stats: Stats | None = None,
        wall_ns: Callable[[], int] | None = None,
        max_held_rows: int = 200_000,
        name: str = "",
    ) -> None:
        self.ahead_ns = round(max_ahead_s * NS)
        self.behind_ns = round(max_behind_s * NS)
        self.stats = stats or Stats()
        self.wall_ns = wall_ns  # live operation: samples ahead of the wall clock are set aside
        self.max_held_rows = max_held_rows
        self.name = name
        self.reference: int | None = None
        self._reported: set[str] = set()
        # an open jump: every device heard from since it began -> whether it is ahead now
        self._latest: dict[Any, bool] = {}
        self._calls = 0
        self._held: list[pl.DataFrame] = []
        self._held_rows = 0
        self._held_lo, self._held_hi = 2**63 - 1, 0
        self.jumped = False

    # --- the mask -------------------------------------------------------------------------------
    def admit(self, ts: np.ndarray, device: np.ndarray | None = None) -> np.ndarray:
        """Which of these samples (times ``ts``, devices ``device``) go on: a boolean mask.

        Usually one comparison of the batch's extremes; the per-device work runs only while a
        clock disagrees. After a call that confirmed a jump, ``jumped`` is true (``filter``
        then releases the samples it held)."""
        self.jumped = False
        n = len(ts)
        if n == 0 or self.quick(ts):
            return np.ones(n, dtype=bool)
        ref = self.reference
        assert ref is not None  # quick() set it
        ahead = self._ahead_of(ts, ref)
        behind = ts < ref - self.behind_ns
        keep = ~(ahead | behind)
        devs = device if device is not None else np.full(n, self.name or "?", dtype=object)
        if behind.any():
            self._report(devs, behind, "behind")
            self.stats.inc("clock_behind_samples", int(behind.sum()))
        if keep.any():
            self.reference = max(ref, int(ts[keep].max()))
        if ahead.any():
            self._report(devs, ahead, "ahead")
            self.stats.inc("clock_ahead_samples", int(ahead.sum()))
            self._calls += 1
        if ahead.any() or self._latest:
            # each device's newest word in this batch decides which side it is on now: a device
            # that went ahead and came back is on time; one that moved on with the rest is ahead
            u, last = np.unique(devs[::-1], return_index=True)
            for d, a in zip(u.tolist(), ahead[::-1][last].tolist(), strict=True):
                self._latest[d] = a
            self._settle(ts[ahead])
        return keep

    def quick(self, ts: np.ndarray) -> bool:
        """True when every one of ``ts`` agrees with the reference and no jump is open (the
        reference then moves to their newest): the usual batch, judged without its devices."""
        if len(ts) == 0:
            return True
        lo, hi = int(ts.min()), int(ts.max())
        if self.reference is None:
            # a first batch holding a lying sample must not make it the reference: start from
            # the batch's median, and judge the batch against that
            self.reference = int(np.median(ts))
        if self._latest or lo < self.reference - self.behind_ns:
            return False
        if hi > self._limit() and self._ahead_of(ts, self.reference).any():
            return False
        self.reference = max(self.reference, hi)
        return True

    def _settle(self, ahead_ts: np.ndarray) -> None:
        """Decide an open jump: confirmed when the devices now ahead outnumber those on the
        reference's time (two of them, or one seen twice: a single sample proves nothing);
        dropped when no device is ahead any more (its clock came back)."""
        n_ahead = sum(self._latest.values())
        if not n_ahead:
            self._close()
            return
        if n_ahead <= len(self._latest) - n_ahead or (n_ahead < 2 and self._calls < 2):
            return
        start = min(self._held_lo, int(ahead_ts.min())) if len(ahead_ts) else self._held_lo
        log.info(
            "%stelemetry time moved on by %.1f s on most devices at once: accepted",
            f"{self.name}: " if self.name else "",
            (start - (self.reference or start)) / NS,
        )
        self.stats.inc("clock_jumps_accepted")
        self.reference = max(self._held_hi, int(ahead_ts.max()) if len(ahead_ts) else 0)
        self.jumped = True

    def _close(self) -> None:
        self._latest, self._calls = {}, 0

    def _ahead_of(self, ts: np.ndarray, ref: int) -> np.ndarray:
        """The samples past a leap of more than the bound in time, or past the wall clock.

        A batch of a recording may span minutes, so a sample is not judged against the
        reference alone: the times above the reference, in order, must climb from it in steps
        no longer than the bound; everything above the first longer step is ahead. Liars thus
        never vouch for each other, and honest samples never need a liar to vouch for them."""
        above = np.sort(ts[ts > ref])
        ahead = np.zeros(len(ts), dtype=bool)
        if len(above):
            steps = np.diff(np.r_[ref, above])
            leap = np.flatnonzero(steps > self.ahead_ns)
            if len(leap):
                cut = int(ref if leap[0] == 0 else above[leap[0] - 1])
                ahead = ts > cut
        if self.wall_ns is not None:
            ahead |= ts > self.wall_ns() + self.ahead_ns
        return ahead

    def _limit(self) -> int:
        assert self.reference is not None
        limit = self.reference + self.ahead_ns
        if self.wall_ns is not None:
            limit = min(limit, self.wall_ns() + self.ahead_ns)
        return limit

    def _report(self, devs: np.ndarray, mask: np.ndarray, way: str) -> None:
        for d in np.unique(devs[mask]).tolist()[:20]:
            key = f"{way}:{d}"
            if key in self._reported or len(self._reported) >= 1000:
                continue
            self._reported.add(key)
            self.stats.inc("clock_off_devices", detail=f"{d} {way}")
            log.warning(
                "%s%s's clock is %s of the fabric's by more than %.0f s: its samples are set "
                "aside and counted",
                f"{self.name}: " if self.name else "",
                d,
                way,
                (self.ahead_ns if way == "ahead" else self.behind_ns) / NS,
            )

    # --- frames ---------------------------------------------------------------------------------
    def filter(self, frame: pl.DataFrame) -> pl.DataFrame:
        """The rows of ``frame`` (columns ``ts``, ``device``) that go on now: with the rows held
        since a jump in front of them once the majority confirms it."""
        if frame.height == 0:
            return frame
        ts_col = frame.get_column("ts")
        if ts_col.null_count():
            frame = frame.filter(ts_col.is_not_null())  # the decoders count these themselves
            ts_col = frame.get_column("ts")
        ts = ts_col.to_numpy()
        if len(ts) == 0 or self.quick(ts):
            return frame
        before = self.reference
        keep = self.admit(ts, frame.get_column("device").to_numpy())
        if keep.all() and not self.jumped:
            if not self._latest:
                self._drop_held()
            return frame
        ahead = ~keep & (ts > (before if before is not None else self.reference or 0))
        if not self.jumped and ahead.any():
            self._hold(frame.filter(pl.Series(ahead)))
        if self.jumped:
            held = [*self._held, frame.filter(pl.Series(ahead))]
            self._drop_held()
            self._close()
            self.stats.inc("clock_ahead_released", sum(h.height for h in held))
            frame = pl.concat([frame.filter(pl.Series(keep)), *held], how="vertical_relaxed")
            return frame.sort("ts")
        if not self._latest:
            self._drop_held()
        return frame.filter(pl.Series(keep))

    def _hold(self, rows: pl.DataFrame) -> None:
        if self._held_rows + rows.height > self.max_held_rows:
            return  # counted as set aside already; a long-lying device is not kept in memory
        t = rows.get_column("ts")
        self._held_lo = min(self._held_lo, int(t.min()))  # type: ignore[arg-type]
        self._held_hi = max(self._held_hi, int(t.max()))  # type: ignore[arg-type]
        self._held.append(rows)
        self._held_rows += rows.height

    def _drop_held(self) -> None:
        self._held, self._held_rows = [], 0
        self._held_lo, self._held_hi = 2**63 - 1, 0
