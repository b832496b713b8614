"""KubernetesExecutor and live pod membership with the real ``kubernetes`` client against a real
kube-apiserver on etcd (tests/support/kube.py): its merge and strategic-merge patches, status
subresource, resourceVersion conflicts and RBAC, with deploy/kubernetes/rbac.yaml applied as
written and the executor using the token of the ServiceAccount it binds. Evictions go through
the real Eviction API, against PodDisruptionBudgets whose status the real kube-controller-
manager's disruption controller keeps; the tests play the kubelet (pods bound by spec.nodeName,
marked Ready through the status subresource, evicted pods' final deletion).

One server serves the whole run, so every test makes Nodes of its own (``names``)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from actions import DrainPolicy, PolicyConfig
from actions.executors import DRAINED_BY_OTHER
from actions.kubernetes import (
    ANNOTATION,
    CONDITION,
    HEALTHY_REASON,
    OWNER_LABEL,
    STATE_ANNOTATION,
    TAINT_KEY,
    UNCORDONED_ANNOTATION,
    UNCORDONED_BY_OPERATOR,
    KubernetesConfig,
    KubernetesExecutor,
    _budget_name,
    fault_reason,
)
from actions.membership import KubernetesPods, LiveJobs, MembershipConfig
from rocewatch.core.errors import ConfigError
from rocewatch.core.model import Alert
from rocewatch.core.topology import Job, Topology
from tests.support.kube import KubeCluster

RBAC = Path(__file__).resolve().parents[1] / "deploy" / "kubernetes" / "rbac.yaml"
S = 1_000_000_000
T0 = 1_795_946_400 * S
GPU = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
MAINT = {"key": "example.com/maintenance", "value": "bios", "effect": "PreferNoSchedule"}
JOB_LABEL = "batch.kubernetes.io/job-name"

_rbac_token: dict[str, str] = {}  # server url -> token: rbac.yaml is applied once per server


@pytest.fixture
def kube(kube_api: KubeCluster) -> KubeCluster:
    return kube_api


@pytest.fixture
def sa_token(kube: KubeCluster) -> str:
    """deploy/kubernetes/rbac.yaml applied as written; its ServiceAccount's TokenRequest token."""
    if kube.url not in _rbac_token:
        kube.namespace("rocewatch")  # the manifest's namespace (it ships no Namespace object)
        kube.apply(RBAC)
        _rbac_token[kube.url] = kube.token("rocewatch", "rocewatch")
    return _rbac_token[kube.url]


@pytest.fixture
def names() -> Callable[[str], str]:
    """Node names of this test's own: names("gpu-01") -> "gpu-01-<6 hex>"."""
    tag = uuid.uuid4().hex[:6]
    return lambda base: f"{base}-{tag}"


_executors: list[KubernetesExecutor] = []


@pytest.fixture(autouse=True)
def _close_executors() -> Iterator[None]:
    yield
    while _executors:
        _executors.pop().close()  # their background threads end with the test


def executor(kube: KubeCluster, token: str, **kw: Any) -> KubernetesExecutor:
    """An executor with the ServiceAccount's token; the cordon alone unless ``evict=True``."""
    kw.setdefault("evict", False)
    ex = KubernetesExecutor(KubernetesConfig(**kw), kube.client(token))
    _executors.append(ex)
    return ex


def taints(kube: KubeCluster, node: str) -> list[dict[str, Any]]:
    return list(kube.read_node(node)["spec"].get("taints") or [])


def conditions(node: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in node["status"].get("conditions") or []}


def events(kube: KubeCluster, node: str, ns: str = "default") -> list[dict[str, Any]]:
    items = kube.core().list_namespaced_event(ns, field_selector=f"involvedObject.name={node}")
    evs = [client.ApiClient().sanitize_for_serialization(e) for e in items.items]
    return sorted(evs, key=lambda e: int(e["metadata"]["resourceVersion"]))  # in order written


def other_writer(kube: KubeCluster, node: str, key: str) -> None:
    """Another controller adds its taint with its own optimistic-concurrency patch."""
    cur = kube.read_node(node)
    new = [*(cur["spec"].get("taints") or []), {"key": key, "effect": "NoSchedule"}]
    rv = cur["metadata"]["resourceVersion"]
    kube.core().patch_node(
        node,
        {"metadata": {"resourceVersion": rv}, "spec": {"taints": new}},
        _content_type="application/merge-patch+json",
    )


def test_drain_cordons_taints_sets_condition_and_event(
    kube: KubeCluster, sa_token: str, names: Callable[[str], str]
) -> None:
    node = names("gpu-02")
    kube.node(node, taints=[GPU, MAINT])
    ex = executor(kube, sa_token)
    assert ex.drain(node, "kubernetes", "rocewatch: PFCStorm origin mlx5_3") == "done"
    n = kube.read_node(node)
    assert n["spec"]["unschedulable"] is True
    assert n["spec"]["taints"] == [  # other writers' taints kept, in their order
        GPU,
        MAINT,
        {"key": TAINT_KEY, "value": "true", "effect": "NoSchedule"},
    ]
    assert n["metadata"]["annotations"][ANNOTATION].endswith("rocewatch: PFCStorm origin mlx5_3")
    conds = conditions(n)
    # a strategic merge by type through the status subresource: the kubelet's Ready is kept
    assert {t: c["status"] for t, c in conds.items()} == {"Ready": "True", CONDITION: "True"}
    assert conds[CONDITION]["reason"] == "PFCStorm"  # node-problem-detector's polarity
    assert n["metadata"]["labels"][OWNER_LABEL] == "rocewatch"
    assert conds[CONDITION]["message"] == "rocewatch: PFCStorm origin mlx5_3"
    [ev] = events(kube, node)
    assert ev["involvedObject"]["kind"] == "Node" and ev["involvedObject"]["name"] == node
    assert ev["type"] == "Warning" and ev["reason"] == "FabricFaultDrain"
    assert ev["source"]["component"] == "rocewatch"
    assert ev["message"] == "rocewatch: PFCStorm origin mlx5_3"

    # Idempotent: a retry (after a lost answer) finds the drain done and writes nothing: no
    # second Event, the condition's transition time is the drain's.
    assert ex.drain(node, "kubernetes", "rocewatch: PFCStorm origin mlx5_3") == "done"
    assert kube.read_node(node)["metadata"]["resourceVersion"] == n["metadata"]["resourceVersion"]
    assert len(events(kube, node)) == 1
    # A drain whose condition was lost on the way (its status patch unanswered) is finished.
    kube.core().patch_node_status(
        node,
        {"status": {"conditions": [{"type": CONDITION, "$patch": "delete"}]}},
        _content_type="application/strategic-merge-patch+json",
    )
    assert ex.drain(node, "kubernetes", "rocewatch: PFCStorm origin mlx5_3") == "done"
    n = kube.read_node(node)
    assert conditions(n)[CONDITION]["status"] == "True"
    assert len(events(kube, node)) == 1

    assert ex.resume(node, "kubernetes") == "done"
    n = kube.read_node(node)
    assert "unschedulable" not in n["spec"]
    assert n["spec"]["taints"] == [GPU, MAINT]
    assert ANNOTATION not in (n["metadata"].get("annotations") or {})
    assert OWNER_LABEL not in n["metadata"]["labels"]
    conds = conditions(n)
    assert set(conds) == {"Ready", CONDITION}
    assert (conds[CONDITION]["status"], conds[CONDITION]["reason"]) == ("False", HEALTHY_REASON)
    assert [e["reason"] for e in events(kube, node)] == ["FabricFaultDrain", "FabricFaultResume"]
    rv = n["metadata"]["resourceVersion"]
    assert ex.resume(node, "kubernetes") == "done"  # idempotent too: nothing left to write
    assert kube.read_node(node)["metadata"]["resourceVersion"] == rv
    assert len(events(kube, node)) == 2


def test_no_execute_only_when_configured(
    kube: KubeCluster, sa_token: str, names: Callable[[str], str]
) -> None:
    node = names("gpu-01")
    kube.node(node)
    assert executor(kube, sa_token).drain(node, "kubernetes", "rocewatch: x") == "done"
    assert taints(kube, node) == [{"key": TAINT_KEY, "value": "true", "effect": "NoSchedule"}]
    ev = executor(kube, sa_token, taint_effect="NoExecute")
    assert ev.resume(node, "kubernetes") == "done"
    assert taints(kube, node) == []
    assert ev.drain(node, "kubernetes", "rocewatch: x") == "done"
    assert taints(kube, node) == [{"key": TAINT_KEY, "value": "true", "effect": "NoExecute"}]


class Interleaved:
    """Wraps the executor's patch_node: ``before`` runs between its read and its patch (another
    writer's turn), and every answer's status is recorded (the server's, not ours)."""

    def __init__(self, ex: KubernetesExecutor, before: Callable[[int], None]) -> None:
        self.real = ex.api.patch_node
        self.before = before
        self.statuses: list[int] = []
        ex.api.patch_node = self

    def __call__(self, *a: Any, **kw: Any) -> Any:
        self.before(len(self.statuses))
        try:
            out = self.real(*a, **kw)
        except ApiException as e:
            self.statuses.append(e.status)
            raise
        self.statuses.append(200)
        return out


def test_a_stale_resource_version_is_a_409_and_is_retried(
    kube: KubeCluster, sa_token: str, names: Callable[[str], str]
) -> None:
    node = names("gpu-01")
    kube.node(node)
    ex = executor(kube, sa_token)

    def kubelet(calls: int) -> None:
        if calls < 2:  # twice, another writer changes the node between our read and our patch
            other_writer(kube, node, f"other.example.com/t{calls + 1}")

    spy = Interleaved(ex, kubelet)
    assert ex.drain(node, "kubernetes", "rocewatch: FlakyLink mlx5_0") == "done"
    assert spy.statuses == [409, 409, 200]
    assert [t["key"] for t in taints(kube, node)] == [
        "other.example.com/t1",
        "other.example.com/t2",
        TAINT_KEY,
    ]


def test_conflicts_forever_fail_softly(
    kube: KubeCluster, sa_token: str, names: Callable[[str], str]
) -> None:
    node = names("gpu-01")
    kube.node(node)
    ex = executor(kube, sa_token, conflict_retries=2)
    spy = Interleaved(ex, lambda calls: other_writer(kube, node, f"other.example.com/t{calls}"))
    assert ex.drain(node, "kubernetes", "rocewatch: x") == "failed: " + (
        f"{node} kept changing (3 conflicts)"
    )
    assert spy.statuses == [409, 409, 409]
    n = kube.read_node(node)
    assert "unschedulable" not in n["spec"]
    assert TAINT_KEY not in [t["key"] for t in n["spec"]["taints"]]
    assert events(kube, node) == []


def test_someone_elses_cordon_is_left_alone(
    kube: KubeCluster, sa_token: str, names: Callable[[str], str]
) -> None:
    node = names("gpu-01")
    kube.node(node)
    kube.core().patch_node(node, {"spec": {"unschedulable": True}})  # kubectl cordon
    before = kube.read_node(node)
    ex = executor(kube, sa_token)
    assert ex.drain(node, "kubernetes", "rocewatch: x") == DRAINED_BY_OTHER
    assert ex.resume(node, "kubernetes") == DRAINED_BY_OTHER
    assert kube.read_node(node) == before
    assert events(kube, node) == []


def test_resume_removes_only_our_marks(
    kube: KubeCluster, sa_token: str, names: Callable[[str], str]
) -> None:
    """Taints and conditions that others added while the node was drained stay."""
    node = names("gpu-01")
    kube.node(node, taints=[GPU])
    ex = executor(kube, sa_token)
    assert ex.drain(node, "kubernetes", "rocewatch: x") == "done"
    other_writer(kube, node, "other.example.com/after")
    kube.core().patch_node_status(
        node,
        {"status": {"conditions": [{"type": "NetworkUnavailable", "status": "False"}]}},
        _content_type="application/strategic-merge-patch+json",
    )
    kube.core().patch_node(node, {"metadata": {"annotations": {"example.com/owner": "ops"}}})
    assert ex.resume(node, "kubernetes") == "done"
    n = kube.read_node(node)
    assert [t["key"] for t in n["spec"]["taints"]] == [GPU["key"], "other.example.com/after"]
    assert set(conditions(n)) == {"Ready", "NetworkUnavailable", CONDITION}
    assert n["metadata"]["annotations"] == {"example.com/owner": "ops"}
    assert "unschedulable" not in n["spec"]


def test_errors_are_outcomes(kube: KubeCluster, sa_token: str, names: Callable[[str], str]) -> None:
    ex = executor(kube, sa_token)
    missing = names("gpu-99")
    assert ex.drain(missing, "kubernetes", "rocewatch: x") == (
        f'failed: kubernetes 404: nodes "{missing}" not found'
    )
    node = names("gpu-01")
    kube.node(node)
    assert ex.drain(node, "slurm", "rocewatch: x").startswith("refused:")
    bad = executor(kube, "not-a-token")
    assert bad.drain(node, "kubernetes", "rocewatch: x") == "failed: kubernetes 401: Unauthorized"
    assert "unschedulable" not in kube.read_node(node)["spec"]


def test_node_events_belong_in_default(kube: KubeCluster, names: Callable[[str], str]) -> None:
    """The API server refuses an Event about a Node outside ``default``, so the executor refuses
    such an event_namespace at start-up rather than lose every drain's Event."""
    node = names("gpu-01")
    kube.node(node)
    ev = {
        "metadata": {"generateName": "x."},
        "involvedObject": {"kind": "Node", "name": node, "uid": node, "apiVersion": "v1"},
        "reason": "FabricFaultDrain",
        "message": "m",
        "type": "Warning",
    }
    with pytest.raises(ApiException) as e:
        kube.core().create_namespaced_event(kube.namespace("rocewatch"), ev)  # as the admin
    assert e.value.status == 422
    with pytest.raises(ConfigError, match="event_namespace"):
        KubernetesConfig(event_namespace="rocewatch").validate()
    kube.core().create_namespaced_event("default", ev)


# (API group, resource, subresource) x verbs x namespace ("" = cluster-wide): the grid RBAC is
# asked about; what the executor and membership need is exactly ALLOWED.
RESOURCES = [
    ("", "nodes", ""),
    ("", "nodes", "status"),
    ("", "nodes", "proxy"),
    ("", "pods", ""),
    ("", "pods", "status"),
    ("", "pods", "eviction"),
    ("", "pods", "exec"),
    ("", "events", ""),
    ("events.k8s.io", "events", ""),
    ("", "secrets", ""),
    ("", "configmaps", ""),
    ("", "serviceaccounts", "token"),
    ("apps", "daemonsets", ""),
    ("policy", "poddisruptionbudgets", ""),
]
VERBS = ["get", "list", "watch", "create", "update", "patch", "delete", "deletecollection"]
NAMESPACES = ["", "default", "rocewatch"]
ALLOWED = {
    ("", "nodes", "", "get", ""),
    ("", "nodes", "", "patch", ""),
    ("", "nodes", "status", "patch", ""),
    ("", "pods", "", "list", ""),  # cluster-wide (ClusterRoleBinding), so in any namespace too
    ("", "pods", "", "list", "default"),
    ("", "pods", "", "list", "rocewatch"),
    ("", "pods", "eviction", "create", ""),  # the Eviction API: budgets honoured
    ("", "pods", "eviction", "create", "default"),
    ("", "pods", "eviction", "create", "rocewatch"),
    ("", "events", "", "create", "default"),  # a Role in default only
}
CLUSTER_SCOPED = {"nodes"}


def test_rbac_manifest_grants_exactly_what_the_executor_needs(
    kube: KubeCluster, sa_token: str
) -> None:
    """The API server's own authorizer, asked as the ServiceAccount (SelfSubjectAccessReview)."""
    authz = client.AuthorizationV1Api(kube.client(sa_token))
    allowed = set()
    for group, resource, sub in RESOURCES:
        for ns in [""] if resource in CLUSTER_SCOPED else NAMESPACES:
            for verb in VERBS:
                attrs = {"group": group, "resource": resource, "verb": verb}
                if sub:
                    attrs["subresource"] = sub
                if ns:
                    attrs["namespace"] = ns
                review = authz.create_self_subject_access_review(
                    {"spec": {"resourceAttributes": attrs}}
                )
                if review.status.allowed:
                    allowed.add((group, resource, sub, verb, ns))
    assert allowed == ALLOWED


def test_rbac_forbids_the_rest_with_403(
    kube: KubeCluster, sa_token: str, names: Callable[[str], str]
) -> None:
    node = names("gpu-01")
    kube.node(node)
    pod = names("p")
    kube.pod("default", pod, node, {"app": "x"})
    core = kube.core(sa_token)
    attempts: dict[str, Callable[[], Any]] = {
        "delete node": lambda: core.delete_node(node),
        "list nodes": lambda: core.list_node(),
        "update node": lambda: core.replace_node(node, kube.core().read_node(node)),
        "create node": lambda: core.create_node({"metadata": {"name": names("x")}}),
        "delete pod": lambda: core.delete_namespaced_pod(pod, "default"),
        "get pod": lambda: core.read_namespaced_pod(pod, "default"),
        "list secrets": lambda: core.list_namespaced_secret("rocewatch"),
        "event elsewhere": lambda: core.create_namespaced_event(
            "rocewatch",
            {
                "metadata": {"generateName": "x."},
                "involvedObject": {"kind": "Node", "name": node},
                "reason": "R",
                "message": "m",
            },
        ),
    }
    codes = {}
    for what, call in attempts.items():
        with pytest.raises(ApiException) as e:
            call()
        codes[what] = e.value.status
    assert codes == dict.fromkeys(attempts, 403)
    assert "unschedulable" not in kube.read_node(node)["spec"]


def topology(nodes: list[str], jobs: list[Any] | None = None) -> Topology:
    return Topology.from_dict(
        {
            "switches": [{"name": "leaf-0"}],
            "nodes": [
                {"name": n, "scheduler": "kubernetes", "nics": [{"nic": "mlx5_0"}]} for n in nodes
            ],
            "jobs": jobs or [],
        }
    )


def test_policy_drives_the_executor(
    kube: KubeCluster, sa_token: str, names: Callable[[str], str]
) -> None:
    nodes = [names(f"gpu-{i:02d}") for i in range(1, 11)]
    for n in nodes:
        kube.node(n)
    p = DrainPolicy(
        PolicyConfig(mode="auto", resume_after_healthy_s=10),
        topology(nodes),
        executor(kube, sa_token),
    )
    labels = {
        "alertname": "PFCStorm",
        "severity": "critical",
        "node": nodes[0],
        "nic": "mlx5_0",
        "role": "origin",
    }
    p.on_alert(Alert(labels, {}, T0), T0)
    acts, _ = p.tick(T0 + 3 * S)
    assert [(x.action, x.node, x.scheduler, x.outcome) for x in acts] == [
        ("drain", nodes[0], "kubernetes", "done")
    ]
    assert kube.read_node(nodes[0])["spec"]["unschedulable"] is True
    p.on_alert(Alert(labels, {}, T0, ends_at=T0 + 5 * S), T0 + 5 * S)
    acts, _ = p.tick(T0 + 16 * S)
    assert [(x.action, x.outcome) for x in acts] == [("resume", "done")]
    assert taints(kube, nodes[0]) == []
    assert "unschedulable" not in kube.read_node(nodes[0])["spec"]


def test_executor_from_config_with_a_kubeconfig(
    kube: KubeCluster, sa_token: str, names: Callable[[str], str], tmp_path: Path
) -> None:
    import yaml

    from actions.routing import RoutingExecutor
    from rocewatch.config import config_from_dict
    from rocewatch.runtime.detect import kube_nodes

    node = names("gpu-01")
    kube.node(node)
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [
                    {
                        "name": "c",
                        "cluster": {"server": kube.url, "certificate-authority": str(kube.ca_file)},
                    }
                ],
                "users": [{"name": "rocewatch", "user": {"token": sa_token}}],
                "contexts": [{"name": "ctx", "context": {"cluster": "c", "user": "rocewatch"}}],
                "current-context": "ctx",
            }
        )
    )
    cfg = config_from_dict(
        {"executors": {"kubernetes": {"kubeconfig": str(kubeconfig), "taint_effect": "NoExecute"}}}
    )
    ex = RoutingExecutor(cfg.executors)
    assert ex.drain(node, "kubernetes", "rocewatch: PCIeDowngrade mlx5_1") == "done"
    assert taints(kube, node) == [{"key": TAINT_KEY, "value": "true", "effect": "NoExecute"}]
    until(lambda: ex.drain_states() == {node: "done"}, "the drain of a node without pods done")
    # what the detect stage hands it when it takes the stage: the topology's Kubernetes nodes
    watched = names("gpu-02")
    kube.node(watched)
    topo = topology([node, watched])
    assert kube_nodes(topo, None) == {"kubernetes": sorted([node, watched])}
    ex.watch(kube_nodes(topo, None))

    def condition(n: str) -> tuple[str, str]:
        c = conditions(kube.read_node(n)).get(CONDITION) or {}
        return c.get("status", ""), c.get("reason", "")

    until(lambda: condition(watched) == ("False", HEALTHY_REASON), "the healthy condition")
    assert condition(node) == ("True", "PCIeDowngrade")  # drained: left as it is
    ex.close()
    missing = config_from_dict({"executors": {"kubernetes": {"kubeconfig": "/nonexistent"}}})
    assert (
        RoutingExecutor(missing.executors)
        .drain(node, "kubernetes", "x")
        .startswith("failed: kubernetes:")
    )


def test_pod_membership_feeds_the_policy_job_cap(
    kube: KubeCluster, sa_token: str, names: Callable[[str], str]
) -> None:
    """Live job membership from real Pods (bound with spec.nodeName, phase as a kubelet reports
    it), listed with the ServiceAccount's token, caps the policy per job."""
    nodes = [names(f"k-{i:02d}") for i in range(1, 11)]
    for n in nodes:
        kube.node(n)
    team_a, team_b = names("team-a"), names("team-b")
    for i, n in enumerate(nodes[:4]):
        kube.pod(team_a, f"train-{i}", n, {JOB_LABEL: "train"})
    kube.pod(team_a, "train-old", nodes[4], {JOB_LABEL: "train"}, phase="Succeeded")  # ended
    kube.pod(team_a, "train-next", nodes[6], {JOB_LABEL: "train"}, phase="Pending")
    kube.pod(team_b, "web", nodes[5], {"app": "web"})  # no job label: no job
    t = topology(nodes)
    src = KubernetesPods(kube.core(sa_token), MembershipConfig(kubernetes=True))
    LiveJobs(t, [src]).refresh()
    key = f"{team_a}/train"
    assert t.jobs == {key: Job(key, team_a, None, tuple(sorted(nodes[:4])))}

    cfg = PolicyConfig(max_fabric_share=1, max_rail_share=1)  # job cap 25 % of 4 nodes: 1
    p = DrainPolicy(cfg, t)
    for k, n in enumerate(nodes[:2]):
        at = T0 + k * 10 * S
        # (a flaky cable: the share caps hold for it; a storm's origin is exempt from them)
        labels = {"alertname": "FlakyLink", "severity": "warning", "node": n, "nic": "mlx5_0"}
        p.on_alert(Alert(labels, {}, at), at)
    acts = []
    for s in range(0, 30):
        acts += p.tick(T0 + s * S)[0]
    assert [(a.node, a.outcome) for a in acts] == [
        (nodes[0], "dry-run"),
        (nodes[1], "refused: max_job_share"),
    ]
    assert f"job {key} already has 1 of 4 nodes out ({nodes[0]})" in acts[1].reason


# --- evictions (the Eviction API, PodDisruptionBudgets given their status by the real
# --- kube-controller-manager's disruption controller) --------------------------------------------


def until(check: Callable[[], Any], what: str, limit_s: float = 60.0, step: Any = None) -> Any:
    """Poll ``check`` until it is truthy (``step`` runs between tries); the limit only bounds a
    failing test, nothing is asserted about time."""
    deadline = time.monotonic() + limit_s
    while True:
        got = check()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"not reached within {limit_s:g} s: {what}")
        if step is not None:
            step()
        time.sleep(0.1)


def budget(kube: KubeCluster, ns: str, name: str) -> dict[str, Any]:
    return dict(kube.read_pdb(ns, name).get("status") or {})


def settled(kube: KubeCluster, ns: str, name: str, allowed: int) -> bool:
    """The disruption controller has seen the budget's latest spec and allows ``allowed``."""
    pdb = kube.read_pdb(ns, name)
    st = pdb.get("status") or {}
    return bool(
        st.get("observedGeneration") == pdb["metadata"]["generation"]
        and st.get("disruptionsAllowed") == allowed
    )


def reasons(kube: KubeCluster, node: str) -> list[str]:
    return [e["reason"] for e in events(kube, node)]


def test_drain_evicts_honouring_budgets_and_leaves_daemonset_mirror_and_skipped_pods(
    kube: KubeCluster, sa_token: str, names: Callable[[str], str]
) -> None:
    node, other = names("gpu-01"), names("gpu-02")
    kube.node(node)
    kube.node(other)
    team, infra = names("team"), names("infra")
    train = {"app": "train"}
    for i in range(2):
        kube.pod(team, f"train-{i}", node, train)
    kube.pod(team, "train-2", other, train)  # the budget's third pod, elsewhere
    kube.pod(team, "notebook", node, {"app": "notebook"})  # no budget: evicted at once
    ds = kube.daemonset(infra, "rdma-agent")
    kube.pod(infra, "rdma-agent-x", node, {"app": "rdma-agent"}, owner=ds)
    mirror = {"kubernetes.io/config.mirror": "0123abcd", "kubernetes.io/config.source": "file"}
    kube.pod(team, "static-x", node, {"app": "static"}, annotations=mirror)  # a static pod's
    skipped = names("monitoring")
    kube.pod(skipped, "exporter", node, {"app": "exporter"})
    kube.pdb(team, "train-budget", train, 3)  # all three must stay: no eviction allowed
    until(lambda: settled(kube, team, "train-budget", 0), "the budget's status")
    assert budget(kube, team, "train-budget")["currentHealthy"] == 3  # Ready pods, counted

    ex = executor(
        kube, sa_token, evict=True, grace_period_s=7, skip_namespaces=[skipped],
        backoff_s=0.2, backoff_max_s=0.5,
    )  # fmt: skip
    assert ex.drain(node, "kubernetes", "rocewatch: PFCStorm origin mlx5_3") == "done"  # at once
    assert kube.read_node(node)["spec"]["unschedulable"] is True
    blocked = "blocked by PodDisruptionBudget train-budget"
    until(lambda: ex.drain_state(node) == blocked, blocked, step=lambda: None)
    pods = kube.pods_on(node)
    # evicted with the configured grace period; terminating until its kubelet confirms
    assert pods[f"{team}/notebook"]["metadata"]["deletionGracePeriodSeconds"] == 7
    assert [k for k, p in pods.items() if p["metadata"].get("deletionTimestamp")] == [
        f"{team}/notebook"
    ]
    assert kube.read_node(node)["metadata"]["annotations"][STATE_ANNOTATION] == blocked
    assert reasons(kube, node).count("RoCEFabricDrainBlocked") == 1
    assert ex.counts["blocked"] == 1
    kube.finish_deletions(node)  # the kubelet's part
    # while the budget forbids it, the drain backs off and retries: still blocked, nothing lost
    until(lambda: ex.counts["evicted"] == 1 and ex.drain_state(node) == blocked, "still blocked")
    assert sorted(kube.pods_on(node)) == sorted(
        [f"{team}/train-0", f"{team}/train-1", f"{infra}/rdma-agent-x", f"{team}/static-x",
         f"{skipped}/exporter"]
    )  # fmt: skip

    # The budget allows one: one train pod goes, the other waits for the budget again.
    kube.policy().patch_namespaced_pod_disruption_budget(
        "train-budget", team, {"spec": {"minAvailable": 2}}
    )
    until(lambda: ex.counts["evicted"] == 2, "one train pod evicted", step=lambda: None)
    assert ex.drain_state(node) in ("evicting", blocked)
    kube.finish_deletions(node)
    # the budget deleted: the last one goes and the drain is done
    kube.policy().delete_namespaced_pod_disruption_budget("train-budget", team)
    until(
        lambda: ex.drain_state(node) == "done", "the drain done",
        step=lambda: kube.finish_deletions(node),
    )  # fmt: skip
    assert ex.counts["evicted"] == 3
    assert sorted(kube.pods_on(node)) == sorted(
        [f"{infra}/rdma-agent-x", f"{team}/static-x", f"{skipped}/exporter"]
    )  # the DaemonSet's, the mirror pod and the skipped namespace's stay
    assert sorted(kube.pods_on(other)) == [f"{team}/train-2"]
    n = kube.read_node(node)
    assert n["metadata"]["annotations"][STATE_ANNOTATION] == "done"
    assert n["spec"]["unschedulable"] is True
    assert conditions(n)[CONDITION]["status"] == "True"
    r = reasons(kube, node)
    assert r[0] == "FabricFaultDrain" and r[-1] == "RoCEFabricDrainDone"
    assert ex.resume(node, "kubernetes") == "done"
    assert ex.drain_state(node) is None
    assert "unschedulable" not in kube.read_node(node)["spec"]


def test_a_drain_a_budget_holds_is_stuck_after_its_timeout_and_never_forced(
    kube: KubeCluster, sa_token: str, names: Callable[[str], str]
) -> None:
    node = names("gpu-01")
    kube.node(node)
    ns = names("db")
    kube.pod(ns, "db-0", node, {"app": "db"})
    kube.pdb(ns, "db", {"app": "db"}, 1)
    until(lambda: settled(kube, ns, "db", 0), "the budget's status")
    ex = executor(kube, sa_token, evict=True, drain_timeout_s=0.5, backoff_s=0.1,
                  backoff_max_s=0.2)  # fmt: skip
    assert ex.drain(node, "kubernetes", "rocewatch: FlakyLink mlx5_0") == "done"
    until(lambda: ex.drain_state(node) == "stuck after 0.5s", "stuck")
    assert kube.read_node(node)["metadata"]["annotations"][STATE_ANNOTATION] == "stuck after 0.5s"
    [pod] = kube.pods_on(node).values()
    assert "deletionTimestamp" not in pod["metadata"]  # not forced
    assert ex.counts["stuck"] == 1 and ex.counts["forced"] == 0
    assert "RoCEFabricDrainStuck" in reasons(kube, node)
    # it keeps trying (stuck stays the state until it is done): the budget lifted, it completes
    kube.policy().delete_namespaced_pod_disruption_budget("db", ns)
    until(
        lambda: ex.drain_state(node) == "done", "done after the budget went",
        step=lambda: kube.finish_deletions(node),
    )  # fmt: skip
    assert ex.counts["forced"] == 0


def test_force_after_timeout_deletes_what_a_budget_holds_only_when_configured(
    kube: KubeCluster, names: Callable[[str], str]
) -> None:
    """Forcing needs pods delete, which rbac.yaml does not grant: the admin's token here."""
    node = names("gpu-01")
    kube.node(node)
    ns = names("db")
    kube.pod(ns, "db-0", node, {"app": "db"})
    kube.pdb(ns, "db", {"app": "db"}, 1)
    until(lambda: settled(kube, ns, "db", 0), "the budget's status")
    ex = executor(kube, kube.admin_token, evict=True, drain_timeout_s=0.3, backoff_s=0.1,
                  backoff_max_s=0.2, force_after_timeout=True, grace_period_s=0)  # fmt: skip
    assert ex.drain(node, "kubernetes", "rocewatch: FlakyLink mlx5_0") == "done"
    until(lambda: ex.drain_state(node) == "done", "forced through")
    assert kube.pods_on(node) == {}
    assert ex.counts["forced"] == 1 and ex.counts["stuck"] == 1
    assert reasons(kube, node)[-2:] == ["RoCEFabricDrainStuck", "RoCEFabricDrainDone"]
    assert "; forced" in events(kube, node)[-2]["message"]


def test_a_manual_uncordon_is_recorded_and_not_reverted(
    kube: KubeCluster, sa_token: str, names: Callable[[str], str]
) -> None:
    node = names("gpu-01")
    kube.node(node, taints=[GPU])
    ns = names("svc")
    kube.pod(ns, "api-0", node, {"app": "api"})
    kube.pdb(ns, "api", {"app": "api"}, 1)
    until(lambda: settled(kube, ns, "api", 0), "the budget's status")
    ex = executor(kube, sa_token, evict=True, backoff_s=0.1, backoff_max_s=0.2,
                  watch_interval_s=0.2)  # fmt: skip
    assert ex.drain(node, "kubernetes", "rocewatch: PFCStorm origin mlx5_0") == "done"
    until(lambda: ex.drain_state(node) == "blocked by PodDisruptionBudget api", "blocked")
    # kubectl uncordon: a strategic merge of spec.unschedulable
    kube.core().patch_node(node, {"spec": {"unschedulable": False}})
    until(lambda: ex.drain_state(node) == "uncordoned by hand", "the uncordon noticed")
    n = kube.read_node(node)
    assert not n["spec"].get("unschedulable")
    assert n["spec"]["taints"] == [GPU]  # rocewatch's taint lifted too: it does not fight
    ann = n["metadata"]["annotations"]
    assert UNCORDONED_ANNOTATION in ann and ann[STATE_ANNOTATION] == "uncordoned by hand"
    assert ANNOTATION in ann  # why rocewatch had cordoned it, kept until rocewatch returns it
    assert ex.counts["uncordoned_by_hand"] == 1
    assert reasons(kube, node).count("RoCEFabricUncordonedByHand") == 1
    # not re-cordoned: neither by the background thread nor by another drain
    assert ex.drain(node, "kubernetes", "rocewatch: PFCStorm origin mlx5_0") == (
        UNCORDONED_BY_OPERATOR
    )
    rv = kube.read_node(node)["metadata"]["resourceVersion"]
    ex._check_held(node)  # what the background thread does every watch_interval_s
    assert kube.read_node(node)["metadata"]["resourceVersion"] == rv
    assert not kube.read_node(node)["spec"].get("unschedulable")
    assert reasons(kube, node).count("RoCEFabricUncordonedByHand") == 1  # recorded once
    assert "deletionTimestamp" not in kube.pods_on(node)[f"{ns}/api-0"]["metadata"]
    # rocewatch returns it: its marks go, the outcome records who returned it
    assert ex.resume(node, "kubernetes") == UNCORDONED_BY_OPERATOR
    n = kube.read_node(node)
    assert not {ANNOTATION, UNCORDONED_ANNOTATION, STATE_ANNOTATION} & set(
        n["metadata"].get("annotations") or {}
    )
    assert conditions(n)[CONDITION]["status"] == "False"
    assert n["spec"]["taints"] == [GPU]
    # and a later fault drains it again as usual
    assert ex.drain(node, "kubernetes", "rocewatch: PFCStorm origin mlx5_0") == "done"
    assert kube.read_node(node)["spec"]["unschedulable"] is True


def test_policy_records_the_uncordon_by_hand(
    kube: KubeCluster, sa_token: str, names: Callable[[str], str]
) -> None:
    """The policy's resume of a node an operator uncordoned records that outcome."""
    nodes = [names(f"gpu-{i:02d}") for i in range(1, 11)]
    for n in nodes:
        kube.node(n)
    ex = executor(kube, sa_token)
    p = DrainPolicy(PolicyConfig(mode="auto", resume_after_healthy_s=10), topology(nodes), ex)
    labels = {"alertname": "PFCStorm", "severity": "critical", "node": nodes[0], "role": "origin"}
    p.on_alert(Alert(labels, {}, T0), T0)
    assert [x.outcome for x in p.tick(T0 + 3 * S)[0]] == ["done"]
    kube.core().patch_node(nodes[0], {"spec": {"unschedulable": False}})  # kubectl uncordon
    p.on_alert(Alert(labels, {}, T0, ends_at=T0 + 5 * S), T0 + 5 * S)
    acts, _ = p.tick(T0 + 16 * S)
    assert [(x.action, x.outcome, x.executed) for x in acts] == [
        ("resume", UNCORDONED_BY_OPERATOR, False)
    ]
    assert not kube.read_node(nodes[0])["spec"].get("unschedulable")
    assert reasons(kube, nodes[0]) == ["FabricFaultDrain", "RoCEFabricUncordonedByHand"]


def test_watched_nodes_read_false_with_a_healthy_reason(
    kube: KubeCluster, sa_token: str, names: Callable[[str], str]
) -> None:
    """node-problem-detector's polarity: False/healthy on every watched node rocewatch has not
    drained (a stale True of rocewatch's too); a node it drained keeps True, and a new executor
    (a restarted detector) takes that drain back."""
    healthy, stale, drained = names("gpu-01"), names("gpu-02"), names("gpu-03")
    for n in (healthy, stale, drained):
        kube.node(n)
    kube.core().patch_node_status(
        stale,
        {"status": {"conditions": [{"type": CONDITION, "status": "True", "reason": "PFCStorm"}]}},
        _content_type="application/strategic-merge-patch+json",
    )
    assert executor(kube, sa_token).drain(drained, "kubernetes", "rocewatch: PFCStorm") == "done"
    ex = executor(kube, sa_token, watch_interval_s=0.2)
    ex.watch([healthy, stale, drained, names("gone")])  # a node not (yet) in the cluster too

    def state() -> dict[str, tuple[str, str]]:
        out = {}
        for n in (healthy, stale, drained):
            c = conditions(kube.read_node(n)).get(CONDITION) or {}
            out[n] = (c.get("status", ""), c.get("reason", ""))
        return out

    want = {
        healthy: ("False", HEALTHY_REASON),
        stale: ("False", HEALTHY_REASON),
        drained: ("True", "PFCStorm"),
    }
    until(lambda: state() == want, f"conditions {want}")
    assert conditions(kube.read_node(healthy))["Ready"]["status"] == "True"  # the kubelet's kept
    until(lambda: ex.drain_state(drained) == "done", "the earlier drain taken back")
    assert ex.resume(drained, "kubernetes") == "done"
    assert state()[drained] == ("False", HEALTHY_REASON)


def test_eviction_settings_are_validated() -> None:
    from rocewatch.config import config_from_dict

    cfg = config_from_dict(
        {"executors": {"kubernetes": {"skip_namespaces": ["kube-system"], "grace_period_s": 30}}}
    ).executors.kubernetes
    assert cfg is not None
    assert (cfg.skip_namespaces, cfg.grace_period_s, cfg.evict) == (("kube-system",), 30, True)
    assert (cfg.force_after_timeout, cfg.taint_effect) == (False, "NoSchedule")  # safe defaults
    for bad in (
        {"grace_period_s": -1},
        {"drain_timeout_s": 0},
        {"backoff_s": 10, "backoff_max_s": 5},
        {"skip_namespaces": "kube-system"},
        {"watch_interval_s": -1},
    ):
        with pytest.raises(ConfigError):
            config_from_dict({"executors": {"kubernetes": bad}})
    assert fault_reason("rocewatch: PFCStorm origin mlx5_3") == "PFCStorm"


def test_the_budget_is_named_from_the_429_status() -> None:
    """The API server's answer to an eviction a budget forbids, as kube-apiserver 1.34 sends it
    (a StatusCause's type is spelled ``reason`` in JSON); bad bodies name nothing."""
    body = (
        '{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"Cannot '
        'evict pod as it would violate the pod\'s disruption budget.","reason":"TooManyReq'
        'uests","details":{"causes":[{"reason":"DisruptionBudget","message":"The disruption '
        'budget train-budget needs 3 healthy pods and has 3 currently"}]},"code":429}\n'
    )
    assert _budget_name(body) == "train-budget"
    processing = body.replace("needs 3 healthy pods and has 3 currently", "is still being "
                              "processed by the server.")  # fmt: skip
    assert _budget_name(processing) == "train-budget"
    for bad in ("", "not json", "[]", '{"details": {"causes": [1, {"reason": "Other"}]}}', None):
        assert _budget_name(bad) == ""
    assert fault_reason("rocewatch: ") == "RoCEFabricFault"
