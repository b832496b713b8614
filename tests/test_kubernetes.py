"""KubernetesExecutor and live pod membership with the real ``kubernetes`` client against a real
kube-apiserver on etcd (tests/support/kube.py): its merge and strategic-merge patches, status
subresource, resourceVersion conflicts and RBAC, with deploy/kubernetes/rbac.yaml applied as
written and the executor using the token of the ServiceAccount it binds.

One server serves the whole run, so every test makes Nodes of its own (``names``)."""

from __future__ import annotations

import uuid
from collections.abc import Callable
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
    TAINT_KEY,
    KubernetesConfig,
    KubernetesExecutor,
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


def executor(kube: KubeCluster, token: str, **kw: Any) -> KubernetesExecutor:
    return KubernetesExecutor(KubernetesConfig(**kw), kube.client(token))


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
    assert conds[CONDITION]["reason"] == "RocewatchDrained"
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
    assert set(conditions(n)) == {"Ready"}
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
    assert set(conditions(n)) == {"Ready", "NetworkUnavailable"}
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
        "evict pod": lambda: core.create_namespaced_pod_eviction(
            pod, "default", {"metadata": {"name": pod, "namespace": "default"}}
        ),
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
        labels = {"alertname": "PFCStorm", "severity": "critical", "node": n, "role": "origin"}
        p.on_alert(Alert(labels, {}, at), at)
    acts = []
    for s in range(0, 30):
        acts += p.tick(T0 + s * S)[0]
    assert [(a.node, a.outcome) for a in acts] == [
        (nodes[0], "dry-run"),
        (nodes[1], "refused: max_job_share"),
    ]
    assert f"job {key} already has 1 of 4 nodes out ({nodes[0]})" in acts[1].reason
