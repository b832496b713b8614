"""docker-compose.yml, Dockerfile and deploy/rocewatch.yaml hold together (checked by parsing:
no Docker engine runs here, and the docker CLI is never called)."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
COMPOSE = ROOT / "docker-compose.yml"
DOCKERFILE = ROOT / "Dockerfile"

# Host paths mounted by the compose file that another change adds to the repo; checked once present.
NOT_YET_IN_REPO = {"./storage/grafana/provisioning"}
HEALTHCHECKED = ("kafka", "postgres", "detector")
DEPENDS_CONDITIONS = {"service_started", "service_healthy", "service_completed_successfully"}
SHELLS = {"sh", "bash", "/bin/sh", "/bin/bash", "/usr/bin/env sh"}


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    doc = yaml.safe_load(COMPOSE.read_text())
    assert isinstance(doc, dict) and isinstance(doc.get("services"), dict), "no services mapping"
    return doc


@pytest.fixture(scope="module")
def services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return compose["services"]


def _dockerfile_instructions() -> list[tuple[str, str]]:
    text = DOCKERFILE.read_text().replace("\\\n", " ")
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def _exec_form(value: str) -> list[str]:
    value = value.strip()
    return json.loads(value) if value.startswith("[") else shlex.split(value)


def _argv(value: Any) -> list[str]:
    if value is None:
        return []
    return [str(x) for x in value] if isinstance(value, list) else shlex.split(str(value))


def _dependencies(svc: dict[str, Any]) -> dict[str, str]:
    deps = svc.get("depends_on") or {}
    if isinstance(deps, list):
        return {d: "service_started" for d in deps}
    return {name: (spec or {}).get("condition", "service_started") for name, spec in deps.items()}


def _is_rocewatch_image(svc: dict[str, Any]) -> bool:
    return "build" in svc or str(svc.get("image", "")).split(":")[0].endswith("rocewatch")


def _rocewatch_invocations(svc: dict[str, Any], image_entrypoint: list[str]) -> list[list[str]]:
    """Every ``rocewatch ...`` argv the service runs (argv without the program name)."""
    entrypoint = (
        _argv(svc["entrypoint"])
        if "entrypoint" in svc
        else (image_entrypoint if _is_rocewatch_image(svc) else [])
    )
    argv = entrypoint + _argv(svc.get("command"))
    if not argv:
        return []
    if Path(argv[0]).name == "rocewatch":
        return [argv[1:]]
    if argv[0] in SHELLS and "-c" in argv:
        script = argv[argv.index("-c") + 1]
        found = []
        for part in re.split(r"&&|\|\||;|\||\n", script):
            words = shlex.split(part)
            while words and (
                ("=" in words[0] and not words[0].startswith("-")) or words[0] == "exec"
            ):
                words = words[1:]  # VAR=value prefixes, exec
            if words and Path(words[0]).name == "rocewatch":
                found.append(words[1:])
        return found
    return []


def _host_mounts(svc: dict[str, Any]) -> list[tuple[str, str]]:
    out = []
    for vol in svc.get("volumes") or []:
        if isinstance(vol, dict):
            if vol.get("type") == "bind":
                out.append((str(vol["source"]), str(vol["target"])))
        else:
            src, _, rest = str(vol).partition(":")
            if src.startswith((".", "/", "~")):
                out.append((src, rest.split(":")[0]))
    return out


def _container_paths(svc: dict[str, Any]) -> list[str]:
    targets = []
    for vol in svc.get("volumes") or []:
        if isinstance(vol, dict):
            targets.append(str(vol["target"]))
        else:
            parts = str(vol).split(":")
            targets.append(parts[1] if len(parts) > 1 else parts[0])
    return targets


# ----------------------------------------------------------------------------- compose


def test_every_service_has_image_or_build(services: dict[str, dict[str, Any]]) -> None:
    missing = [name for name, svc in services.items() if not (svc.get("image") or svc.get("build"))]
    assert not missing, f"services without image or build: {missing}"


def test_expected_services_present(services: dict[str, dict[str, Any]]) -> None:
    for name in ("kafka", "postgres", "grafana", "detector"):
        assert name in services, f"missing service {name}"
    assert str(services["kafka"]["image"]).startswith("apache/kafka:4")
    assert str(services["postgres"]["image"]).startswith("postgres:16")
    assert str(services["grafana"]["image"]).startswith("grafana/grafana")


@pytest.mark.parametrize("name", HEALTHCHECKED)
def test_healthchecks(services: dict[str, dict[str, Any]], name: str) -> None:
    hc = services[name].get("healthcheck")
    assert hc and hc.get("test"), f"{name} has no healthcheck"
    test = " ".join(_argv(hc["test"]))
    expected = {
        "kafka": "kafka-broker-api-versions.sh",
        "postgres": "pg_isready",
        "detector": "9464/metrics",
    }[name]
    assert expected in test, f"{name} healthcheck {test!r} does not use {expected}"


def test_kafka_is_single_node_kraft(services: dict[str, dict[str, Any]]) -> None:
    env = services["kafka"]["environment"]
    for key in (
        "KAFKA_NODE_ID",
        "KAFKA_PROCESS_ROLES",
        "KAFKA_LISTENERS",
        "KAFKA_ADVERTISED_LISTENERS",
        "KAFKA_CONTROLLER_LISTENER_NAMES",
        "KAFKA_CONTROLLER_QUORUM_VOTERS",
        "KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR",
    ):
        assert key in env, f"kafka environment lacks {key}"
    assert set(str(env["KAFKA_PROCESS_ROLES"]).split(",")) == {"broker", "controller"}
    assert str(env["KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR"]) == "1"


def test_depends_on_references_exist(services: dict[str, dict[str, Any]]) -> None:
    for name, svc in services.items():
        for dep, condition in _dependencies(svc).items():
            assert dep in services, f"{name} depends on unknown service {dep}"
            assert dep != name
            assert condition in DEPENDS_CONDITIONS, f"{name} -> {dep}: bad condition {condition}"
            if condition == "service_healthy":
                assert services[dep].get("healthcheck"), (
                    f"{name} waits for {dep} healthy; it has no healthcheck"
                )


def test_detector_waits_for_kafka_and_postgres(services: dict[str, dict[str, Any]]) -> None:
    deps = _dependencies(services["detector"])
    assert deps.get("kafka") == "service_healthy"
    assert deps.get("postgres") == "service_healthy"


def test_named_volumes_declared(
    compose: dict[str, Any], services: dict[str, dict[str, Any]]
) -> None:
    declared = set((compose.get("volumes") or {}).keys())
    for name, svc in services.items():
        for vol in svc.get("volumes") or []:
            if isinstance(vol, dict):
                src = vol.get("source") if vol.get("type") == "volume" else None
            else:
                parts = str(vol).split(":")
                src = (
                    parts[0]
                    if len(parts) > 1 and not parts[0].startswith((".", "/", "~"))
                    else None
                )
            if src:
                assert src in declared, f"{name} uses undeclared volume {src}"


def test_mounted_host_paths_exist(services: dict[str, dict[str, Any]]) -> None:
    mounts = [(name, src) for name, svc in services.items() for src, _ in _host_mounts(svc)]
    assert ("detector", "./deploy/rocewatch.yaml") in mounts
    for name, src in mounts:
        if src in NOT_YET_IN_REPO and not (ROOT / src).exists():
            continue
        assert (ROOT / src).exists(), f"{name} mounts {src}, which is not in the repo"


def test_rocewatch_commands_parse(services: dict[str, dict[str, Any]]) -> None:
    from rocewatch.cli import build_parser  # lazily: the CLI is another module's

    entrypoint = next(
        _exec_form(rest) for word, rest in _dockerfile_instructions() if word == "ENTRYPOINT"
    )
    used: dict[str, list[list[str]]] = {}
    for name, svc in services.items():
        for argv in _rocewatch_invocations(svc, entrypoint):
            used.setdefault(name, []).append(argv)
            try:
                args = build_parser().parse_args(argv)
            except SystemExit as e:
                pytest.fail(
                    f"service {name}: `rocewatch {shlex.join(argv)}` does not parse (exit {e.code})"
                )
            config = getattr(args, "config", None)
            if config is not None:
                assert any(
                    str(config) == t or str(config).startswith(t.rstrip("/") + "/")
                    for t in _container_paths(svc)
                ), f"{name}: --config {config} is not mounted"
    subcommands = {argv[0] for calls in used.values() for argv in calls if argv}
    assert {"simulate", "publish", "detect"} <= subcommands, f"rocewatch commands found: {used}"
    assert any(argv[0] == "detect" for argv in used.get("detector", [])), used


# ----------------------------------------------------------------------------- Dockerfile


def test_dockerfile() -> None:
    instr = _dockerfile_instructions()
    words = [w for w, _ in instr]
    assert words[0] in ("FROM", "ARG"), "Dockerfile must start with FROM"
    froms = [rest for w, rest in instr if w == "FROM"]
    assert froms and froms[-1].split()[0].startswith("python:3.11-slim")
    entrypoints = [_exec_form(rest) for w, rest in instr if w == "ENTRYPOINT"]
    assert entrypoints and entrypoints[-1] == ["rocewatch"]
    runs = " ".join(rest for w, rest in instr if w == "RUN")
    assert re.search(r"pip install\s+(-\S+\s+)*[\"']?\.(\[[\w,]+\])?[\"']?(\s|$)", runs), (
        "the Dockerfile does not pip install the package"
    )
    users = [rest for w, rest in instr if w == "USER"]
    assert users and users[-1] not in ("root", "0"), "the image must run as a non-root user"
    # whatever the package build needs is copied in
    copied = " ".join(rest for w, rest in instr if w in ("COPY", "ADD"))
    assert "pyproject.toml" in copied or re.search(r"(^|\s)\.\s", copied)
    for pkg in ("rocewatch", "collector", "detectors", "storage", "actions"):
        if (ROOT / pkg).is_dir():
            assert pkg in copied or re.search(r"(^|\s)\.\s", copied), (
                f"Dockerfile does not copy {pkg}/"
            )


# ----------------------------------------------------------------------------- deploy config


def test_deploy_config_matches_stack(services: dict[str, dict[str, Any]]) -> None:
    cfg = yaml.safe_load((ROOT / "deploy" / "rocewatch.yaml").read_text())
    assert cfg["kafka"]["bootstrap_servers"].split(":")[0] in services
    assert set(cfg["kafka"]["topics"]) == {"telemetry", "alerts", "actions", "dead_letter"}
    assert "@postgres:5432/" in cfg["storage"]["url"]
    assert cfg["metrics_port"] == 9464
    assert cfg["actions"]["mode"] == "dry-run"
    # the topology the simulator writes, inside the volume the detector mounts
    assert cfg["topology"].startswith("/data/scenario/")
    assert any(t == "/data" for t in _container_paths(services["detector"]))


def test_deploy_config_loads() -> None:
    from rocewatch.config import load_config  # lazily: the loader is another module's

    cfg = load_config(ROOT / "deploy" / "rocewatch.yaml")
    assert cfg.kafka.bootstrap_servers == "kafka:9092"
    assert cfg.metrics_port == 9464
