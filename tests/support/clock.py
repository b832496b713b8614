"""A clock for tests of the runtime's timers (``rocewatch.runtime.timing.Clock``): it stands
still until the test moves it, so idle release, heartbeats, stall rules, takeover retries and
checkpoint cadence are checked to the poll, without waiting for them."""

from __future__ import annotations

import threading

# an arbitrary wall time (late 2026): outputs stamped with it are recognisable as the fake's
WALL_START = 1_796_000_000.0


class FakeClock:
    """Moves only on ``advance`` and ``sleep``; ``time`` keeps a fixed offset from
    ``monotonic``. Safe to read from the stages' threads while a test moves it.

    >>> c = FakeClock()
    >>> t = c.monotonic(); c.sleep(1.5); c.monotonic() - t
    1.5
    """

    def __init__(self, start: float = 1000.0, wall: float = WALL_START) -> None:
        # (a monotonic origin well above 0, as the system's: a timer field that starts at 0.0
        # or -inf means "long ago" on it too)
        self._now = start
        self._wall_offset = wall - start
        self._lock = threading.Lock()

    def monotonic(self) -> float:
        with self._lock:
            return self._now

    def time(self) -> float:
        with self._lock:
            return self._now + self._wall_offset

    def sleep(self, s: float) -> None:
        """A sleep takes no real time: the clock moves on by ``s``."""
        self.advance(max(0.0, s))

    def advance(self, s: float) -> None:
        if s < 0:
            raise ValueError(f"a monotonic clock does not go back ({s} s)")
        with self._lock:
            self._now += s
