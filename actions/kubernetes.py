"""Drains and resumes Kubernetes nodes with the official ``kubernetes`` client.

A drain, in the manner of ``kubectl drain`` (and draino, NVSentinel) plus node-problem-detector:

1. the cordon: ``spec.unschedulable: true`` and the taint ``rocewatch.io/fabric-fault``
   (``NoSchedule``, or ``NoExecute`` when configured: that makes the kubelet kill every pod
   without a toleration at once, budgets or not, so it is off by default), with ownership marks
   saying rocewatch cordoned the node and why: the label ``rocewatch.io/cordoned-by=rocewatch``
   and the annotations ``rocewatch.io/drained`` (``<time> <reason>``) and
   ``rocewatch.io/drain-state``. ``spec.taints`` is an atomic list (a patch replaces it whole),
   so the executor reads the node, sends the whole new list with the ``resourceVersion`` it read
   as a precondition, and on 409 Conflict reads again and retries: another writer's taints are
   never lost.
2. the Node condition ``RoCEFabricProblem`` with node-problem-detector's polarity: ``True`` with
   the fault's reason (the alert's name, e.g. ``PFCStorm``) while rocewatch holds the node,
   ``False`` with the reason ``RoCEFabricIsHealthy`` otherwise; ``watch()`` sets it ``False`` on
   every node rocewatch watches and has not drained. Written on the ``status`` subresource by a
   strategic merge by ``type``, so the kubelet's own conditions are untouched.
3. a Warning Event on the Node.
4. the eviction (``evict``, on by default): every pod bound to the node is evicted through the
   Eviction API (``policy/v1``, the ``pods/eviction`` subresource), which honours
   PodDisruptionBudgets, except DaemonSet pods (their controller ignores the cordon and would
   put them back), mirror pods (annotation ``kubernetes.io/config.mirror``: the kubelet's static
   pods, which the API cannot delete) and pods of ``skip_namespaces``. Each eviction carries
   ``grace_period_s`` (None: each pod's own ``terminationGracePeriodSeconds``). An eviction a
   budget forbids is answered 429: the drain backs off (``backoff_s``, doubling up to
   ``backoff_max_s``) and tries again, reporting ``blocked by PodDisruptionBudget <name>`` (the
   name from the answer's ``DisruptionBudget`` cause). Past ``drain_timeout_s`` the drain is
   reported ``stuck after <timeout>`` and keeps trying at ``backoff_max_s``; it is never forced
   (pods deleted past their budgets) unless ``force_after_timeout`` is set.

``drain()`` does steps 1-3 and returns at once (its calls are bounded by ``timeout_s`` each):
the policy calls it inside the detector's step loop, which must not wait for pods to go. The
evictions run on the executor's one background thread, node after node, a few API calls each
pass; their state (``evicting``, ``blocked by PodDisruptionBudget <name>``, ``done``,
``stuck after <timeout>``) is ``drain_state(node)``, the node's ``rocewatch.io/drain-state``
annotation, an Event at each change and a log line.

A manual uncordon (``kubectl uncordon`` of a node rocewatch cordoned: its annotation still there,
``spec.unschedulable`` gone) is noticed by the background thread (each eviction pass, and every
``watch_interval_s`` for the nodes rocewatch holds), by ``drain()`` and by ``resume()``: rocewatch
stops evicting, removes its taint (the operator wants the node schedulable, so rocewatch does not
fight them), records the annotation ``rocewatch.io/uncordoned-by-hand``, the state ``uncordoned
by hand``, a Warning Event ``RoCEFabricUncordonedByHand``, a log line and the counter
``counts["uncordoned_by_hand"]``, and never cordons that node again until rocewatch has returned
it (``resume()``, whose outcome is then ``refused: uncordoned-by-operator``; ``drain()`` answers
the same meanwhile).

Resume removes only rocewatch's taint, label and annotations, sets the condition ``False`` and
uncordons only a cordon rocewatch made. A node cordoned by someone else is left alone
(``refused: drained-by-other``). Both are idempotent: a retry after a lost answer finds the work
done and says ``done``, writing only what the lost attempt left undone (no second Event, the
condition's transition time kept).

Events about a Node (cluster-scoped) live in the ``default`` namespace: the API server answers
422 for any other, so ``event_namespace`` is checked at start-up.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import logging
import re
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from actions.executors import DRAINED_BY_OTHER
from rocewatch.core.errors import ConfigError

log = logging.getLogger(__name__)

TAINT_KEY = "rocewatch.io/fabric-fault"
ANNOTATION = "rocewatch.io/drained"  # "<time> <reason>": rocewatch cordoned this node, and why
STATE_ANNOTATION = "rocewatch.io/drain-state"
UNCORDONED_ANNOTATION = "rocewatch.io/uncordoned-by-hand"  # "<time>" the uncordon was noticed
OWNER_LABEL = "rocewatch.io/cordoned-by"
OWNER = "rocewatch"
CONDITION = "RoCEFabricProblem"
HEALTHY_REASON = "RoCEFabricIsHealthy"
FAULT_REASON = "RoCEFabricFault"  # when the drain's reason names no alert
MIRROR_ANNOTATION = "kubernetes.io/config.mirror"
UNCORDONED_BY_OPERATOR = "refused: uncordoned-by-operator"
MERGE = "application/merge-patch+json"
STRATEGIC = "application/strategic-merge-patch+json"
_ALREADY = "already"  # a patch builder's answer: the node is already as wanted

# drain states
EVICTING = "evicting"
DONE = "done"
UNCORDONED = "uncordoned by hand"
_BLOCKED = "blocked by PodDisruptionBudget "
_STUCK = "stuck after "
_PDB_CAUSE = re.compile(r"disruption budget (\S+)")
_REASON_WORD = re.compile(r"[A-Za-z][A-Za-z0-9]*")


@dataclass(frozen=True)
class KubernetesConfig:
    kubeconfig: str | None = None  # a kubeconfig file; None: in-cluster service account
    context: str | None = None
    taint_effect: str = "NoSchedule"  # NoExecute kills pods at once, past their budgets
    event_namespace: str = "default"
    conflict_retries: int = 5
    timeout_s: float = 15.0
    evict: bool = True  # after the cordon, evict the node's pods (Eviction API, policy/v1)
    skip_namespaces: tuple[str, ...] = ()  # pods in these namespaces are never evicted
    grace_period_s: int | None = None  # each eviction's grace period; null: the pod's own
    drain_timeout_s: float = 900.0  # pods still there after this: "stuck after <timeout>"
    backoff_s: float = 5.0  # wait after an eviction a budget forbids (429); doubles
    backoff_max_s: float = 60.0  # the longest wait between eviction passes
    force_after_timeout: bool = False  # delete the pods left at the timeout, past their budgets
    watch_interval_s: float = 30.0  # how often the nodes rocewatch holds are checked

    def validate(self) -> None:
        if self.taint_effect not in ("NoSchedule", "NoExecute"):
            raise ConfigError("kubernetes: taint_effect must be NoSchedule or NoExecute")
        if self.conflict_retries < 0:
            raise ConfigError("kubernetes: conflict_retries must not be negative")
        for name in ("timeout_s", "drain_timeout_s", "backoff_s", "backoff_max_s"):
            if not getattr(self, name) > 0:
                raise ConfigError(f"kubernetes: {name} must be positive")
        if not self.watch_interval_s > 0:
            raise ConfigError("kubernetes: watch_interval_s must be positive")
        if self.backoff_max_s < self.backoff_s:
            raise ConfigError("kubernetes: backoff_max_s must be at least backoff_s")
        if self.grace_period_s is not None and (
            isinstance(self.grace_period_s, bool)
            or not isinstance(self.grace_period_s, int)
            or self.grace_period_s < 0
        ):
            raise ConfigError("kubernetes: grace_period_s must be a whole number >= 0 or null")
        if isinstance(self.skip_namespaces, str) or not all(
            isinstance(n, str) and n for n in self.skip_namespaces
        ):
            raise ConfigError("kubernetes: skip_namespaces must be a list of namespace names")
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


def fault_reason(reason: str) -> str:
    """The condition's reason for a drain: the alert's name ("rocewatch: PFCStorm origin ...")."""
    words = reason.removeprefix("rocewatch:").split()
    if words and _REASON_WORD.fullmatch(words[0]):
        return words[0]
    return FAULT_REASON


def stuck(timeout_s: float) -> str:
    return f"{_STUCK}{timeout_s:g}s"


@dataclass
class _Drain:
    """An eviction under way on the background thread."""

    node: str
    deadline: float  # monotonic
    state: str = EVICTING
    next_at: float = 0.0
    backoff: float = 0.0
    blocked_by: set[str] = field(default_factory=set)  # budgets already reported by an Event
    evicted: int = 0


class KubernetesExecutor:
    """Cordon + taint + condition + Event, then evictions in the background; resume undoes only
    rocewatch's part."""

    def __init__(self, config: KubernetesConfig | None = None, client: Any = None) -> None:
        from kubernetes import client as k8s

        self.config = config or KubernetesConfig()
        self.config.validate()
        self.api = k8s.CoreV1Api(client if client is not None else api_client(self.config))
        self.counts: dict[str, int] = {
            "evicted": 0,
            "blocked": 0,
            "stuck": 0,
            "forced": 0,
            "uncordoned_by_hand": 0,
        }
        self._lock = threading.Lock()
        self._busy = threading.Lock()  # held by the background thread during one node's work
        self._wake = threading.Condition(self._lock)
        self._drains: dict[str, _Drain] = {}  # evictions under way
        self._held: dict[str, str] = {}  # nodes rocewatch cordoned -> their last drain state
        self._watched: list[str] = []  # nodes whose condition is still to be set healthy
        self._next_check = 0.0
        self._thread: threading.Thread | None = None
        self._closed = False

    # --- the Executor protocol -------------------------------------------------------------------
    def drain(self, node: str, scheduler: str, reason: str) -> str:
        if scheduler != "kubernetes":
            return f"refused: {scheduler} node is not managed by Kubernetes"
        # not beside the background thread's work on a node (a watch pass setting the healthy
        # condition it read before this cordon): it takes a few calls at most
        busy = self._busy.acquire(timeout=self.config.timeout_s)
        try:
            return self._drain(node, reason)
        finally:
            if busy:
                self._busy.release()

    def _drain(self, node: str, reason: str) -> str:
        seen: dict[str, Any] = {}
        try:
            outcome = self._with_retries(node, lambda n: self._drain_patch(n, reason, seen))
            if outcome == UNCORDONED_BY_OPERATOR:
                self._uncordoned(node, seen.get("node") or {})
                return outcome
            if outcome == _ALREADY:
                # a retry after a lost answer: finish only what that attempt may have left
                if _condition(seen.get("node") or {}) != "True":
                    self._set_condition(node, "True", fault_reason(reason), reason)
                self._track(node, _annotations(seen.get("node") or {}).get(STATE_ANNOTATION))
                return "done"
            if outcome != "done":
                return outcome
            self._set_condition(node, "True", fault_reason(reason), reason)
            self._event(node, "FabricFaultDrain", reason)
        except Exception as e:
            return _failed(e)
        log.warning("kubernetes: drained %s: %s", node, reason)
        self._track(node, EVICTING if self.config.evict else DONE)
        return "done"

    def resume(self, node: str, scheduler: str) -> str:
        if scheduler != "kubernetes":
            return f"refused: {scheduler} node is not managed by Kubernetes"
        # no eviction once rocewatch returns the node: wait for a pass under way (a few calls)
        busy = self._busy.acquire(timeout=self.config.timeout_s)
        try:
            with self._lock:
                self._drains.pop(node, None)
        finally:
            if busy:
                self._busy.release()
        seen: dict[str, Any] = {}
        try:
            cur = self._read(node)
            if _ours(cur) and not _unschedulable(cur):
                self._uncordoned(node, cur)
                uncordoned = True
            else:
                uncordoned = _ours(cur) and UNCORDONED_ANNOTATION in _annotations(cur)
            outcome = self._with_retries(node, lambda n: self._resume_patch(n, seen))
            if outcome == _ALREADY:
                if _condition(seen.get("node") or {}) != "False":
                    self._set_condition(node, "False", HEALTHY_REASON, "rocewatch: no fault")
                outcome = "done"
            elif outcome == "done":
                self._set_condition(node, "False", HEALTHY_REASON, "rocewatch: no fault")
                if not uncordoned:
                    self._event(node, "FabricFaultResume", "rocewatch: returned to service")
            if outcome != "done":
                return outcome
        except Exception as e:
            return _failed(e)
        with self._lock:
            self._held.pop(node, None)
        if uncordoned:
            log.warning("kubernetes: %s was uncordoned by hand; rocewatch's marks removed", node)
            return UNCORDONED_BY_OPERATOR
        log.warning("kubernetes: resumed %s", node)
        return "done"

    # --- what runs beside the step loop ----------------------------------------------------------
    def watch(self, nodes: Iterable[str]) -> None:
        """Watch these nodes (the topology's Kubernetes nodes): in the background, set the
        condition ``False``/healthy on each one rocewatch has not drained, take back the drains
        of an earlier run (evictions unfinished, uncordons by hand), and keep checking the nodes
        rocewatch holds every ``watch_interval_s``."""
        with self._lock:
            self._watched.extend(n for n in nodes if n not in self._watched)
        self._kick()

    def drain_state(self, node: str) -> str | None:
        """``evicting``, ``blocked by PodDisruptionBudget <name>``, ``done``, ``stuck after
        <timeout>``, ``uncordoned by hand``; None for a node rocewatch does not hold."""
        with self._lock:
            d = self._drains.get(node)
            return d.state if d is not None else self._held.get(node)

    def drain_states(self) -> dict[str, str]:
        with self._lock:
            out = dict(self._held)
            out.update({n: d.state for n, d in self._drains.items()})
            return dict(sorted(out.items()))

    def close(self) -> None:
        """Stop the background thread (evictions under way stop where they are)."""
        with self._lock:
            self._closed = True
            self._wake.notify_all()
        t = self._thread
        if t is not None and t is not threading.current_thread():
            t.join(self.config.timeout_s * 2)

    def _track(self, node: str, state: str | None) -> None:
        unfinished = state in (EVICTING, None) or (state or "").startswith((_BLOCKED, _STUCK))
        with self._lock:
            if node in self._drains:
                pass  # under way already
            elif unfinished and self.config.evict:
                # (a drain of an earlier run resumes with a whole timeout)
                self._drains[node] = _Drain(node, time.monotonic() + self.config.drain_timeout_s)
                self._held[node] = EVICTING
            else:
                self._held[node] = DONE if unfinished else str(state)
        self._kick()

    def _kick(self) -> None:
        with self._lock:
            if self._closed:
                return
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._run, name="rocewatch-k8s-drain", daemon=True
                )
                self._thread.start()
            self._wake.notify_all()

    def _run(self) -> None:
        while True:
            with self._lock:
                if self._closed:
                    return
                now = time.monotonic()
                due = [d.node for d in self._drains.values() if d.next_at <= now]
                watched, self._watched = self._watched, []
                check = now >= self._next_check and bool(self._held)
                if check:
                    self._next_check = now + self.config.watch_interval_s
            for node in watched:
                self._guarded(self._watch_one, node)
            for node in due:
                self._guarded(self._evict_pass, node)
            if check:
                for node in list(self._held):
                    if node not in self._drains and self._held.get(node) != UNCORDONED:
                        self._guarded(self._check_held, node)
            with self._lock:
                if self._closed:
                    return
                if self._watched:
                    continue
                now = time.monotonic()
                waits = [d.next_at - now for d in self._drains.values()]
                if self._held:
                    waits.append(self._next_check - now)
                if not waits:
                    self._wake.wait()  # until a drain or watch() kicks
                elif min(waits) > 0:
                    self._wake.wait(min(waits))

    def _guarded(self, fn: Any, node: str) -> None:
        """One node's work; an API error is logged and tried again later, never fatal."""
        try:
            with self._busy:
                if not self._closed:
                    fn(node)
        except Exception as e:
            log.error("kubernetes: background work on %s failed: %s", node, _failed(e))
            with self._lock:
                d = self._drains.get(node)
                if d is not None:
                    d.next_at = time.monotonic() + self.config.backoff_s

    def _watch_one(self, node: str) -> None:
        from kubernetes.client.exceptions import ApiException

        try:
            cur = self._read(node)
        except ApiException as e:
            if e.status == 404:
                log.info("kubernetes: watched node %s does not exist", node)
                return
            raise
        if _ours(cur):
            with self._lock:
                if node in self._drains or node in self._held:
                    return
            state = _annotations(cur).get(STATE_ANNOTATION)
            if not _unschedulable(cur) or UNCORDONED_ANNOTATION in _annotations(cur):
                self._uncordoned(node, cur)
                return
            log.info("kubernetes: %s was drained by an earlier run (%s): taken back", node, state)
            self._track(node, state)
            return
        status = _condition(cur)
        if status != "False" or _condition_reason(cur) != HEALTHY_REASON:
            self._set_condition(node, "False", HEALTHY_REASON, "rocewatch: no fault")

    def _check_held(self, node: str) -> None:
        cur = self._read(node)
        if _ours(cur) and not _unschedulable(cur):
            self._uncordoned(node, cur)

    # --- evictions ------------------------------------------------------------------------------
    def _evict_pass(self, node: str) -> None:
        """One pass: evict what is left on the node and record the drain's state."""
        with self._lock:
            d = self._drains.get(node)
        if d is None:
            return
        cur = self._read(node)
        if not _ours(cur) or not _unschedulable(cur):
            if _ours(cur):
                self._uncordoned(node, cur)
            else:  # returned meanwhile (resume): nothing to evict for
                with self._lock:
                    self._drains.pop(node, None)
            return
        pods = self._pods(node)
        if not pods:
            self._finish(d, f"rocewatch: every pod evicted ({d.evicted} by this drain)")
            return
        cfg = self.config
        blocked = ""
        refused = False  # another answer than 429 (logged): backed off like a budget
        late = time.monotonic() >= d.deadline
        for pod in pods:
            meta = pod.get("metadata") or {}
            if meta.get("deletionTimestamp"):
                continue  # evicted, terminating: waited for
            if late and cfg.force_after_timeout:
                if self._delete_pod(meta):
                    self.counts["forced"] += 1
                else:
                    refused = True
                continue
            budget = self._evict(meta)
            if budget is None:
                d.evicted += 1
                self.counts["evicted"] += 1
            elif budget:
                blocked = blocked or budget
            else:
                refused = True
        if late and d.state[: len(_STUCK)] != _STUCK:
            state = stuck(cfg.drain_timeout_s)
            self.counts["stuck"] += 1
            log.error("kubernetes: drain of %s %s (%d pods left)", node, state, len(pods))
            self._event(
                node,
                "RoCEFabricDrainStuck",
                f"rocewatch: drain {state}, {len(pods)} pods left"
                + (f", blocked by PodDisruptionBudget {blocked}" if blocked else "")
                + ("; forced" if cfg.force_after_timeout else "; not forced"),
            )
        elif late:
            state = d.state
        elif blocked:
            state = f"{_BLOCKED}{blocked}"
            if blocked not in d.blocked_by:
                d.blocked_by.add(blocked)
                self.counts["blocked"] += 1
                log.warning("kubernetes: drain of %s %s", node, state)
                self._event(node, "RoCEFabricDrainBlocked", f"rocewatch: drain {state}")
        else:
            state = EVICTING
        self._set_state(d, state)
        with self._lock:
            if blocked or refused or late:
                d.backoff = min(max(d.backoff * 2, cfg.backoff_s), cfg.backoff_max_s)
            else:
                d.backoff = 0.0
            # pods terminating: look again soon (a kubelet answers within their grace period)
            d.next_at = time.monotonic() + (d.backoff or min(1.0, cfg.backoff_s))

    def _pods(self, node: str) -> list[dict[str, Any]]:
        """The pods on ``node`` a drain evicts (DaemonSet, mirror and skipped ones left)."""
        resp: Any = self.api.list_pod_for_all_namespaces(
            field_selector=f"spec.nodeName={node}",
            _preload_content=False,
            _request_timeout=self.config.timeout_s,
        )
        out = []
        for pod in json.loads(resp.data).get("items") or []:
            meta = pod.get("metadata") or {}
            if meta.get("namespace") in self.config.skip_namespaces:
                continue
            if MIRROR_ANNOTATION in (meta.get("annotations") or {}):
                continue
            if any(
                r.get("kind") == "DaemonSet" and r.get("controller")
                for r in meta.get("ownerReferences") or []
            ):
                continue
            out.append(pod)
        return out

    def _evict(self, meta: dict[str, Any]) -> str | None:
        """Evict one pod: None when accepted (or gone), the blocking budget's name on 429,
        "" on another refusal (logged; tried again next pass)."""
        from kubernetes.client.exceptions import ApiException

        name, ns = meta.get("name", ""), meta.get("namespace", "")
        body: Any = {
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": name, "namespace": ns},
        }
        if self.config.grace_period_s is not None:
            body["deleteOptions"] = {"gracePeriodSeconds": self.config.grace_period_s}
        try:
            self.api.create_namespaced_pod_eviction(
                name, ns, body, _preload_content=False, _request_timeout=self.config.timeout_s
            )
        except ApiException as e:
            if e.status == 404:
                return None  # gone already
            if e.status == 429:
                return _budget_name(e.body) or "(unnamed)"
            log.warning("kubernetes: eviction of %s/%s refused: %s", ns, name, _failed(e))
            return ""
        log.info("kubernetes: evicted %s/%s", ns, name)
        return None

    def _delete_pod(self, meta: dict[str, Any]) -> bool:
        """Delete one pod past its budget (force_after_timeout); False if refused (logged)."""
        from kubernetes.client.exceptions import ApiException

        name, ns = meta.get("name", ""), meta.get("namespace", "")
        body: Any = {}
        if self.config.grace_period_s is not None:
            body["gracePeriodSeconds"] = self.config.grace_period_s
        try:
            self.api.delete_namespaced_pod(
                name, ns, body=body, _preload_content=False, _request_timeout=self.config.timeout_s
            )
            log.error("kubernetes: deleted %s/%s past its budget (force_after_timeout)", ns, name)
        except ApiException as e:
            if e.status != 404:
                log.error("kubernetes: forced deletion of %s/%s refused: %s", ns, name, _failed(e))
                return False
        return True

    # A state is recorded on the node (and its Event written) before drain_state() says it.
    def _set_state(self, d: _Drain, state: str) -> None:
        if state == d.state and d.next_at:
            return
        with self._lock:
            if d.node not in self._drains:
                return  # returned meanwhile
        self._annotate(d.node, {STATE_ANNOTATION: state})
        with self._lock:
            d.state = state
            if d.node in self._drains:
                self._held[d.node] = state

    def _finish(self, d: _Drain, message: str) -> None:
        with self._lock:
            if d.node not in self._drains:
                return
        self._annotate(d.node, {STATE_ANNOTATION: DONE})
        log.warning("kubernetes: drain of %s done (%d pods evicted)", d.node, d.evicted)
        self._event(d.node, "RoCEFabricDrainDone", message, "Normal")
        with self._lock:
            if self._drains.pop(d.node, None) is not None:
                d.state = DONE
                self._held[d.node] = DONE

    def _uncordoned(self, node: str, cur: dict[str, Any]) -> None:
        """Someone uncordoned a node rocewatch cordoned: record it once, step back."""
        with self._lock:
            self._drains.pop(node, None)  # no more evictions
        try:
            self._record_uncordon(node, cur)
        finally:
            with self._lock:
                self._held[node] = UNCORDONED

    def _record_uncordon(self, node: str, cur: dict[str, Any]) -> None:
        if UNCORDONED_ANNOTATION in _annotations(cur):
            return  # recorded already
        self.counts["uncordoned_by_hand"] += 1
        log.warning(
            "kubernetes: %s, cordoned by rocewatch (%s), was uncordoned by hand: rocewatch stops "
            "evicting, removes its taint and does not cordon it again",
            node,
            _annotations(cur).get(ANNOTATION, ""),
        )
        outcome = self._with_retries(node, self._uncordoned_patch)
        if outcome not in ("done", _ALREADY):
            log.error("kubernetes: %s: the uncordon by hand not recorded: %s", node, outcome)
            return
        self._event(
            node,
            "RoCEFabricUncordonedByHand",
            "rocewatch: the node rocewatch cordoned was uncordoned by hand; rocewatch stops "
            "evicting and leaves it schedulable",
        )

    def _uncordoned_patch(self, cur: dict[str, Any]) -> dict[str, Any] | str:
        meta, spec = cur.get("metadata") or {}, cur.get("spec") or {}
        if UNCORDONED_ANNOTATION in _annotations(cur):
            return _ALREADY
        taints = list(spec.get("taints") or [])
        kept = [t for t in taints if t.get("key") != TAINT_KEY]
        patch: dict[str, Any] = {
            "metadata": {
                "resourceVersion": meta.get("resourceVersion"),
                "annotations": {UNCORDONED_ANNOTATION: _now(), STATE_ANNOTATION: UNCORDONED},
            },
        }
        if len(kept) != len(taints):
            patch["spec"] = {"taints": kept or None}
        return patch

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

    def _annotate(self, node: str, annotations: dict[str, str | None]) -> None:
        """Annotations only (a merge of the map: no precondition needed)."""
        self.api.patch_node(
            node,
            {"metadata": {"annotations": annotations}},
            _content_type=MERGE,
            _request_timeout=self.config.timeout_s,
        )

    def _drain_patch(
        self, cur: dict[str, Any], reason: str, seen: dict[str, Any]
    ) -> dict[str, Any] | str:
        seen["node"] = cur
        meta, spec = cur.get("metadata") or {}, cur.get("spec") or {}
        ours = _ours(cur)
        taints = list(spec.get("taints") or [])
        has_taint = any(t.get("key") == TAINT_KEY for t in taints)
        if spec.get("unschedulable") and not ours:
            log.info("kubernetes: %s is cordoned by someone else: left alone", meta.get("name"))
            return DRAINED_BY_OTHER
        if ours and (not spec.get("unschedulable") or UNCORDONED_ANNOTATION in _annotations(cur)):
            # rocewatch's cordon, lifted by hand: not cordoned again until rocewatch returns it
            return UNCORDONED_BY_OPERATOR
        if ours and spec.get("unschedulable") and has_taint:
            return _ALREADY  # a retry after a lost answer: already ours
        taints = [t for t in taints if t.get("key") != TAINT_KEY]
        taints.append({"key": TAINT_KEY, "value": "true", "effect": self.config.taint_effect})
        return {
            "metadata": {
                "resourceVersion": meta.get("resourceVersion"),
                "labels": {OWNER_LABEL: OWNER},
                "annotations": {
                    ANNOTATION: f"{_now()} {reason}"[:250],
                    STATE_ANNOTATION: EVICTING if self.config.evict else DONE,
                },
            },
            "spec": {"unschedulable": True, "taints": taints},
        }

    def _resume_patch(self, cur: dict[str, Any], seen: dict[str, Any]) -> dict[str, Any] | str:
        seen["node"] = cur
        meta, spec = cur.get("metadata") or {}, cur.get("spec") or {}
        ours = _ours(cur)
        taints = list(spec.get("taints") or [])
        kept = [t for t in taints if t.get("key") != TAINT_KEY]
        labels = meta.get("labels") or {}
        if not ours:
            if spec.get("unschedulable"):
                log.info(
                    "kubernetes: %s is cordoned by someone else: not resumed", meta.get("name")
                )
                return DRAINED_BY_OTHER
            if len(kept) == len(taints) and OWNER_LABEL not in labels:
                return _ALREADY  # nothing of ours left: someone already returned it
        patch: dict[str, Any] = {
            "metadata": {
                "resourceVersion": meta.get("resourceVersion"),
                "annotations": {},
                "labels": {OWNER_LABEL: None},
            },
            "spec": {"taints": kept or None},
        }
        if ours:
            for key in (ANNOTATION, STATE_ANNOTATION, UNCORDONED_ANNOTATION):
                patch["metadata"]["annotations"][key] = None
            if UNCORDONED_ANNOTATION not in _annotations(cur):
                # (after an uncordon by hand, a cordon is someone else's again)
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

    def _event(self, node: str, reason: str, message: str, kind: str = "Warning") -> None:
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
            "type": kind,
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


def _annotations(node: dict[str, Any]) -> dict[str, str]:
    return dict((node.get("metadata") or {}).get("annotations") or {})


def _ours(node: dict[str, Any]) -> bool:
    """rocewatch cordoned this node (its annotation is there)."""
    return ANNOTATION in _annotations(node)


def _unschedulable(node: dict[str, Any]) -> bool:
    return bool((node.get("spec") or {}).get("unschedulable"))


def _find_condition(node: dict[str, Any]) -> dict[str, Any] | None:
    for c in (node.get("status") or {}).get("conditions") or []:
        if isinstance(c, dict) and c.get("type") == CONDITION:
            return c
    return None


def _condition(node: dict[str, Any]) -> str | None:
    """The status of rocewatch's condition on a node as read, None without one."""
    c = _find_condition(node)
    return None if c is None else str(c.get("status"))


def _condition_reason(node: dict[str, Any]) -> str | None:
    c = _find_condition(node)
    return None if c is None else str(c.get("reason"))


def _budget_name(body: Any) -> str:
    """The PodDisruptionBudget a 429 names, "" if none: the Status's ``DisruptionBudget``
    cause says "The disruption budget <name> needs 2 healthy pods and has 2 currently" (or "...
    <name> is still being processed by the server." before the disruption controller saw it)."""
    try:
        status = json.loads(body or "{}")
    except (TypeError, ValueError):
        return ""
    if not isinstance(status, dict):
        return ""
    for cause in (status.get("details") or {}).get("causes") or []:
        # (a StatusCause's type is spelled "reason" in JSON)
        if isinstance(cause, dict) and cause.get("reason") == "DisruptionBudget":
            m = _PDB_CAUSE.search(str(cause.get("message") or ""))
            if m:
                return m.group(1)
    return ""


def _failed(e: Exception) -> str:
    from kubernetes.client.exceptions import ApiException

    if isinstance(e, ApiException):
        detail = e.reason or ""
        with contextlib.suppress(ValueError, AttributeError):
            detail = json.loads(e.body or "{}").get("message") or detail
        return f"failed: kubernetes {e.status}: {detail}"
    return f"failed: {type(e).__name__}: {e}"
