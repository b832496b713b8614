"""The node agent's deployment files (Kubernetes DaemonSet, systemd unit, deploy/agent.yaml)
hold together: checked by parsing them (no Kubernetes API server or systemd runs here)."""

from __future__ import annotations

import configparser
import posixpath
import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml

from rocewatch.cli import build_parser
from rocewatch.config import Config, config_from_dict, load_config

ROOT = Path(__file__).resolve().parents[1]
K8S = ROOT / "deploy" / "kubernetes" / "rocewatch-agent.yaml"
UNIT = ROOT / "deploy" / "systemd" / "rocewatch-agent.service"
AGENT_YAML = ROOT / "deploy" / "agent.yaml"


@pytest.fixture(autouse=True)
def _password(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ROCEWATCH_KAFKA_PASSWORD", "not-a-secret")


@pytest.fixture(scope="module")
def docs() -> dict[str, dict[str, Any]]:
    out = {d["kind"]: d for d in yaml.safe_load_all(K8S.read_text()) if d}
    assert set(out) == {"Namespace", "ConfigMap", "DaemonSet"}
    return out


def _under(path: str, mount: str) -> bool:
    return posixpath.commonpath([path, mount]) == mount


def test_configs_load_and_agree(docs: dict[str, dict[str, Any]]) -> None:
    plain = load_config(AGENT_YAML)
    in_k8s = config_from_dict(yaml.safe_load(docs["ConfigMap"]["data"]["agent.yaml"]), "k8s")
    for cfg in (plain, in_k8s):
        assert isinstance(cfg, Config)
        cfg.agent.validate()
        assert cfg.kafka.sasl_plain_password == "not-a-secret"
    assert plain.kafka == in_k8s.kafka
    assert plain.agent.sysfs_root == "/sys" and in_k8s.agent.sysfs_root == "/host/sys"
    assert plain.agent.spool_dir == in_k8s.agent.spool_dir


def test_daemonset(docs: dict[str, dict[str, Any]]) -> None:
    ns = docs["Namespace"]["metadata"]["name"]
    cm = docs["ConfigMap"]
    ds = docs["DaemonSet"]
    assert ds["apiVersion"] == "apps/v1" and ds["metadata"]["namespace"] == ns
    assert cm["metadata"]["namespace"] == ns
    spec = ds["spec"]
    tmpl = spec["template"]
    labels = tmpl["metadata"]["labels"]
    assert spec["selector"]["matchLabels"].items() <= labels.items()
    pod = tmpl["spec"]
    assert pod["hostNetwork"] is True  # the ethtool ioctl reads the host's netdevs
    assert pod["dnsPolicy"] == "ClusterFirstWithHostNet"
    (c,) = pod["containers"]
    args = build_parser().parse_args(c["args"])
    assert args.command == "agent" and args.node == "$(NODE_NAME)"
    # /metrics on the port the container declares
    assert args.metrics_port in [p["containerPort"] for p in c["ports"] if p["name"] == "metrics"]
    env = {e["name"]: e for e in c["env"]}
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    assert env["ROCEWATCH_KAFKA_PASSWORD"]["valueFrom"]["secretKeyRef"]["name"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["name"]: m for m in c["volumeMounts"]}
    assert set(mounts) <= set(volumes)
    # the config file the args name is the ConfigMap's key, mounted there
    cmount = next(m for m in mounts.values() if m["mountPath"] == str(args.config))
    cvol = volumes[cmount["name"]]
    assert cvol["configMap"]["name"] == cm["metadata"]["name"]
    assert cmount["subPath"] in cm["data"]
    cfg = config_from_dict(yaml.safe_load(cm["data"][cmount["subPath"]]), "k8s")
    # sysfs: the host's /sys, read-only, where the config says
    sys_mount = next(m for m in mounts.values() if m["mountPath"] == cfg.agent.sysfs_root)
    assert sys_mount.get("readOnly") is True
    assert volumes[sys_mount["name"]]["hostPath"]["path"] == "/sys"
    # the spool survives the pod: a writable hostPath (the root filesystem is read-only)
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    spool = [m for m in mounts.values() if _under(cfg.agent.spool_dir, m["mountPath"])]
    assert len(spool) == 1 and not spool[0].get("readOnly", False)
    assert volumes[spool[0]["name"]]["hostPath"]["type"] == "DirectoryOrCreate"
    # the TLS CA file the config names is mounted from a secret
    assert cfg.kafka.ssl_cafile is not None
    tls = [m for m in mounts.values() if _under(cfg.kafka.ssl_cafile, m["mountPath"])]
    assert len(tls) == 1 and "secret" in volumes[tls[0]["name"]]
    assert c["resources"]["limits"]["memory"] and c["resources"]["requests"]["cpu"]


def test_systemd_unit() -> None:
    unit = configparser.ConfigParser(interpolation=None, strict=True)
    unit.optionxform = str  # type: ignore[assignment,method-assign]
    unit.read_string(UNIT.read_text())
    assert unit.sections() == ["Unit", "Service", "Install"]
    svc = unit["Service"]
    argv = shlex.split(svc["ExecStart"])
    assert posixpath.isabs(argv[0]) and posixpath.basename(argv[0]) == "rocewatch"
    args = build_parser().parse_args(argv[1:])
    assert args.command == "agent"
    assert svc["Restart"] == "always" and svc["Type"] == "simple"
    assert "network-online.target" in unit["Unit"]["After"]
    assert unit["Install"]["WantedBy"] == "multi-user.target"
    # the config it names is deploy/agent.yaml, installed there (see the unit's header)
    assert str(args.config) == "/etc/rocewatch/agent.yaml"
    assert f"deploy/agent.yaml {args.config}" in UNIT.read_text()
    cfg = load_config(AGENT_YAML)
    # with ProtectSystem=strict only the StateDirectory is writable: the spool must be there
    assert svc["ProtectSystem"] == "strict"
    state = "/var/lib/" + svc["StateDirectory"]
    assert _under(cfg.agent.spool_dir, state)
    assert svc["EnvironmentFile"].lstrip("-") == "/etc/rocewatch/agent.env"
