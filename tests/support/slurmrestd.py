"""A slurmrestd stand-in for node reads and updates, built from the published OpenAPI schema.

Debian's Slurm here is 22.05, whose slurmrestd cannot update nodes (that arrived with 23.02,
plugin v0.0.39; v0.0.41 from 24.05), so the REST backend is tested against this. What it holds
to, from the v0.0.39 / v0.0.41 schemas:

* ``GET /slurm/<v>/node/<name>`` answers ``{"meta", "nodes": [node], "warnings", "errors"}``;
  a node's ``state`` is a list of flags (``["IDLE", "DRAIN"]``), with ``reason`` and
  ``reason_set_by_user``.
* ``POST /slurm/<v>/node/<name>`` takes an ``update_node_msg``: only its documented fields,
  ``state`` a list of the schema's enum values; DRAIN needs a ``reason`` (as slurmctld
  demands); RESUME clears DRAIN and the reason. The answer is an ``openapi_resp`` with
  ``errors``.
* only the served API versions exist (others 404); ``X-SLURM-USER-NAME`` and
  ``X-SLURM-USER-TOKEN`` must match (401 otherwise).
"""

from __future__ import annotations

import json
import re
import threading
from http.server import BaseHTTPRequestHandler
from typing import Any

from tests.support.http_standin import HttpStandIn, read_body, reply_json

UPDATE_NODE_FIELDS = {
    "comment",
    "cpu_bind",
    "extra",
    "features",
    "features_act",
    "gres",
    "address",
    "hostname",
    "name",
    "state",
    "reason",
    "reason_uid",
    "resume_after",
    "weight",
}
STATE_ENUM = {
    "INVALID", "FUTURE", "DOWN", "IDLE", "ALLOCATED", "ERROR", "MIXED", "PERFCTRS",
    "RESERVED", "UNDRAIN", "CLOUD", "RESUME", "DRAIN", "COMPLETING", "NOT_RESPONDING",
    "POWERED_DOWN", "FAIL", "POWERING_UP", "MAINTENANCE", "REBOOT_REQUESTED",
    "REBOOT_CANCELED", "POWERING_DOWN", "DYNAMIC_FUTURE", "REBOOT_ISSUED", "PLANNED",
    "INVALID_REG", "POWER_DOWN", "POWER_UP", "POWER_DRAIN", "DYNAMIC_NORM",
}  # fmt: skip


class SlurmRestStandIn(HttpStandIn):
    def __init__(self, versions: tuple[str, ...], user: str, token: str) -> None:
        self.versions = versions
        self.user, self.token = user, token
        self.nodes: dict[str, dict[str, Any]] = {}
        self.requests: list[tuple[str, str, Any]] = []
        self.lock = threading.Lock()
        super().__init__()

    def add_node(self, name: str, state: list[str], reason: str = "", by: str = "") -> None:
        self.nodes[name] = {
            "name": name,
            "state": list(state),
            "reason": reason,
            "reason_set_by_user": by,
        }

    def serve(self, h: BaseHTTPRequestHandler, method: str) -> None:
        if method not in ("GET", "POST"):
            reply_json(h, 405, {"errors": [{"description": f"{method} not allowed"}]})
            return
        raw = read_body(h)
        body = json.loads(raw) if raw else None
        self.requests.append((method, h.path, body))
        code, errors, extra = self._route(h, method, body)
        doc = {
            "meta": {"plugin": {"type": "openapi/slurmctld", "name": "Slurm OpenAPI slurmctld"}},
            **extra,
            "warnings": [],
            "errors": [
                {"description": d, "error_number": 9000, "error": "error", "source": "stand-in"}
                for d in errors
            ],
        }
        reply_json(h, code, doc)

    def _route(
        self, h: BaseHTTPRequestHandler, method: str, body: Any
    ) -> tuple[int, list[str], dict[str, Any]]:
        if h.headers.get("X-SLURM-USER-NAME") != self.user or (
            h.headers.get("X-SLURM-USER-TOKEN") != self.token
        ):
            return 401, ["Authentication failure"], {}
        m = re.fullmatch(r"/slurm/(v[0-9.]+)/node/([^/?]+)", h.path)
        if not m or m.group(1) not in self.versions:
            return 404, [f"Unable to find path {h.path}"], {}
        name = m.group(2)
        with self.lock:
            node = self.nodes.get(name)
            if node is None:
                return 404, [f"Unable to query node {name}: Invalid node name specified"], {}
            if method == "GET":
                return 200, [], {"nodes": [dict(node)]}
            if not isinstance(body, dict):
                return 400, ["update_node_msg must be an object"], {}
            unknown = sorted(set(body) - UPDATE_NODE_FIELDS)
            if unknown:
                return 400, [f"unknown field(s) in update_node_msg: {', '.join(unknown)}"], {}
            state = body.get("state", [])
            if not isinstance(state, list) or not all(s in STATE_ENUM for s in state):
                return 400, [f"state must be a list of node state flags: {state!r}"], {}
            if "DRAIN" in state:
                if not body.get("reason"):
                    return 400, ["You must specify a reason when DOWNING or DRAINING a node"], {}
                if "DRAIN" not in node["state"]:
                    node["state"].append("DRAIN")
                node["reason"] = body["reason"]
                node["reason_set_by_user"] = self.user
            if "RESUME" in state or "UNDRAIN" in state:
                if "DRAIN" not in node["state"]:
                    return 400, ["Invalid node state specified"], {}
                node["state"] = [s for s in node["state"] if s != "DRAIN"]
                node["reason"] = ""
                node["reason_set_by_user"] = ""
            return 200, [], {}
