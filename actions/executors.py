"""Executors carry out the drain policy's decisions on a scheduler.

An executor answers with the outcome string that goes into the action record
(docs/formats.md section 7): ``done``, ``dry-run``, ``failed: <error>`` (worth retrying) or
``refused: <why>`` (final: e.g. the node was drained by someone else, whom rocewatch leaves alone).
Executors never raise for a scheduler's answer; the policy treats an exception as ``failed``.
"""

from __future__ import annotations

import logging
import re
import subprocess
from dataclasses import dataclass
from typing import Protocol

from rocewatch.core.errors import ConfigError

log = logging.getLogger(__name__)

# Every reason rocewatch writes starts with this, so its own drains can be told from others'.
REASON_PREFIX = "rocewatch:"
DRAINED_BY_OTHER = "refused: drained-by-other"


class Executor(Protocol):
    def drain(self, node: str, scheduler: str, reason: str) -> str:
        """Drain ``node`` on ``scheduler``; return the outcome."""
        ...

    def resume(self, node: str, scheduler: str) -> str:
        """Return a node rocewatch drained to service; return the outcome."""
        ...


class DryRunExecutor:
    """Executes nothing; remembers what it was asked, for tests and ``auto`` rehearsals."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, str, str]] = []

    def drain(self, node: str, scheduler: str, reason: str) -> str:
        self.calls.append(("drain", node, scheduler, reason))
        log.info("dry-run: would drain %s on %s: %s", node, scheduler, reason)
        return "dry-run"

    def resume(self, node: str, scheduler: str) -> str:
        self.calls.append(("resume", node, scheduler, ""))
        log.info("dry-run: would resume %s on %s", node, scheduler)
        return "dry-run"


@dataclass(frozen=True)
class SlurmConfig:
    scontrol: str = "scontrol"  # path or name on PATH
    timeout_s: float = 15.0  # per scontrol call

    def validate(self) -> None:
        if not self.scontrol:
            raise ConfigError("slurm: scontrol must name the scontrol binary")
        if self.timeout_s <= 0:
            raise ConfigError("slurm: timeout_s must be positive")


@dataclass(frozen=True)
class SlurmNode:
    """The part of ``scontrol show node -o`` that decides whether rocewatch may act."""

    state: str  # e.g. IDLE+DRAIN
    reason: str  # "" when none

    @property
    def drained(self) -> bool:
        # DRAIN (and DRAINING/DRAINED where a tool spells them so) all contain the flag name.
        return "DRAIN" in self.state.upper()

    @property
    def ours(self) -> bool:
        return self.reason.startswith(REASON_PREFIX)


_STATE = re.compile(r"(?:^|\s)State=(\S+)")
# Reason runs to the end of the line in Slurm 22.05, followed by " [user@time]".
_REASON = re.compile(r"(?:^|\s)Reason=(.*?)(?:\s+\[[^\]]*\])?\s*$")


def parse_show_node(line: str) -> SlurmNode | None:
    m = _STATE.search(line)
    if m is None:
        return None
    r = _REASON.search(line)
    reason = r.group(1).strip() if r else ""
    return SlurmNode(m.group(1), "" if reason == "(null)" else reason)


class SlurmBackend:
    """What every Slurm backend shares: read the node, then act only on what is ours.

    ``drain`` first reads the node: already drained by rocewatch -> ``done`` (a retry after a
    lost answer); drained by someone else -> ``refused: drained-by-other``. ``resume`` only
    undrains a node whose drain reason is rocewatch's. Backends supply ``_show`` and ``_update``.
    """

    name = "slurm"

    def drain(self, node: str, scheduler: str, reason: str) -> str:
        if scheduler != "slurm":
            return f"refused: {scheduler} node is not managed by Slurm"
        cur = self._show(node)
        if isinstance(cur, str):
            return cur
        if cur.drained:
            if cur.ours:
                return "done"
            log.info("slurm: %s is drained by someone else (%r): left alone", node, cur.reason)
            return DRAINED_BY_OTHER
        reason = _clean_reason(reason)
        err = self._update(node, "DRAIN", reason)
        if err:
            return err
        log.warning("%s: drained %s: %s", self.name, node, reason)
        return "done"

    def resume(self, node: str, scheduler: str) -> str:
        if scheduler != "slurm":
            return f"refused: {scheduler} node is not managed by Slurm"
        cur = self._show(node)
        if isinstance(cur, str):
            return cur
        if not cur.drained:
            return "done"  # someone already returned it to service
        if not cur.ours:
            log.info("slurm: %s is drained by someone else (%r): not resumed", node, cur.reason)
            return DRAINED_BY_OTHER
        err = self._update(node, "RESUME", "")
        if err:
            # A node whose slurmd never registered answers "Invalid node state specified" yet
            # loses the drain flag: what counts is the state afterwards.
            after = self._show(node)
            if isinstance(after, str) or after.drained:
                return err
        log.warning("%s: resumed %s", self.name, node)
        return "done"

    def _show(self, node: str) -> SlurmNode | str:
        raise NotImplementedError

    def _update(self, node: str, state: str, reason: str) -> str:
        """Set DRAIN (with ``reason``) or RESUME; '' on success, else the failed outcome."""
        raise NotImplementedError


class SlurmExecutor(SlurmBackend):
    """Drains and resumes Slurm nodes with ``scontrol``, leaving other people's drains alone."""

    name = "scontrol"

    def __init__(self, config: SlurmConfig | None = None) -> None:
        self.config = config or SlurmConfig()
        self.config.validate()

    def _update(self, node: str, state: str, reason: str) -> str:
        args = ["update", f"NodeName={node}", f"State={state}"]
        if reason:
            args.append(f"Reason={reason}")
        return self._run(args)

    def _show(self, node: str) -> SlurmNode | str:
        out = self._call(["show", "node", "-o", node])
        if out.startswith("failed:"):
            return out
        for line in out.splitlines():
            parsed = parse_show_node(line)
            if parsed is not None:
                return parsed
        return f"failed: no State in scontrol show node {node}"

    def _run(self, args: list[str]) -> str:
        """Run scontrol; '' on success, else the failed outcome."""
        out = self._call(args)
        return out if out.startswith("failed:") else ""

    def _call(self, args: list[str]) -> str:
        cmd = [self.config.scontrol, *args]
        try:
            p = subprocess.run(
                cmd, capture_output=True, text=True, timeout=self.config.timeout_s, check=False
            )
        except FileNotFoundError:
            return f"failed: {self.config.scontrol} not found"
        except subprocess.TimeoutExpired:
            return f"failed: scontrol {args[0]} timed out after {self.config.timeout_s:g}s"
        except OSError as e:
            return f"failed: {e.strerror or e}"
        if p.returncode != 0:
            lines = (p.stderr or p.stdout).strip().splitlines()
            return f"failed: {lines[0] if lines else f'scontrol exited {p.returncode}'}"
        return p.stdout


def _clean_reason(reason: str) -> str:
    # One argv element, no shell; still keep it one printable line, as Slurm shows it.
    reason = " ".join(reason.replace('"', "'").split())
    if not reason.startswith(REASON_PREFIX):
        reason = f"{REASON_PREFIX} {reason}"
    return reason[:200]
