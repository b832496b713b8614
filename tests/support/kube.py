"""A real Kubernetes API server for the tests: kube-apiserver (built by scripts/go_tools.sh from
k8s.io/kubernetes at the version pinned there) on Debian's etcd, both on 127.0.0.1, free ports.

Besides etcd and the API server, kube-controller-manager (built from the same module by
scripts/go_tools.sh) runs with only its disruption controller, so PodDisruptionBudgets get their
status (``disruptionsAllowed``: what the Eviction API checks). No scheduler, no kubelet, no other
controller: what those would do, the cluster object does on request: ``namespace()`` creates a
namespace with its ``default`` ServiceAccount (the ServiceAccount admission plugin refuses Pods
without it), ``node()`` creates a Node with a kubelet-like ``Ready`` condition, ``pod()`` creates
a Pod bound to a node (``spec.nodeName``) and patches its status the way a kubelet reports it
(``phase``, and the ``Ready`` condition a budget counts), ``finish_deletions()`` removes the
evicted pods of a node the way its kubelet confirms a graceful deletion.

The server authenticates with a static token file (an admin token in ``system:masters``),
authorizes with RBAC, serves TLS with a test CA's certificate (tests/pki.py) and signs
ServiceAccount tokens (``token()``: the TokenRequest API) with a key pair of its own.

``kube_api`` (session fixture in tests/conftest.py; ``running_cluster`` here) starts both once per
run and stops them after. A test that uses it is marked ``kube`` and ``slow``
(tests/support/tiers.py); without the binaries it is skipped, and under CI fails.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import re
import secrets
import shutil
import signal
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization

from tests.pki import issue, new_key, pem, pem_key
from tests.support.tiers import GO_BIN

ROOT = Path(__file__).resolve().parents[2]
GO_TOOLS = ROOT / "scripts" / "go_tools.sh"
START_TIMEOUT_S = float(os.environ.get("ROCEWATCH_KUBE_START_TIMEOUT", "180"))


def kube_version() -> str:
    """The kube-apiserver version scripts/go_tools.sh pins (one place says it)."""
    m = re.search(r"^KUBE_VERSION=(v[0-9.]+)$", GO_TOOLS.read_text(), re.M)
    if m is None:
        raise RuntimeError(f"{GO_TOOLS} pins no KUBE_VERSION")
    return m.group(1)


def apiserver_binary() -> Path:
    return GO_BIN / f"kube-apiserver-{kube_version()}"


def controller_manager_binary() -> Path:
    return GO_BIN / f"kube-controller-manager-{kube_version()}"


def missing() -> str:
    """Why the real API server cannot run here ("" when it can)."""
    why = []
    for binary in (apiserver_binary(), controller_manager_binary()):
        if not binary.is_file():
            why.append(f"{binary} not built")
    if shutil.which("etcd") is None:
        why.append("etcd not on PATH (Debian's etcd-server)")
    return "; ".join(why)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class KubeError(RuntimeError):
    pass


class KubeCluster:
    """etcd + kube-apiserver in ``directory``; ``url``, ``ca_file``, ``admin_token`` once up."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.admin_token = secrets.token_hex(16)
        self.ca_file = directory / "ca.crt"
        self.url = ""
        self.procs: list[tuple[str, subprocess.Popen[bytes]]] = []
        self._namespaces: set[str] = set()

    # --- processes -------------------------------------------------------------------------------
    def start(self) -> KubeCluster:
        d = self.dir
        ca_key = new_key()
        ca = issue("rocewatch test kube CA", ca_key, ca=True)
        srv_key = new_key()
        srv = issue(
            "kube-apiserver", srv_key, (ca, ca_key), server=True,
            dns=("kubernetes", "kubernetes.default", "kubernetes.default.svc"),
        )  # fmt: skip
        self.ca_file.write_bytes(pem(ca))
        (d / "apiserver.crt").write_bytes(pem(srv))
        (d / "apiserver.key").write_bytes(pem_key(srv_key))
        sa_key = new_key()  # signs ServiceAccount tokens (ES256)
        (d / "sa.key").write_bytes(pem_key(sa_key))
        (d / "sa.pub").write_bytes(
            sa_key.public_key().public_bytes(
                serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
            )
        )
        # token,user,uid,"group": the admin plays the controllers and the other writers
        (d / "tokens.csv").write_text(f'{self.admin_token},rw-admin,rw-admin,"system:masters"\n')

        etcd_port, peer_port, api_port = free_port(), free_port(), free_port()
        etcd_url = f"http://127.0.0.1:{etcd_port}"
        peer_url = f"http://127.0.0.1:{peer_port}"
        self._spawn(
            "etcd",
            [
                shutil.which("etcd") or "etcd",
                "--name=rw", f"--data-dir={d / 'etcd'}",
                f"--listen-client-urls={etcd_url}", f"--advertise-client-urls={etcd_url}",
                f"--listen-peer-urls={peer_url}", f"--initial-advertise-peer-urls={peer_url}",
                f"--initial-cluster=rw={peer_url}", "--initial-cluster-state=new",
                "--logger=zap", "--log-level=warn",
            ],
            # Debian's etcd 3.4 reads ETCD_* from the environment too: only ours counts
            env={k: v for k, v in os.environ.items() if not k.startswith("ETCD_")},
        )  # fmt: skip
        self._wait(f"{etcd_url}/health", "etcd", insecure=True)
        self._spawn(
            "kube-apiserver",
            [
                str(apiserver_binary()),
                f"--etcd-servers={etcd_url}",
                "--bind-address=127.0.0.1", "--advertise-address=127.0.0.1",
                f"--secure-port={api_port}",
                f"--tls-cert-file={d / 'apiserver.crt'}",
                f"--tls-private-key-file={d / 'apiserver.key'}",
                f"--token-auth-file={d / 'tokens.csv'}",
                "--authorization-mode=RBAC",
                "--service-account-issuer=https://kubernetes.default.svc",
                f"--service-account-key-file={d / 'sa.pub'}",
                f"--service-account-signing-key-file={d / 'sa.key'}",
                "--service-cluster-ip-range=10.96.0.0/24",
                # nothing reaches a kubelet or the outside here: keep the server small and quiet
                "--enable-priority-and-fairness=false", "--profiling=false",
                "--endpoint-reconciler-type=none", "--v=0",
            ],
        )  # fmt: skip
        self.url = f"https://127.0.0.1:{api_port}"
        self._wait(f"{self.url}/readyz", "kube-apiserver")
        self._start_controller_manager()
        return self

    def _start_controller_manager(self) -> None:
        """Only the disruption controller (``--controllers``), as the admin, serving nothing."""
        kubeconfig = self.dir / "kcm.kubeconfig"
        kubeconfig.write_text(
            json.dumps(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [
                        {
                            "name": "rw",
                            "cluster": {
                                "server": self.url,
                                "certificate-authority": str(self.ca_file),
                            },
                        }
                    ],
                    "users": [{"name": "admin", "user": {"token": self.admin_token}}],
                    "contexts": [{"name": "rw", "context": {"cluster": "rw", "user": "admin"}}],
                    "current-context": "rw",
                }
            )
        )
        self._spawn(
            "kube-controller-manager",
            [
                str(controller_manager_binary()),
                f"--kubeconfig={kubeconfig}",
                "--controllers=disruption-controller",
                "--leader-elect=false", "--secure-port=0",
                "--use-service-account-credentials=false", "--v=0",
            ],
        )  # fmt: skip
        # the controller is up once it has given a budget its status
        self.namespace("kube-system")
        deadline = time.monotonic() + START_TIMEOUT_S
        name = "rocewatch-startup-probe"
        self.pdb("kube-system", name, {"rocewatch.io/probe": "yes"}, 1)
        while time.monotonic() < deadline:
            for pname, proc in self.procs:
                if proc.poll() is not None:
                    raise KubeError(
                        f"{pname} exited with {proc.returncode}:\n{self.log_tail(pname)}"
                    )
            if self.read_pdb("kube-system", name).get("status", {}).get("observedGeneration"):
                self.policy().delete_namespaced_pod_disruption_budget(name, "kube-system")
                return
            time.sleep(0.25)
        raise KubeError(
            "kube-controller-manager gave no PodDisruptionBudget a status within "
            f"{START_TIMEOUT_S:.0f} s:\n{self.log_tail('kube-controller-manager')}"
        )

    def _spawn(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> None:
        log = (self.dir / f"{name}.log").open("wb")
        proc = subprocess.Popen(
            argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env=env, start_new_session=True,
        )  # fmt: skip
        log.close()
        self.procs.append((name, proc))

    def _wait(self, url: str, name: str, insecure: bool = False) -> None:
        ctx = None if insecure else ssl.create_default_context(cafile=str(self.ca_file))
        req = urllib.request.Request(url, headers={"Authorization": f"Bearer {self.admin_token}"})
        deadline = time.monotonic() + START_TIMEOUT_S
        last = ""
        while time.monotonic() < deadline:
            for pname, proc in self.procs:
                if proc.poll() is not None:
                    raise KubeError(
                        f"{pname} exited with {proc.returncode}:\n{self.log_tail(pname)}"
                    )
            try:
                with urllib.request.urlopen(req, timeout=5, context=ctx) as r:
                    if r.status == 200:
                        return
            except (OSError, urllib.error.URLError) as e:
                last = str(e)
            time.sleep(0.25)
        raise KubeError(
            f"{name} not ready within {START_TIMEOUT_S:.0f} s ({last}):\n{self.log_tail(name)}"
        )

    def log_tail(self, name: str, lines: int = 40) -> str:
        try:
            text = (self.dir / f"{name}.log").read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    def stop(self) -> None:
        for _, proc in reversed(self.procs):  # the API server before its store
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(20)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(10)
        self.procs = []

    # --- clients ---------------------------------------------------------------------------------
    def configuration(self, token: str | None = None) -> Any:
        from kubernetes import client

        conf = client.Configuration(
            host=self.url,
            api_key={"BearerToken": token or self.admin_token},
            api_key_prefix={"BearerToken": "Bearer"},
        )
        conf.ssl_ca_cert = str(self.ca_file)
        return conf

    def client(self, token: str | None = None) -> Any:
        """A kubernetes ApiClient; the admin's without a token."""
        from kubernetes import client

        return client.ApiClient(self.configuration(token))

    def core(self, token: str | None = None) -> Any:
        from kubernetes import client

        return client.CoreV1Api(self.client(token))

    def policy(self, token: str | None = None) -> Any:
        from kubernetes import client

        return client.PolicyV1Api(self.client(token))

    # --- what the controllers and kubelets would do ----------------------------------------------
    def namespace(self, name: str) -> str:
        """Create the namespace (once) and its ``default`` ServiceAccount."""
        from kubernetes.client.exceptions import ApiException

        if name in self._namespaces:
            return name
        core = self.core()
        for create, body in (
            (core.create_namespace, {"metadata": {"name": name}}),
            (
                lambda b: core.create_namespaced_service_account(name, b),
                {"metadata": {"name": "default", "namespace": name}},
            ),
        ):
            try:
                create(body)
            except ApiException as e:
                if e.status != 409:  # already there (the server made "default" itself)
                    raise
        self._namespaces.add(name)
        return name

    def node(self, name: str, taints: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        """A Node as a kubelet registers it: ``Ready=True`` in its status."""
        core = self.core()
        body: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
            "spec": {"taints": taints} if taints else {},
        }
        core.create_node(body)
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        ready = {
            "type": "Ready", "status": "True", "reason": "KubeletReady",
            "message": "kubelet is posting ready status",
            "lastHeartbeatTime": now, "lastTransitionTime": now,
        }  # fmt: skip
        core.patch_node_status(
            name, {"status": {"conditions": [ready]}},
            _content_type="application/strategic-merge-patch+json",
        )  # fmt: skip
        # The TaintNodesByCondition admission plugin taints every new Node not-ready; the node
        # lifecycle controller lifts it once the kubelet reports Ready. No controller runs here.
        core.patch_node(
            name, {"spec": {"taints": taints or None}},
            _content_type="application/merge-patch+json",
        )  # fmt: skip
        return self.read_node(name)

    def read_node(self, name: str) -> dict[str, Any]:
        resp = self.core().read_node(name, _preload_content=False)
        out: dict[str, Any] = json.loads(resp.data)
        return out

    def pod(
        self,
        ns: str,
        name: str,
        node: str,
        labels: dict[str, str],
        phase: str = "Running",
        owner: dict[str, Any] | None = None,
        annotations: dict[str, str] | None = None,
    ) -> None:
        """A Pod bound to ``node`` (no scheduler) whose kubelet reports ``phase`` (and, when
        Running, the ``Ready`` condition); ``owner``: its controller (an object as read)."""
        core = self.core()
        self.namespace(ns)
        meta: dict[str, Any] = {"name": name, "labels": labels}
        if annotations:
            meta["annotations"] = annotations
        if owner is not None:
            meta["ownerReferences"] = [
                {
                    "apiVersion": owner["apiVersion"],
                    "kind": owner["kind"],
                    "name": owner["metadata"]["name"],
                    "uid": owner["metadata"]["uid"],
                    "controller": True,
                }
            ]
        core.create_namespaced_pod(
            ns,
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": meta,
                "spec": {
                    "nodeName": node,
                    "automountServiceAccountToken": False,
                    "containers": [{"name": "c", "image": "registry.invalid/train:1"}],
                },
            },
        )
        status: dict[str, Any] = {"phase": phase}
        if phase == "Running":
            now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
            status["conditions"] = [
                {"type": t, "status": "True", "lastTransitionTime": now}
                for t in ("PodScheduled", "Initialized", "ContainersReady", "Ready")
            ]
        core.patch_namespaced_pod_status(
            name, ns, {"status": status}, _content_type="application/merge-patch+json"
        )

    def pods_on(self, node: str) -> dict[str, dict[str, Any]]:
        """The pods bound to ``node``, "namespace/name" -> the pod as read."""
        resp = self.core().list_pod_for_all_namespaces(
            field_selector=f"spec.nodeName={node}", _preload_content=False
        )
        return {
            f"{p['metadata']['namespace']}/{p['metadata']['name']}": p
            for p in json.loads(resp.data)["items"]
        }

    def finish_deletions(self, node: str) -> list[str]:
        """What the node's kubelet does once an evicted pod's containers stopped: the final
        delete (grace period 0) of each pod marked for deletion. Returns their names."""
        from kubernetes.client.exceptions import ApiException

        done = []
        for key, p in self.pods_on(node).items():
            if p["metadata"].get("deletionTimestamp"):
                ns, name = key.split("/", 1)
                with contextlib.suppress(ApiException):
                    self.core().delete_namespaced_pod(name, ns, grace_period_seconds=0)
                done.append(key)
        return done

    def daemonset(self, ns: str, name: str) -> dict[str, Any]:
        """A DaemonSet object (no controller runs it: its pods are made with ``pod(owner=)``)."""
        from kubernetes import client

        self.namespace(ns)
        labels = {"app": name}
        client.AppsV1Api(self.client()).create_namespaced_daemon_set(
            ns,
            {
                "apiVersion": "apps/v1",
                "kind": "DaemonSet",
                "metadata": {"name": name},
                "spec": {
                    "selector": {"matchLabels": labels},
                    "template": {
                        "metadata": {"labels": labels},
                        "spec": {"containers": [{"name": "c", "image": "registry.invalid/a:1"}]},
                    },
                },
            },
        )
        resp = client.AppsV1Api(self.client()).read_namespaced_daemon_set(
            name, ns, _preload_content=False
        )
        out: dict[str, Any] = json.loads(resp.data)
        return out

    def pdb(self, ns: str, name: str, labels: dict[str, str], min_available: int) -> None:
        """A PodDisruptionBudget (policy/v1) over the pods with ``labels``."""
        self.namespace(ns)
        self.policy().create_namespaced_pod_disruption_budget(
            ns,
            {
                "apiVersion": "policy/v1",
                "kind": "PodDisruptionBudget",
                "metadata": {"name": name},
                "spec": {"minAvailable": min_available, "selector": {"matchLabels": labels}},
            },
        )

    def read_pdb(self, ns: str, name: str) -> dict[str, Any]:
        resp = self.policy().read_namespaced_pod_disruption_budget(name, ns, _preload_content=False)
        out: dict[str, Any] = json.loads(resp.data)
        return out

    def apply(self, manifest: Path) -> None:
        """Create every object of a manifest as written (the admin's client)."""
        from kubernetes import utils

        utils.create_from_yaml(self.client(), str(manifest))

    def token(self, ns: str, service_account: str, seconds: int = 3600) -> str:
        """A ServiceAccount token from the TokenRequest API, as a projected volume gets one."""
        resp = self.core().create_namespaced_service_account_token(
            service_account, ns, {"spec": {"expirationSeconds": seconds}}
        )
        tok: str = resp.status.token
        return tok


def _stop_quietly(cluster: KubeCluster) -> None:
    with contextlib.suppress(Exception):
        cluster.stop()


def running_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KubeCluster]:
    """The ``kube_api`` session fixture's body: etcd + kube-apiserver, stopped after."""
    why = missing()
    if why:
        pytest.skip(f"needs a real kube-apiserver: {why} (get it: bash scripts/go_tools.sh)")
    cluster = KubeCluster(tmp_path_factory.mktemp("kube"))
    atexit.register(_stop_quietly, cluster)
    try:
        cluster.start()
    except KubeError as e:
        cluster.stop()
        pytest.fail(f"could not start the Kubernetes API server: {e}", pytrace=False)
    try:
        yield cluster
    finally:
        cluster.stop()
