"""The clock the runtime's own timers read: injected, so tests move a fake one instead of
sleeping."""

from __future__ import annotations

import time as _time  # (``SystemClock.time`` would shadow the module)
from typing import Protocol


class Clock(Protocol):
    """The time the runtime's own timers run on (idle release, heartbeats, stall and deaf
    rules, takeover retries, checkpoint cadence). ``DetectService`` hands one to its stages, so
    tests move a fake one instead of waiting; the Kafka clients' own waits (poll timeouts, a
    future's ``get``) are the broker's and stay on real time."""

    def monotonic(self) -> float:
        """Seconds on a clock that never goes back (timers and deadlines)."""
        ...

    def time(self) -> float:
        """Wall-clock seconds since the epoch (times that go into outputs)."""
        ...

    def sleep(self, s: float) -> None:
        """Wait ``s`` seconds of this clock."""
        ...


class SystemClock:
    """The process's clocks (``time``); the default everywhere."""

    # the functions themselves, not wrappers: a timer read costs what it cost before
    monotonic = staticmethod(_time.monotonic)
    time = staticmethod(_time.time)
    sleep = staticmethod(_time.sleep)


SYSTEM_CLOCK: Clock = SystemClock()
