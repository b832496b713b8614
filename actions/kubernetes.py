"""Drains and resumes Kubernetes nodes with the official ``kubernetes`` client.

A drain, in the manner of node-problem-detector plus ``kubectl cordon``:

1. ``spec.unschedulable: true`` and the taint ``rocewatch.io/fabric-fault`` (``NoSchedule``, or
   ``NoExecute`` when configured: that evicts running pods, so it is off by default), with the
   annotation ``rocewatch.io/drained`` marking the cordon as rocewatch's. ``spec.taints`` is an
   atomic list (a patch replaces it whole), so the executor reads the node, sends the whole new
   list with the ``resourceVersion`` it read as a precondition, and on 409 Conflict reads again
   and retries: another writer's taints are never lost.
2. a Node condition ``FabricFault=True`` on the ``status`` subresource (strategic merge by
   ``type``, so the kubelet's own conditions are untouched);
3. a Warning Event on the Node.

Resume removes only rocewatch's taint, condition and annotation, and uncordons only a cordon
rocewatch made. A node cordoned by someone else is left alone (``refused: drained-by-other``).
Both are idempotent: a retry after a lost answer finds the work done and says ``done``, writing
only what the lost attempt left undone (no second Event, the condition's transition time kept).

Events about a Node (cluster-scoped) live in the ``default`` namespace: the API server answers
422 for any other, so ``event_namespace`` is checked at start-up.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import logging
from dataclasses import dataclass
from typing import Any

from actions.executors import DRAINED_BY_OTHER
from rocewatch.core.errors import ConfigError

log = logging.getLogger(__name__)

TAINT_KEY = "rocewatch.io/fabric-fault"
ANNOTATION = "rocewatch.io/drained"
CONDITION = "FabricFault"
MERGE = "application/merge-patch+json"
STRATEGIC = "application/strategic-merge-patch+json"
_ALREADY = "already"  # a patch builder's answer: the node is already as wanted


@dataclass(frozen=True)
class KubernetesConfig:
    kubeconfig: str | None = None  # a kubeconfig file; None: in-cluster service account
    context: str | None = None
    taint_effect: str = "NoSchedule"  # NoExecute also evicts running pods: the policy's call
    event_namespace: str = "default"
    conflict_retries: int = 5
    timeout_s: float = 15.0

    def validate(self) -> None:
        if self.taint_effect not in ("NoSchedule", "NoExecute"):
            raise ConfigError("kubernetes: taint_effect must be NoSchedule or NoExecute")
        if self.conflict_retries < 0:
            raise ConfigError("kubernetes: conflict_retries must not be negative")
        if self.timeout_s <= 0:
            raise ConfigError("kubernetes: timeout_s must be positive")
        if self.event_namespace != "default":
            # the API server refuses (422) an Event in another namespace about a cluster-scoped
            # object: every drain's Event would be lost
            raise ConfigError(
                'kubernetes: event_namespace must be "default" (the API server keeps Events '
                "about Nodes there only)"
            )


def api_client(cfg: KubernetesConfig) -> Any:
    """An ApiClient from a kubeconfig file or, without one, the in-cluster service account."""
    from kubernetes import client, config

    conf = client.Configuration()
    try:
        if cfg.kubeconfig:
            config.load_kube_config(cfg.kubeconfig, cfg.context, client_configuration=conf)
        else:
            config.load_incluster_config(client_configuration=conf)
    except config.ConfigException as e:
        raise ConfigError(f"kubernetes: {e}") from e
    return client.ApiClient(conf)


def _now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class KubernetesExecutor:
    """Cordon + taint + condition + Event; resume undoes only rocewatch's part."""

    def __init__(self, config: KubernetesConfig | None = None, client: Any = None) -> None:
        from kubernetes import client as k8s

        self.config = config or KubernetesConfig()
        self.config.validate()
        self.api = k8s.CoreV1Api(client if client is not None else api_client(self.config))

    # --- the Executor protocol -------------------------------------------------------------------
    def drain(self, node: str, scheduler: str, reason: str) -> str:
        if scheduler != "kubernetes":
            return f"refused: {scheduler} node is not managed by Kubernetes"
        seen: dict[str, Any] = {}
        try:
            outcome = self._with_retries(node, lambda n: self._drain_patch(n, reason, seen))
            if outcome == _ALREADY:
                # a retry after a lost answer: finish only what that attempt may have left
                if _condition(seen.get("node") or {}) != "True":
                    self._set_condition(node, "True", "RocewatchDrained", reason)
                return "done"
            if outcome != "done":
                return outcome
            self._set_condition(node, "True", "RocewatchDrained", reason)
            self._event(node, "FabricFaultDrain", reason)
        except Exception as e:
            return _failed(e)
        log.warning("kubernetes: drained %s: %s", node, reason)
        return "done"

    def resume(self, node: str, scheduler: str) -> str:
        if scheduler != "kubernetes":
            return f"refused: {scheduler} node is not managed by Kubernetes"
        seen: dict[str, Any] = {}
        try:
            outcome = self._with_retries(node, lambda n: self._resume_patch(n, seen))
            if outcome == _ALREADY:
                if _condition(seen.get("node") or {}) is not None:
                    self._delete_condition(node)
                return "done"
            if outcome != "done":
                return outcome
            self._delete_condition(node)
            self._event(node, "FabricFaultResume", "rocewatch: returned to service")
        except Exception as e:
            return _failed(e)
        log.warning("kubernetes: resumed %s", node)
        return "done"

    # --- patches -----------------------------------------------------------------------------
    def _with_retries(self, node: str, build: Any) -> str:
        """Read the node, build a patch (or an outcome), send it; on 409 read again."""
        from kubernetes.client.exceptions import ApiException

        for attempt in range(self.config.conflict_retries + 1):
            cur = self._read(node)
            patch = build(cur)
            if isinstance(patch, str):
                return patch
            try:
                self.api.patch_node(
                    node, patch, _content_type=MERGE, _request_timeout=self.config.timeout_s
                )
                return "done"
            except ApiException as e:
                if e.status != 409:
                    raise
                log.info("kubernetes: %s changed under us (attempt %d): re-read", node, attempt + 1)
        return f"failed: {node} kept changing ({self.config.conflict_retries + 1} conflicts)"

    def _read(self, node: str) -> dict[str, Any]:
        # The raw JSON, not the client's model: the patch is built from exactly what was read.
        resp: Any = self.api.read_node(
            node, _preload_content=False, _request_timeout=self.config.timeout_s
        )
        data: dict[str, Any] = json.loads(resp.data)
        return data

    def _drain_patch(
        self, cur: dict[str, Any], reason: str, seen: dict[str, Any]
    ) -> dict[str, Any] | str:
        seen["node"] = cur
        meta, spec = cur.get("metadata") or {}, cur.get("spec") or {}
        ours = ANNOTATION in (meta.get("annotations") or {})
        taints = list(spec.get("taints") or [])
        has_taint = any(t.get("key") == TAINT_KEY for t in taints)
        if spec.get("unschedulable") and not ours:
            log.info("kubernetes: %s is cordoned by someone else: left alone", meta.get("name"))
            return DRAINED_BY_OTHER
        if ours and spec.get("unschedulable") and has_taint:
            return _ALREADY  # a retry after a lost answer: already ours
        taints = [t for t in taints if t.get("key") != TAINT_KEY]
        taints.append({"key": TAINT_KEY, "value": "true", "effect": self.config.taint_effect})
        return {
            "metadata": {
                "resourceVersion": meta.get("resourceVersion"),
                "annotations": {ANNOTATION: f"{_now()} {reason}"[:250]},
            },
            "spec": {"unschedulable": True, "taints": taints},
        }

    def _resume_patch(self, cur: dict[str, Any], seen: dict[str, Any]) -> dict[str, Any] | str:
        seen["node"] = cur
        meta, spec = cur.get("metadata") or {}, cur.get("spec") or {}
        ours = ANNOTATION in (meta.get("annotations") or {})
        taints = list(spec.get("taints") or [])
        kept = [t for t in taints if t.get("key") != TAINT_KEY]
        if not ours:
            if spec.get("unschedulable"):
                log.info(
                    "kubernetes: %s is cordoned by someone else: not resumed", meta.get("name")
                )
                return DRAINED_BY_OTHER
            if len(kept) == len(taints):
                return _ALREADY  # nothing of ours left: someone already returned it
        patch: dict[str, Any] = {
            "metadata": {"resourceVersion": meta.get("resourceVersion"), "annotations": {}},
            "spec": {"taints": kept or None},
        }
        if ours:
            patch["metadata"]["annotations"][ANNOTATION] = None
            patch["spec"]["unschedulable"] = None
        return patch

    def _set_condition(self, node: str, status: str, reason: str, message: str) -> None:
        now = _now()
        cond = {
            "type": CONDITION,
            "status": status,
            "reason": reason,
            "message": message,
            "lastHeartbeatTime": now,
            "lastTransitionTime": now,
        }
        self.api.patch_node_status(
            node,
            {"status": {"conditions": [cond]}},
            _content_type=STRATEGIC,
            _request_timeout=self.config.timeout_s,
        )

    def _delete_condition(self, node: str) -> None:
        self.api.patch_node_status(
            node,
            {"status": {"conditions": [{"type": CONDITION, "$patch": "delete"}]}},
            _content_type=STRATEGIC,
            _request_timeout=self.config.timeout_s,
        )

    def _event(self, node: str, reason: str, message: str) -> None:
        """An Event on the Node; losing one must not undo a drain, so failures are logged."""
        from kubernetes.client.exceptions import ApiException

        now = _now()
        ev: Any = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {
                "generateName": f"{node}.rocewatch.",
                "namespace": self.config.event_namespace,
            },
            "involvedObject": {"kind": "Node", "name": node, "uid": node, "apiVersion": "v1"},
            "reason": reason,
            "message": message,
            "type": "Warning",
            "source": {"component": "rocewatch", "host": node},
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
            "reportingComponent": "rocewatch",
        }
        try:
            self.api.create_namespaced_event(
                self.config.event_namespace, ev, _request_timeout=self.config.timeout_s
            )
        except ApiException as e:
            log.error("kubernetes: event on %s not recorded: %s %s", node, e.status, e.reason)


def _condition(node: dict[str, Any]) -> str | None:
    """The status of rocewatch's condition on a node as read, None without one."""
    for c in (node.get("status") or {}).get("conditions") or []:
        if isinstance(c, dict) and c.get("type") == CONDITION:
            return str(c.get("status"))
    return None


def _failed(e: Exception) -> str:
    from kubernetes.client.exceptions import ApiException

    if isinstance(e, ApiException):
        detail = e.reason or ""
        with contextlib.suppress(ValueError, AttributeError):
            detail = json.loads(e.body or "{}").get("message") or detail
        return f"failed: kubernetes {e.status}: {detail}"
    return f"failed: {type(e).__name__}: {e}"
