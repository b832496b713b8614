"""The Kubernetes side of a detect stage's executors: the API client factory and the nodes its
executor watches (the healthy condition, drains of an earlier holder, uncordons by hand)."""

from __future__ import annotations

from typing import Any

from rocewatch.config import Config


def kube_api(cfg: Config) -> Any:
    """A CoreV1Api factory when Kubernetes is configured (built only when first needed)."""
    kcfg = cfg.executors.kubernetes
    if kcfg is None:
        return None

    def make() -> Any:
        from kubernetes import client

        from actions.kubernetes import api_client

        return client.CoreV1Api(api_client(kcfg))

    return make


def kube_nodes(topology: Any, domain: str | None) -> dict[str, list[str]]:
    """The topology's Kubernetes nodes (of ``domain`` when the stage runs one), for the
    executor that watches them."""
    return {
        "kubernetes": sorted(
            n
            for n in topology.nodes
            if topology.scheduler_of(n) == "kubernetes"
            and (domain is None or topology.domain_of(n) == domain)
        )
    }
