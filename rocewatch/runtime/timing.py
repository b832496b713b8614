"""How often the detector service's stages report, poll and give up (seconds of its clock; the
clock itself is rocewatch.core.clock)."""

from __future__ import annotations

from rocewatch.core.clock import SYSTEM_CLOCK, Clock, SystemClock  # noqa: F401 (re-exported)

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
