"""Operators' commands (approve, reject, undrain) and how the detect service carries them out.

Commands are queued where the service can see them: in the store (``rocewatch approve`` and
``rocewatch undrain`` write there) or, for the HTTP API of a service without a store, in
memory. The service applies pending commands to its drain policy between polls and records
the result on the command; the resulting drain or resume is an action like any other.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from actions.policy import DrainPolicy
from rocewatch.core.model import Action

log = logging.getLogger(__name__)

COMMANDS = ("approve", "reject", "undrain")


class CommandQueue(Protocol):
    def add_command(self, command: str, node: str, requested_by: str) -> int: ...

    def commands(
        self, status: str | None = None, ids: Sequence[int] = ()
    ) -> list[dict[str, Any]]: ...

    def finish_command(self, command_id: int, status: str, result: str) -> None: ...


class MemoryCommands:
    """A CommandQueue for a service without a store (thread-safe: the HTTP API writes)."""

    def __init__(self) -> None:
        self._rows: dict[int, dict[str, Any]] = {}
        self._ids = itertools.count(1)
        self._lock = threading.Lock()

    def add_command(self, command: str, node: str, requested_by: str) -> int:
        with self._lock:
            i = next(self._ids)
            self._rows[i] = {
                "id": i,
                "requested_at": time.time_ns(),
                "command": command,
                "node": node,
                "requested_by": requested_by,
                "status": "pending",
                "result": "",
            }
            if len(self._rows) > 10_000:  # bounded: forget the oldest finished
                for k in [k for k, r in self._rows.items() if r["status"] != "pending"][:1000]:
                    del self._rows[k]
            return i

    def commands(self, status: str | None = None, ids: Sequence[int] = ()) -> list[dict[str, Any]]:
        with self._lock:
            rows = [dict(r) for _, r in sorted(self._rows.items())]
        return [
            r
            for r in rows
            if (status is None or r["status"] == status) and (not ids or r["id"] in ids)
        ]

    def finish_command(self, command_id: int, status: str, result: str) -> None:
        with self._lock:
            if command_id in self._rows:
                self._rows[command_id].update(status=status, result=result)


def apply_command(policy: DrainPolicy, command: str, node: str) -> tuple[str, str]:
    """Carry out one command on the policy: (status, result) with status done or refused."""
    if command == "approve":
        if policy.approve(node):
            return "done", f"drain of {node} approved"
        return "refused", f"no drain of {node} waits for approval"
    if command == "reject":
        if policy.reject(node):
            return "done", f"drain of {node} rejected"
        return "refused", f"no drain of {node} waits for approval"
    if command == "undrain":
        if policy.undrain(node):
            return "done", f"{node} returned to service"
        return "refused", f"{node} is not drained by rocewatch: never resumed by it"
    return "refused", f"unknown command {command!r}"


def apply_pending(
    policy: DrainPolicy,
    queues: Sequence[CommandQueue],
    accept: Callable[[str], bool] | None = None,
) -> int:
    """Apply every pending command of these queues, oldest first; return how many. With
    ``accept``, only the commands about the nodes it accepts (the others are left pending:
    a detect stage split by fabric domain leaves a node to its domain's policy)."""
    n = 0
    for q in queues:
        for c in q.commands(status="pending"):
            if accept is not None and not accept(c["node"]):
                continue
            status, result = apply_command(policy, c["command"], c["node"])
            q.finish_command(c["id"], status, result)
            log.warning(
                "operator %s: %s %s -> %s", c["requested_by"], c["command"], c["node"], result
            )
            n += 1
    return n


def pending_approvals(actions: Sequence[Action]) -> list[Action]:
    """Drains waiting for approval: a node whose latest drain record is ``pending-approval``."""
    last: dict[str, Action] = {}
    for a in actions:
        last[a.node] = a
    return [a for _, a in sorted(last.items()) if a.outcome == "pending-approval"]
