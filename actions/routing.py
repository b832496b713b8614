"""Which executor acts on which scheduler, chosen by the ``executors`` section of the config.

```yaml
executors:
  slurm:
    backend: scontrol            # or slurmrestd (Slurm >= 23.02)
    scontrol: {timeout_s: 15}
    slurmrestd: {url: "https://slurm:6820", api_version: v0.0.41, user: rocewatch,
                 token: "${SLURM_JWT}"}
  kubernetes: {kubeconfig: /etc/rocewatch/kubeconfig, taint_effect: NoSchedule}
```

Without the section every scheduler gets ``scontrol`` for Slurm and nothing for Kubernetes (a
Kubernetes drain then fails softly with its reason). Executors are built lazily, on the first
drain of their scheduler, so a dry-run service never needs a kubeconfig.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from actions.executors import Executor, SlurmConfig, SlurmExecutor
from actions.kubernetes import KubernetesConfig
from actions.slurmrest import SlurmRestConfig
from rocewatch.core.errors import ConfigError

log = logging.getLogger(__name__)

SLURM_BACKENDS = ("scontrol", "slurmrestd")


@dataclass(frozen=True)
class ExecutorsConfig:
    slurm_backend: str = "scontrol"
    scontrol: SlurmConfig = field(default_factory=SlurmConfig)
    slurmrestd: SlurmRestConfig | None = None
    kubernetes: KubernetesConfig | None = None

    def validate(self) -> None:
        if self.slurm_backend not in SLURM_BACKENDS:
            raise ConfigError(f"executors.slurm.backend must be one of {', '.join(SLURM_BACKENDS)}")
        if self.slurm_backend == "slurmrestd" and self.slurmrestd is None:
            raise ConfigError("executors.slurm.backend slurmrestd needs executors.slurm.slurmrestd")
        self.scontrol.validate()
        for c in (self.slurmrestd, self.kubernetes):
            if c is not None:
                c.validate()

    @classmethod
    def from_dict(cls, d: Any, build: Any, where: str = "executors") -> ExecutorsConfig:
        """``build(cls, data, where)`` is the config loader's dataclass builder."""
        if d is None:
            return cls()
        if not isinstance(d, dict):
            raise ConfigError(f"{where}: must be a mapping")
        unknown = sorted(set(d) - {"slurm", "kubernetes"})
        if unknown:
            raise ConfigError(f"{where}.{unknown[0]}: unknown setting (known: kubernetes, slurm)")
        slurm = d.get("slurm") or {}
        if not isinstance(slurm, dict):
            raise ConfigError(f"{where}.slurm: must be a mapping")
        bad = sorted(set(slurm) - {"backend", "scontrol", "slurmrestd"})
        if bad:
            raise ConfigError(f"{where}.slurm.{bad[0]}: unknown setting")
        cfg = cls(
            slurm_backend=str(slurm.get("backend", "scontrol")),
            scontrol=build(SlurmConfig, slurm.get("scontrol"), f"{where}.slurm.scontrol"),
            slurmrestd=(
                build(SlurmRestConfig, slurm["slurmrestd"], f"{where}.slurm.slurmrestd")
                if slurm.get("slurmrestd") is not None
                else None
            ),
            kubernetes=(
                build(KubernetesConfig, d["kubernetes"], f"{where}.kubernetes")
                if d.get("kubernetes") is not None
                else None
            ),
        )
        cfg.validate()
        return cfg


class RoutingExecutor:
    """Sends each drain and resume to the executor of the node's scheduler."""

    def __init__(self, config: ExecutorsConfig, **prebuilt: Executor) -> None:
        config.validate()
        self.config = config
        self._by_scheduler: dict[str, Executor] = dict(prebuilt)

    def __getstate__(self) -> dict[str, Any]:
        # Checkpoints pickle the pipeline: keep the config, rebuild clients after a restart.
        return {"config": self.config, "_by_scheduler": {}}

    def _executor(self, scheduler: str) -> Executor | str:
        ex = self._by_scheduler.get(scheduler)
        if ex is not None:
            return ex
        if scheduler == "slurm":
            if self.config.slurm_backend == "slurmrestd":
                from actions.slurmrest import SlurmRestExecutor

                assert self.config.slurmrestd is not None
                ex = SlurmRestExecutor(self.config.slurmrestd)
            else:
                ex = SlurmExecutor(self.config.scontrol)
        elif scheduler == "kubernetes":
            if self.config.kubernetes is None:
                return "failed: no executors.kubernetes configured"
            from actions.kubernetes import KubernetesExecutor

            try:
                ex = KubernetesExecutor(self.config.kubernetes)
            except ConfigError as e:
                return f"failed: {e}"
        else:
            return f"refused: unknown scheduler {scheduler}"
        self._by_scheduler[scheduler] = ex
        return ex

    def drain(self, node: str, scheduler: str, reason: str) -> str:
        ex = self._executor(scheduler)
        return ex if isinstance(ex, str) else ex.drain(node, scheduler, reason)

    def resume(self, node: str, scheduler: str) -> str:
        ex = self._executor(scheduler)
        return ex if isinstance(ex, str) else ex.resume(node, scheduler)

    def watch(self, nodes_by_scheduler: dict[str, list[str]]) -> None:
        """Hand each executor that watches its nodes (Kubernetes: the healthy condition, the
        drains of an earlier run, uncordons by hand) the topology's nodes of its scheduler.
        Only a configured one is built: a failure is logged, never raised."""
        for scheduler, nodes in nodes_by_scheduler.items():
            if not nodes or scheduler != "kubernetes" or self.config.kubernetes is None:
                continue  # (only the Kubernetes executor watches nodes)
            ex = self._executor(scheduler)
            if isinstance(ex, str):
                log.error("%s nodes not watched: %s", scheduler, ex)
                continue
            watch = getattr(ex, "watch", None)
            if callable(watch):
                watch(nodes)

    def drain_states(self) -> dict[str, str]:
        """Each node's drain state, as the executors that have one report it."""
        out: dict[str, str] = {}
        for ex in self._by_scheduler.values():
            states = getattr(ex, "drain_states", None)
            if callable(states):
                out.update(states())
        return out

    def close(self) -> None:
        """Stop the executors' background work (an instance that hands its stage over)."""
        for ex in self._by_scheduler.values():
            close = getattr(ex, "close", None)
            if callable(close):
                close()
