"""KubernetesExecutor with the real ``kubernetes`` client against the API server stand-in
(tests/support/kube_apiserver.py), which enforces patch semantics, resourceVersion conflicts and
the RBAC rules of deploy/kubernetes/rbac.yaml."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from support.kube_apiserver import KubeApiStandIn, load_rules, merge_patch, strategic_merge

from actions import DrainPolicy, PolicyConfig
from actions.executors import DRAINED_BY_OTHER
from actions.kubernetes import (
    ANNOTATION,
    CONDITION,
    TAINT_KEY,
    KubernetesConfig,
    KubernetesExecutor,
)
from rocewatch.model import Alert
from rocewatch.topology import Topology

RBAC = Path(__file__).resolve().parents[1] / "deploy" / "kubernetes" / "rbac.yaml"
TOKEN = "sa-token-for-tests"
S = 1_000_000_000
T0 = 1_795_946_400 * S


@pytest.fixture
def api() -> Iterator[KubeApiStandIn]:
    with KubeApiStandIn(load_rules(RBAC), TOKEN) as srv:
        srv.add_node("gpu-01")
        srv.add_node(
            "gpu-02", taints=[{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]
        )
        yield srv


def make_client(url: str, token: str = TOKEN) -> Any:
    conf = client.Configuration(
        host=url, api_key={"BearerToken": token}, api_key_prefix={"BearerToken": "Bearer"}
    )
    return client.ApiClient(conf)


def executor(api: KubeApiStandIn, **kw: Any) -> KubernetesExecutor:
    return KubernetesExecutor(KubernetesConfig(**kw), make_client(api.url))


def taints(api: KubeApiStandIn, node: str) -> list[dict[str, Any]]:
    return list(api.nodes[node]["spec"].get("taints") or [])


def conditions(api: KubeApiStandIn, node: str) -> dict[str, str]:
    return {c["type"]: c["status"] for c in api.nodes[node]["status"]["conditions"]}


def test_drain_cordons_taints_sets_condition_and_event(api: KubeApiStandIn) -> None:
    ex = executor(api)
    assert ex.drain("gpu-02", "kubernetes", "rocewatch: PFCStorm origin mlx5_3") == "done"
    node = api.nodes["gpu-02"]
    assert node["spec"]["unschedulable"] is True
    assert taints(api, "gpu-02") == [
        {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"},  # kept
        {"key": TAINT_KEY, "value": "true", "effect": "NoSchedule"},
    ]
    assert ANNOTATION in node["metadata"]["annotations"]
    assert conditions(api, "gpu-02") == {"Ready": "True", CONDITION: "True"}  # kubelet's kept
    cond = next(c for c in node["status"]["conditions"] if c["type"] == CONDITION)
    assert cond["message"] == "rocewatch: PFCStorm origin mlx5_3"
    [ev] = api.events
    assert ev["involvedObject"]["kind"] == "Node" and ev["involvedObject"]["name"] == "gpu-02"
    assert ev["type"] == "Warning" and ev["source"]["component"] == "rocewatch"
    # Node patches are merge patches; status patches strategic (merge by condition type).
    kinds = {(m, p, c) for m, p, c in api.requests if m == "PATCH"}
    assert kinds == {
        ("PATCH", "/api/v1/nodes/gpu-02", "application/merge-patch+json"),
        ("PATCH", "/api/v1/nodes/gpu-02/status", "application/strategic-merge-patch+json"),
    }

    # Idempotent: a retry finds it done and writes nothing to the node.
    rv = node["metadata"]["resourceVersion"]
    assert ex.drain("gpu-02", "kubernetes", "rocewatch: PFCStorm origin mlx5_3") == "done"
    assert taints(api, "gpu-02")[-1]["key"] == TAINT_KEY and len(taints(api, "gpu-02")) == 2
    assert api.nodes["gpu-02"]["spec"]["unschedulable"] is True
    assert rv <= api.nodes["gpu-02"]["metadata"]["resourceVersion"]

    assert ex.resume("gpu-02", "kubernetes") == "done"
    node = api.nodes["gpu-02"]
    assert "unschedulable" not in node["spec"]
    assert taints(api, "gpu-02") == [
        {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
    ]
    assert ANNOTATION not in node["metadata"]["annotations"]
    assert conditions(api, "gpu-02") == {"Ready": "True"}
    assert ex.resume("gpu-02", "kubernetes") == "done"  # idempotent too


def test_no_execute_only_when_configured(api: KubeApiStandIn) -> None:
    assert executor(api).drain("gpu-01", "kubernetes", "rocewatch: x") == "done"
    assert taints(api, "gpu-01")[0]["effect"] == "NoSchedule"
    ev = executor(api, taint_effect="NoExecute")
    assert ev.resume("gpu-01", "kubernetes") == "done"
    assert ev.drain("gpu-01", "kubernetes", "rocewatch: x") == "done"
    assert taints(api, "gpu-01") == [{"key": TAINT_KEY, "value": "true", "effect": "NoExecute"}]


def test_conflict_is_retried_and_other_writers_taints_survive(api: KubeApiStandIn) -> None:
    writes = []

    def kubelet(node: str, srv: KubeApiStandIn) -> None:
        # Twice, another writer changes the node between rocewatch's read and its patch.
        if len(writes) < 2:
            writes.append(node)
            srv.write(
                node,
                lambda n: (
                    n["spec"]
                    .setdefault("taints", [])
                    .append({"key": f"other/{len(writes)}", "effect": "NoSchedule"})
                ),
            )

    api.before_write = kubelet
    assert executor(api).drain("gpu-01", "kubernetes", "rocewatch: FlakyLink mlx5_0") == "done"
    assert [t["key"] for t in taints(api, "gpu-01")] == ["other/1", "other/2", TAINT_KEY]
    node_patches = [r for r in api.requests if r[:2] == ("PATCH", "/api/v1/nodes/gpu-01")]
    assert len(node_patches) == 3  # two 409 Conflicts, then success


def test_conflicts_forever_fail_softly(api: KubeApiStandIn) -> None:
    api.before_write = lambda node, srv: srv.write(node, lambda n: None)
    out = executor(api, conflict_retries=2).drain("gpu-01", "kubernetes", "rocewatch: x")
    assert out == "failed: gpu-01 kept changing (3 conflicts)"
    assert "unschedulable" not in api.nodes["gpu-01"]["spec"]


def test_someone_elses_cordon_is_left_alone(api: KubeApiStandIn) -> None:
    api.write("gpu-01", lambda n: n["spec"].update(unschedulable=True))
    before = api.nodes["gpu-01"]
    ex = executor(api)
    assert ex.drain("gpu-01", "kubernetes", "rocewatch: x") == DRAINED_BY_OTHER
    assert ex.resume("gpu-01", "kubernetes") == DRAINED_BY_OTHER
    assert api.nodes["gpu-01"] == before
    assert api.events == []


def test_errors_are_outcomes(api: KubeApiStandIn) -> None:
    ex = executor(api)
    assert ex.drain("gpu-99", "kubernetes", "rocewatch: x") == (
        'failed: kubernetes 404: nodes "gpu-99" not found'
    )
    assert ex.drain("gpu-01", "slurm", "rocewatch: x").startswith("refused:")
    bad = KubernetesExecutor(KubernetesConfig(), make_client(api.url, token="wrong"))
    assert (
        bad.drain("gpu-01", "kubernetes", "rocewatch: x") == "failed: kubernetes 401: Unauthorized"
    )


def test_rbac_manifest_is_least_privilege(api: KubeApiStandIn) -> None:
    """The role grants what the executor uses and nothing destructive beyond it."""
    core = client.CoreV1Api(make_client(api.url))
    with pytest.raises(client.exceptions.ApiException) as e:
        core.delete_node("gpu-01")
    assert e.value.status == 403
    with pytest.raises(client.exceptions.ApiException) as e:
        core.list_node()
    assert e.value.status == 403
    granted = {
        (res, verb) for r in load_rules(RBAC) for res in r["resources"] for verb in r["verbs"]
    }
    assert granted == {
        ("nodes", "get"),
        ("nodes", "patch"),
        ("nodes/status", "patch"),
        ("pods", "list"),
        ("events", "create"),
    }


def test_policy_drives_the_executor(api: KubeApiStandIn) -> None:
    topo = Topology.from_dict(
        {
            "switches": [{"name": "leaf-0"}],
            "nodes": [
                {"name": f"gpu-{i:02d}", "scheduler": "kubernetes", "nics": [{"nic": "mlx5_0"}]}
                for i in range(1, 11)
            ],
        }
    )
    p = DrainPolicy(PolicyConfig(mode="auto", resume_after_healthy_s=10), topo, executor(api))
    a = Alert(
        {
            "alertname": "PFCStorm",
            "severity": "critical",
            "node": "gpu-01",
            "nic": "mlx5_0",
            "role": "origin",
        },
        {},
        T0,
    )
    p.on_alert(a, T0)
    acts, _ = p.tick(T0 + 3 * S)
    assert [(x.action, x.node, x.scheduler, x.outcome) for x in acts] == [
        ("drain", "gpu-01", "kubernetes", "done")
    ]
    assert api.nodes["gpu-01"]["spec"]["unschedulable"] is True
    p.on_alert(Alert(a.labels, {}, T0, ends_at=T0 + 5 * S), T0 + 5 * S)
    acts, _ = p.tick(T0 + 16 * S)
    assert [(x.action, x.outcome) for x in acts] == [("resume", "done")]
    assert taints(api, "gpu-01") == []


def test_patch_semantics_of_the_stand_in() -> None:
    """The stand-in itself: RFC 7386 and strategic merge as the real server applies them."""
    node = {"spec": {"taints": [{"key": "a"}], "unschedulable": True}, "metadata": {"x": 1}}
    assert merge_patch(node, {"spec": {"unschedulable": None}}) == {
        "spec": {"taints": [{"key": "a"}]},
        "metadata": {"x": 1},
    }
    assert strategic_merge(node, {"spec": {"taints": [{"key": "b"}]}})["spec"]["taints"] == [
        {"key": "b"}
    ]
    st = {"status": {"conditions": [{"type": "Ready", "status": "True"}]}}
    both = strategic_merge(st, {"status": {"conditions": [{"type": "X", "status": "True"}]}})
    assert [c["type"] for c in both["status"]["conditions"]] == ["Ready", "X"]
    gone = strategic_merge(both, {"status": {"conditions": [{"type": "X", "$patch": "delete"}]}})
    assert gone == st


def test_executor_from_config_with_a_kubeconfig(api: KubeApiStandIn, tmp_path: Path) -> None:
    import yaml

    from actions.routing import RoutingExecutor
    from rocewatch.config import config_from_dict

    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": api.url}}],
                "users": [{"name": "rocewatch", "user": {"token": TOKEN}}],
                "contexts": [{"name": "ctx", "context": {"cluster": "c", "user": "rocewatch"}}],
                "current-context": "ctx",
            }
        )
    )
    cfg = config_from_dict(
        {"executors": {"kubernetes": {"kubeconfig": str(kubeconfig), "taint_effect": "NoExecute"}}}
    )
    ex = RoutingExecutor(cfg.executors)
    assert ex.drain("gpu-01", "kubernetes", "rocewatch: PCIeDowngrade mlx5_1") == "done"
    assert taints(api, "gpu-01") == [{"key": TAINT_KEY, "value": "true", "effect": "NoExecute"}]
    missing = config_from_dict({"executors": {"kubernetes": {"kubeconfig": "/nonexistent"}}})
    assert (
        RoutingExecutor(missing.executors)
        .drain("gpu-01", "kubernetes", "x")
        .startswith("failed: kubernetes:")
    )
