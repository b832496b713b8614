"""A local stand-in for the Kubernetes API server, for the parts rocewatch uses.

No API server runs here, so the executor's tests talk to this one through the real
``kubernetes`` client. It enforces the semantics a wrong client would trip over:

* ``PATCH`` of a Node with ``application/merge-patch+json`` (RFC 7386: maps merge, ``null``
  deletes, lists are replaced) or ``application/strategic-merge-patch+json`` (maps merge;
  ``spec.taints`` is an atomic list, so it is replaced as a whole, like any list without a
  merge key; ``status.conditions`` merges by ``type`` and honours ``$patch: delete``).
  JSON patch and apply patches answer 415.
* ``metadata.resourceVersion`` in a patch is a precondition: a stale one answers 409 Conflict
  with a ``Status`` object, as the real server does. Every write bumps the version.
* the main resource ignores ``status`` and the ``/status`` subresource ignores everything but
  ``status`` and metadata labels/annotations.
* requests need ``Authorization: Bearer <token>`` (401 otherwise) and are checked against the
  ClusterRole rules loaded from an RBAC manifest (403 for anything the role does not grant), so
  the least-privilege manifest in deploy/ is exercised by every test.
* Events are created in a namespace; Pods are listed cluster-wide with ``fieldSelector``
  ``spec.nodeName=...`` and equality ``labelSelector``.

``before_write`` lets a test act as another writer (the kubelet, an operator) between the
client's read and its write, to provoke real conflicts.
"""

from __future__ import annotations

import copy
import json
import re
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

import yaml

from tests.support.http_standin import HttpStandIn, read_body, reply_json

MERGE = "application/merge-patch+json"
STRATEGIC = "application/strategic-merge-patch+json"


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, dict) else {}
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = merge_patch(out.get(k), v)
    return out


# Lists with a strategic merge key, by path; every other list (spec.taints among them) is atomic.
MERGE_KEYS = {("status", "conditions"): "type", ("status", "addresses"): "type"}


def strategic_merge(target: Any, patch: Any, path: tuple[str, ...] = ()) -> Any:
    if not isinstance(patch, dict):
        if isinstance(patch, list) and path in MERGE_KEYS:
            return _merge_list(target if isinstance(target, list) else [], patch, MERGE_KEYS[path])
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, dict) else {}
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = strategic_merge(out.get(k), v, (*path, k))
    return out


def _merge_list(cur: list[Any], patch: list[Any], key: str) -> list[Any]:
    out = [copy.deepcopy(x) for x in cur]
    for item in patch:
        if not isinstance(item, dict) or key not in item:
            raise ValueError(f"list item lacks its merge key {key!r}")
        idx = next((i for i, x in enumerate(out) if x.get(key) == item[key]), None)
        if item.get("$patch") == "delete":
            if idx is not None:
                del out[idx]
            continue
        if idx is None:
            out.append(copy.deepcopy(item))
        else:
            out[idx] = strategic_merge(out[idx], item)
    return out


class ApiError(Exception):
    def __init__(self, code: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.code, self.reason, self.message = code, reason, message


def load_rules(rbac_manifest: Path) -> list[dict[str, Any]]:
    """The rules of every ClusterRole and Role in a manifest."""
    rules: list[dict[str, Any]] = []
    for doc in yaml.safe_load_all(rbac_manifest.read_text()):
        if doc and doc.get("kind") in ("ClusterRole", "Role"):
            rules += doc.get("rules") or []
    return rules


class KubeApiStandIn(HttpStandIn):
    """Start with ``with KubeApiStandIn(rules, token) as api:``; ``api.url`` is the base URL."""

    def __init__(self, rules: list[dict[str, Any]], token: str) -> None:
        self.rules = rules
        self.token = token
        self.nodes: dict[str, dict[str, Any]] = {}
        self.events: list[dict[str, Any]] = []
        self.pods: list[dict[str, Any]] = []
        self.requests: list[tuple[str, str, str]] = []  # (verb, path, content-type)
        self.before_write: Callable[[str, KubeApiStandIn], None] | None = None
        self._rv = 100
        self.lock = threading.RLock()
        super().__init__()

    # --- fixtures --------------------------------------------------------------------------------
    def add_node(self, name: str, **spec: Any) -> dict[str, Any]:
        with self.lock:
            node = {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {"name": name, "uid": f"uid-{name}", "labels": {}, "annotations": {}},
                "spec": dict(spec),
                "status": {
                    "conditions": [
                        {"type": "Ready", "status": "True", "reason": "KubeletReady"},
                    ]
                },
            }
            self._bump(node)
            self.nodes[name] = node
            return node

    def add_pod(self, ns: str, name: str, node: str, labels: dict[str, str]) -> None:
        with self.lock:
            pod = {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": name, "namespace": ns, "labels": labels, "uid": f"p-{name}"},
                "spec": {"nodeName": node, "containers": [{"name": "c", "image": "x"}]},
                "status": {"phase": "Running"},
            }
            self._bump(pod)
            self.pods.append(pod)

    def write(self, name: str, fn: Callable[[dict[str, Any]], None]) -> None:
        """Another writer changes a node (bumping its resourceVersion)."""
        with self.lock:
            fn(self.nodes[name])
            self._bump(self.nodes[name])

    def _bump(self, obj: dict[str, Any]) -> None:
        self._rv += 1
        obj["metadata"]["resourceVersion"] = str(self._rv)

    # --- HTTP ------------------------------------------------------------------------------------
    def serve(self, h: BaseHTTPRequestHandler, method: str) -> None:
        url = urlparse(h.path)
        ctype = (h.headers.get("Content-Type") or "").split(";")[0].strip()
        raw = read_body(h)
        self.requests.append((method, url.path, ctype))
        try:
            if h.headers.get("Authorization") != f"Bearer {self.token}":
                raise ApiError(401, "Unauthorized", "Unauthorized")
            code, body = self._route(method, url.path, parse_qs(url.query), ctype, raw)
        except ApiError as e:
            code, body = e.code, self._status(e)
        reply_json(h, code, body)

    @staticmethod
    def _status(e: ApiError) -> dict[str, Any]:
        return {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": e.message,
            "reason": e.reason,
            "code": e.code,
        }

    def _authorize(self, verb: str, resource: str) -> None:
        for r in self.rules:
            if "" not in (r.get("apiGroups") or []):
                continue
            res, verbs = r.get("resources") or [], r.get("verbs") or []
            if (resource in res or "*" in res) and (verb in verbs or "*" in verbs):
                return
        raise ApiError(
            403, "Forbidden", f'cannot {verb} resource "{resource}" in API group "" (RBAC)'
        )

    def _route(
        self, method: str, path: str, q: dict[str, list[str]], ctype: str, raw: bytes
    ) -> tuple[int, Any]:
        m = re.fullmatch(r"/api/v1/nodes/([^/]+)(/status)?", path)
        if m:
            name, sub = m.group(1), m.group(2)
            resource = "nodes/status" if sub else "nodes"
            verb = {"GET": "get", "PATCH": "patch", "PUT": "update", "DELETE": "delete"}[method]
            self._authorize(verb, resource)
            with self.lock:
                node = self.nodes.get(name)
                if node is None:
                    raise ApiError(404, "NotFound", f'nodes "{name}" not found')
                if method == "GET":
                    return 200, node
                if method != "PATCH":
                    raise ApiError(405, "MethodNotAllowed", f"{method} is not served here")
            if self.before_write is not None:
                self.before_write(name, self)
            return 200, self._patch(name, bool(sub), ctype, raw)
        if path == "/api/v1/nodes" and method == "GET":
            self._authorize("list", "nodes")
            with self.lock:
                return 200, {"kind": "NodeList", "items": list(self.nodes.values())}
        m = re.fullmatch(r"/api/v1/namespaces/([^/]+)/events", path)
        if m and method == "POST":
            self._authorize("create", "events")
            ev = json.loads(raw)
            if ev.get("metadata", {}).get("namespace", m.group(1)) != m.group(1):
                raise ApiError(400, "BadRequest", "the namespace of the object does not match")
            for k in ("involvedObject", "reason", "message"):
                if not ev.get(k):
                    raise ApiError(422, "Invalid", f"Event.{k}: Required value")
            with self.lock:
                ev.setdefault("metadata", {})["namespace"] = m.group(1)
                self._bump(ev)
                self.events.append(ev)
            return 201, ev
        if path == "/api/v1/pods" and method == "GET":
            self._authorize("list", "pods")
            return 200, {"kind": "PodList", "metadata": {}, "items": self._pods(q)}
        raise ApiError(404, "NotFound", f"the server could not find the requested resource {path}")

    def _pods(self, q: dict[str, list[str]]) -> list[dict[str, Any]]:
        want_node = None
        for sel in q.get("fieldSelector", []):
            for part in sel.split(","):
                k, _, v = part.partition("=")
                if k != "spec.nodeName":
                    raise ApiError(400, "BadRequest", f"field label not supported: {k}")
                want_node = v
        want_labels: dict[str, str] = {}
        for sel in q.get("labelSelector", []):
            for part in sel.split(","):
                k, _, v = part.partition("=")
                want_labels[k] = v
        with self.lock:
            return [
                p
                for p in self.pods
                if (want_node is None or p["spec"]["nodeName"] == want_node)
                and all(p["metadata"]["labels"].get(k) == v for k, v in want_labels.items())
            ]

    def _patch(self, name: str, status: bool, ctype: str, raw: bytes) -> dict[str, Any]:
        if ctype not in (MERGE, STRATEGIC):
            raise ApiError(
                415,
                "UnsupportedMediaType",
                f"the body of the request was in an unknown format: {ctype}",
            )
        try:
            patch = json.loads(raw)
        except ValueError as e:
            raise ApiError(400, "BadRequest", f"invalid JSON: {e}") from e
        if not isinstance(patch, dict):
            raise ApiError(400, "BadRequest", "a merge patch must be an object")
        with self.lock:
            node = self.nodes[name]
            want_rv = (patch.get("metadata") or {}).get("resourceVersion")
            if want_rv is not None and want_rv != node["metadata"]["resourceVersion"]:
                raise ApiError(
                    409,
                    "Conflict",
                    f'Operation cannot be fulfilled on nodes "{name}": the object has been '
                    "modified; please apply your changes to the latest version and try again",
                )
            if status:
                patch = {k: v for k, v in patch.items() if k in ("status", "metadata")}
            else:
                patch = {k: v for k, v in patch.items() if k != "status"}
            merge = merge_patch if ctype == MERGE else strategic_merge
            try:
                new = merge(node, patch)
            except ValueError as e:
                raise ApiError(422, "Invalid", str(e)) from e
            for t in (new.get("spec") or {}).get("taints") or []:
                if t.get("effect") not in ("NoSchedule", "PreferNoSchedule", "NoExecute"):
                    raise ApiError(
                        422, "Invalid", f"spec.taints: invalid effect {t.get('effect')!r}"
                    )
                if not t.get("key"):
                    raise ApiError(422, "Invalid", "spec.taints.key: Required value")
            keys = [(t["key"], t["effect"]) for t in (new.get("spec") or {}).get("taints") or []]
            if len(keys) != len(set(keys)):
                raise ApiError(422, "Invalid", "spec.taints: Duplicate value")
            new["metadata"]["name"] = name
            self._bump(new)
            self.nodes[name] = new
            return new
