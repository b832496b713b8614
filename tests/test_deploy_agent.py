"""The node agent's deployment files (Kubernetes DaemonSet, systemd unit, deploy/agent.yaml)
hold together: checked by parsing them (no Kubernetes API server or systemd runs here). Both run
the lean rocewatch-agent distribution (agent/), whose wheel is built and run here."""

from __future__ import annotations

import configparser
import os
import posixpath
import shlex
import shutil
import subprocess
import sys
import tomllib
import zipfile
from email.parser import Parser
from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml

from rocewatch.agent_cli import build_parser
from rocewatch.config import (
    AgentFileConfig,
    agent_config_from_dict,
    load_agent_config,
)

ROOT = Path(__file__).resolve().parents[1]
K8S = ROOT / "deploy" / "kubernetes" / "rocewatch-agent.yaml"
UNIT = ROOT / "deploy" / "systemd" / "rocewatch-agent.service"
AGENT_YAML = ROOT / "deploy" / "agent.yaml"
AGENT_DIST = ROOT / "agent"
FIX_SYS = ROOT / "tests" / "fixtures" / "mlx5" / "sys"
# what a GPU node must not be made to install (issue 25): the detectors' and services' own
FORBIDDEN = ("polars", "numpy", "scikit-learn", "sklearn", "sqlalchemy", "alembic", "grpcio",
             "pyarrow", "matplotlib", "kubernetes", "pygnmi", "protobuf")  # fmt: skip


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
    plain = load_agent_config(AGENT_YAML)
    in_k8s = agent_config_from_dict(yaml.safe_load(docs["ConfigMap"]["data"]["agent.yaml"]), "k8s")
    for cfg in (plain, in_k8s):
        assert isinstance(cfg, AgentFileConfig)
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
    # the lean image (agent/Dockerfile) and its command
    assert c["image"].rsplit(":", 1)[0].endswith("/rocewatch-agent")
    assert c["command"] == ["rocewatch-agent"]
    assert 'ENTRYPOINT ["rocewatch-agent"]' in (AGENT_DIST / "Dockerfile").read_text()
    args = build_parser().parse_args(c["args"])
    assert args.node == "$(NODE_NAME)"
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
    cfg = agent_config_from_dict(yaml.safe_load(cm["data"][cmount["subPath"]]), "k8s")
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
    # the lean distribution's command (installed as the unit's header says)
    assert posixpath.isabs(argv[0]) and posixpath.basename(argv[0]) == "rocewatch-agent"
    assert "pip install ./agent" in UNIT.read_text()
    args = build_parser().parse_args(argv[1:])
    assert svc["Restart"] == "always" and svc["Type"] == "simple"
    assert "network-online.target" in unit["Unit"]["After"]
    assert unit["Install"]["WantedBy"] == "multi-user.target"
    # the config it names is deploy/agent.yaml, installed there (see the unit's header)
    assert str(args.config) == "/etc/rocewatch/agent.yaml"
    assert f"deploy/agent.yaml {args.config}" in UNIT.read_text()
    cfg = load_agent_config(AGENT_YAML)
    # with ProtectSystem=strict only the StateDirectory is writable: the spool must be there
    assert svc["ProtectSystem"] == "strict"
    state = "/var/lib/" + svc["StateDirectory"]
    assert _under(cfg.agent.spool_dir, state)
    assert svc["EnvironmentFile"].lstrip("-") == "/etc/rocewatch/agent.env"


@pytest.mark.slow  # the services' loader imports every detector
def test_agent_reads_what_the_services_read(docs: dict[str, dict[str, Any]]) -> None:
    from rocewatch.config import config_from_dict, load_config

    k8s = yaml.safe_load(docs["ConfigMap"]["data"]["agent.yaml"])
    for lean, full in (
        (load_agent_config(AGENT_YAML), load_config(AGENT_YAML)),
        (agent_config_from_dict(k8s, "k8s"), config_from_dict(k8s, "k8s")),
    ):
        assert lean.kafka == full.kafka and lean.agent == full.agent
        assert lean.metrics_port == full.metrics_port


def _name(requirement: str) -> str:
    for i, ch in enumerate(requirement):
        if not (ch.isalnum() or ch in "-_."):
            return requirement[:i].lower().replace("_", "-")
    return requirement.lower().replace("_", "-")


def test_lean_distribution_declares_only_the_agent() -> None:
    """agent/pyproject.toml: none of the services' heavy dependencies; its command is the
    agent's; the modules it packages exist (agent/setup.py)."""
    meta = tomllib.loads((AGENT_DIST / "pyproject.toml").read_text())
    project = meta["project"]
    deps = {_name(d) for d in project["dependencies"]}
    assert not deps & set(FORBIDDEN), deps
    assert project.get("optional-dependencies") is None  # an extra could bring them back
    assert {"kafka-python", "pyyaml", "orjson"} <= deps
    assert project["scripts"] == {"rocewatch-agent": "rocewatch.agent_cli:main"}
    full = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    # the whole service still installs the agent: every lean requirement is one of its own
    assert deps <= {_name(d) for d in full["dependencies"]}


def _isolation() -> list[str]:
    """Build with this interpreter's setuptools when it can make wheels (no download); else let
    pip fetch what agent/pyproject.toml's build-system asks for."""
    try:
        import setuptools

        major = int(setuptools.__version__.split(".")[0])
    except (ImportError, ValueError):
        return []
    try:
        import wheel  # noqa: F401  (setuptools < 70 makes wheels with it)
    except ImportError:
        return ["--no-build-isolation"] if major >= 70 else []
    return ["--no-build-isolation"] if major >= 61 else []


@pytest.mark.slow  # builds a wheel (pip, setuptools: a few seconds)
def test_lean_wheel_runs_the_agent_alone(tmp_path: Path) -> None:
    """`pip wheel ./agent`: its metadata requires none of the heavy packages, it holds only the
    agent's modules, and the agent runs from it (--once, and the Kafka sink's encoding) with
    Polars, NumPy, protobuf and the rest of the product made unimportable."""
    src = tmp_path / "src"
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info", "build")
    for d in ("agent", "rocewatch", "collector"):
        shutil.copytree(ROOT / d, src / d, ignore=ignore)  # a private tree: builds write into it
    dist = tmp_path / "dist"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", *_isolation(), "-q",
         "-w", str(dist), str(src / "agent")],
        check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    (whl,) = dist.glob("rocewatch_agent-*.whl")
    with zipfile.ZipFile(whl) as z:
        names = z.namelist()
        info = next(n for n in names if n.endswith(".dist-info/METADATA"))
        metadata = Parser().parsestr(z.read(info).decode())
        z.extractall(tmp_path / "site")
    import rocewatch

    assert metadata["Name"] == "rocewatch-agent" and metadata["Version"] == rocewatch.__version__
    requires = {_name(r) for r in metadata.get_all("Requires-Dist") or []}
    assert requires and not requires & set(FORBIDDEN), requires
    modules = {n for n in names if n.endswith(".py")}
    assert "collector/nic/agent.py" in modules and "collector/mappings/mlx5.yaml" in names
    assert not {m for m in modules if m.startswith(("detectors/", "actions/", "storage/"))}
    assert not modules & {"rocewatch/pipeline.py", "rocewatch/core/model.py", "collector/decode.py"}

    site = tmp_path / "site"
    script = f"""
import importlib.abc, json, sys
BLOCKED = {FORBIDDEN!r} + ("google", "detectors", "actions", "storage", "pyarrow")

class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ImportError("the lean agent must not import " + name)
        return None

sys.meta_path.insert(0, Block())
sys.path.insert(0, {str(site)!r})
from rocewatch.agent_cli import main
rc = main(sys.argv[1:])
from collector.nic.kafka_output import KafkaSnapshotOutput
from rocewatch.config import KafkaConfig
out = sys.argv[sys.argv.index("--out") + 1]
msgs = KafkaSnapshotOutput(KafkaConfig(), "n1").encode(open(out, "rb").read().splitlines(True))
ours = {{m: getattr(sys.modules[m], "__file__", None) for m in sys.modules
        if m.split(".")[0] in ("rocewatch", "collector")}}
print(json.dumps({{"rc": rc, "msgs": len(msgs), "files": ours}}))
"""
    out = tmp_path / "once.jsonl"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    res = subprocess.run(
        [sys.executable, "-c", script, "--once", "--node", "n1", "--sysfs-root", str(FIX_SYS),
         "--out", str(out)],
        capture_output=True, text=True, timeout=60, cwd=tmp_path, env=env,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    got = orjson.loads(res.stdout.splitlines()[-1])
    assert got["rc"] == 0 and got["msgs"] == 1
    assert [orjson.loads(x)["nic"] for x in out.read_bytes().splitlines()] == ["mlx5_0", "mlx5_1"]
    # every module of ours it ran came from the wheel, not from this checkout
    assert got["files"] and all(
        f is None or Path(f).is_relative_to(site) for f in got["files"].values()
    ), got["files"]
