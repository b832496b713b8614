"""The project's exceptions: one root, a few subclasses that say what the caller can do."""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable


class RocewatchError(Exception):
    """Root of every error rocewatch raises on purpose."""


class ConfigError(RocewatchError):
    """Configuration or topology is unusable; fix the file and start again."""


class BadInput(RocewatchError):
    """One record or message cannot be decoded; count it, skip it, keep the stream going."""


class RetryableError(RocewatchError):
    """A dependency (broker, database, receiver, scheduler) failed in a way worth retrying."""


class PermanentError(RocewatchError):
    """A dependency refused the request; retrying the same request will not help."""


class Fenced(RocewatchError):
    """This process no longer holds the right to act: another instance has taken its work over
    (rocewatch.bus.transactions.DetectWriter). Not an outcome to record: the work stops here."""


class ProducerFailed(RocewatchError):
    """A record this process sent did not reach Kafka: the broker refused it (kafka-python's
    idempotent producer treats that as fatal and fails every later batch too), or it was not
    delivered in time. The process stops here, before a checkpoint can commit offsets past
    what was lost; a restart (the supervisor's) resumes from the last checkpoint and writes
    it again."""


def run_command(prog: str, verbose: bool, run: Callable[[], int]) -> int:
    """A command's exit status: logging to stderr, then ``run()``; a ConfigError is 2 with its
    lines (the first after ``PROG: error:``), another RocewatchError 1, Ctrl-C 130. Shared by
    ``rocewatch`` and the lean ``rocewatch-agent`` (this module imports nothing heavy)."""
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    logging.getLogger("kafka").setLevel(logging.WARNING)
    try:
        return run()
    except ConfigError as e:
        lines = str(e).splitlines() or ["invalid input"]
        print(f"{prog}: error: {lines[0]}", file=sys.stderr)
        for line in lines[1:]:
            print(f"  {line}", file=sys.stderr)
        return 2
    except RocewatchError as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
