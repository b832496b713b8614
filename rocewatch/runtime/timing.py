"""How often the detector service's stages report, poll and give up (seconds of its clock), and
the clock they read it on."""

from __future__ import annotations

import time as _time  # (``SystemClock.time`` would shadow the module)
from typing import Protocol

HEARTBEAT_S = 1.0  # an owned partition reports at least this often
# a detect stage that heard from no partition this long is the one not hearing (a broker away):
# nobody's silence then says that a partition has no owner
DEAF_S = 5 * HEARTBEAT_S
END_EVERY_S = 0.2  # how stale the telemetry end offsets behind an idle report may be
MAX_SKEW_S = 2.0  # how far one owned partition may run ahead of the slowest
POLL_MS = 100  # each stage's longest wait for records (a poll returns as soon as some come)
STANDBY_POLL_MS = 250  # the detect stage's while another instance runs it
DETECT_JOIN_S = 120.0  # how long a stopping instance waits for the detect stage's last step
TAKEOVER_RETRY_S = 2.0  # how soon a takeover that met an unreachable broker is tried again


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
