"""Drain and resume through slurmrestd instead of scontrol.

Node updates exist in slurmrestd from Slurm 23.02 (OpenAPI plugin v0.0.39) and, with the same
request shape, in v0.0.41 from 24.05:

* ``GET  /slurm/<v>/node/<name>``  -> ``{"nodes": [{"name", "state": [...], "reason", ...}],
  "errors": [...], "warnings": [...]}`` (``state`` is a list of flags, e.g. ``["IDLE", "DRAIN"]``)
* ``POST /slurm/<v>/node/<name>`` with an ``update_node_msg``: ``{"state": ["DRAIN"],
  "reason": "..."}`` or ``{"state": ["RESUME"]}``; the answer carries ``errors``.

Authentication is slurmrestd's JWT: ``X-SLURM-USER-NAME`` and ``X-SLURM-USER-TOKEN`` (the token
is never logged). The same idempotence as scontrol: other people's drains are left alone.
"""

from __future__ import annotations

import json
import logging
import ssl
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from typing import Any

from actions.executors import SlurmBackend, SlurmNode
from rocewatch.core.errors import ConfigError

log = logging.getLogger(__name__)

API_VERSIONS = ("v0.0.39", "v0.0.41")


@dataclass(frozen=True)
class SlurmRestConfig:
    url: str = "http://127.0.0.1:6820"
    api_version: str = "v0.0.41"
    user: str = "root"
    token: str | None = field(default=None, repr=False)  # a JWT; use ${ENV_VAR} in config
    ca_file: str | None = None  # to verify an https slurmrestd (e.g. behind a TLS proxy)
    timeout_s: float = 15.0

    def validate(self) -> None:
        if self.api_version not in API_VERSIONS:
            raise ConfigError(
                f"slurmrestd: api_version {self.api_version!r} cannot update nodes "
                f"(supported: {', '.join(API_VERSIONS)})"
            )
        u = urllib.parse.urlparse(self.url)
        if u.scheme not in ("http", "https") or not u.netloc:
            raise ConfigError(f"slurmrestd: url {self.url!r} must be http(s)://host:port")
        if self.timeout_s <= 0:
            raise ConfigError("slurmrestd: timeout_s must be positive")


class SlurmRestExecutor(SlurmBackend):
    name = "slurmrestd"

    def __init__(self, config: SlurmRestConfig) -> None:
        config.validate()
        self.config = config
        self._ctx = ssl.create_default_context(cafile=config.ca_file) if config.ca_file else None

    def _node_url(self, node: str) -> str:
        base = self.config.url.rstrip("/")
        return f"{base}/slurm/{self.config.api_version}/node/{urllib.parse.quote(node, safe='')}"

    def _show(self, node: str) -> SlurmNode | str:
        doc = self._request("GET", node, None)
        if isinstance(doc, str):
            return doc
        for n in doc.get("nodes") or []:
            if n.get("name") == node:
                state = n.get("state") or []
                if isinstance(state, str):  # tolerate a single string
                    state = [state]
                return SlurmNode("+".join(str(s) for s in state), str(n.get("reason") or ""))
        return f"failed: slurmrestd returned no node {node}"

    def _update(self, node: str, state: str, reason: str) -> str:
        body: dict[str, Any] = {"state": [state]}
        if reason:
            body["reason"] = reason
        doc = self._request("POST", node, body)
        return doc if isinstance(doc, str) else ""

    def _request(self, method: str, node: str, body: dict[str, Any] | None) -> dict[str, Any] | str:
        headers = {"Accept": "application/json", "X-SLURM-USER-NAME": self.config.user}
        if self.config.token:
            headers["X-SLURM-USER-TOKEN"] = self.config.token
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        req = urllib.request.Request(self._node_url(node), data, headers, method=method)
        try:
            with urllib.request.urlopen(req, timeout=self.config.timeout_s, context=self._ctx) as r:
                raw = r.read()
        except urllib.error.HTTPError as e:
            return f"failed: slurmrestd {e.code}: {_first_error(e.read()) or e.reason}"
        except (urllib.error.URLError, OSError) as e:
            reason = getattr(e, "reason", e)
            return f"failed: slurmrestd unreachable: {reason}"
        try:
            doc = json.loads(raw)
        except ValueError:
            return "failed: slurmrestd answered with invalid JSON"
        err = _first_error(doc)
        if err:
            return f"failed: slurmrestd: {err}"
        return doc if isinstance(doc, dict) else {}


def _first_error(body: bytes | dict[str, Any]) -> str:
    if isinstance(body, bytes):
        try:
            body = json.loads(body)
        except ValueError:
            return ""
    if not isinstance(body, dict):
        return ""
    for e in body.get("errors") or []:
        if isinstance(e, dict):
            return str(e.get("description") or e.get("error") or e)
    return ""
