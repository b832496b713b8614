"""rocewatch against a real broker with TLS and SASL/SCRAM listeners (secure_kafka_broker).

The broker's certificate is signed by a CA made at test time; SCRAM users are created when its
storage is formatted. Secrets must never show up in rocewatch's output.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml
from conftest import new_topic_prefix
from kafka import KafkaConsumer
from kafka.structs import TopicPartition
from kafka_secure import make_pki

from rocewatch.bus.preflight import KafkaAuthError, KafkaTlsError, preflight
from rocewatch.bus.publish import TelemetryPublisher
from rocewatch.bus.topics import ensure_topics
from rocewatch.config import Config, KafkaConfig, TopicsConfig, load_config
from rocewatch.core.errors import ConfigError
from rocewatch.core.stats import Stats
from rocewatch.core.topology import Topology
from rocewatch.sources import merged, scenario_sources
from tests.support.kafka_read import read_to_end
from tests.support.state_keys import SIGNING_YAML

USER = "rocewatch"


def topics(prefix: str) -> TopicsConfig:
    return TopicsConfig(
        telemetry=f"{prefix}.telemetry",
        alerts=f"{prefix}.alerts",
        actions=f"{prefix}.actions",
        dead_letter=f"{prefix}.dlq",
        steps=f"{prefix}.steps",
        state=f"{prefix}.state",
        rollups=f"{prefix}.rollups",
    )


def comparable(alerts: list[dict]) -> dict[tuple[str, str], tuple]:
    final: dict[tuple[str, str], dict] = {}
    for e in alerts:
        key = (e["fingerprint"], e["startsAt"])
        if key not in final or e["status"] == "resolved":
            final[key] = e
    return {k: (v["status"], v["endsAt"], v["labels"]["alertname"]) for k, v in final.items()}


def sorted_actions(actions: list[dict]) -> list[dict]:
    return sorted(actions, key=lambda a: (a["time"], a["node"], a["action"], a["outcome"]))


def read_topic(k: KafkaConfig, topic: str, timeout_s: float = 60.0) -> list[Any]:
    """The topic's committed records, up to its end now (tests/support/kafka_read.py)."""
    return read_to_end(topic, timeout_s, **k.client_kwargs())


def sasl_kafka(sb: Any, prefix: str, mechanism: str = "SCRAM-SHA-512", **kw: Any) -> KafkaConfig:
    base: dict[str, Any] = {
        "bootstrap_servers": sb.sasl_ssl_bootstrap,
        "security_protocol": "SASL_SSL",
        "ssl_cafile": str(sb.pki.ca_file),
        "sasl_mechanism": mechanism,
        "sasl_plain_username": USER,
        "sasl_plain_password": sb.users[USER],
        "topics": topics(prefix),
        "group_id": f"{prefix}.group",
        "commit_interval_s": 0.5,
        "idle_flush_s": 2.0,
        "session_timeout_ms": 6000,
    }
    base.update(kw)
    return KafkaConfig(**base)


def write_cli_config(path: Path, scenario: Path, state: Path, kafka: dict[str, Any]) -> Path:
    path.write_text(
        yaml.safe_dump({"topology": str(scenario / "topology.yaml"), "state_dir": str(state),
                        "kafka": kafka})
    )  # fmt: skip
    return path


def wait_for_replay_outputs(
    k: KafkaConfig, replay_result: Any, proc: subprocess.Popen, timeout: float = 240
) -> None:
    """Until the alert events on ``k``'s topics bring every alert of the replay to its final
    state, with at least as many actions: what is compared afterwards is compared exactly."""
    deadline = time.monotonic() + timeout
    while True:
        events = [orjson.loads(m.value) for m in read_topic(k, k.topics.alerts)]
        acts = read_topic(k, k.topics.actions)
        if comparable(events) == comparable(replay_result.alerts) and len(acts) >= len(
            replay_result.actions
        ):
            return
        assert proc.poll() is None, f"detect exited with {proc.returncode}"
        assert time.monotonic() < deadline, f"outputs incomplete after {timeout:.0f} s"
        time.sleep(0.5)


def test_cli_publish_and_detect_over_sasl_ssl_give_the_replay_alerts(
    secure_kafka_broker, scenario, replay_result, tmp_path
):
    """`rocewatch publish` and `rocewatch detect` over TLS with SCRAM users: both stages, the
    state topic and the detect stage's transactions; no secret in a file or a log line."""
    sb = secure_kafka_broker
    secret = sb.users[USER]
    prefix = new_topic_prefix("sasl_ssl")
    common = {
        "bootstrap_servers": sb.sasl_ssl_bootstrap,
        "security_protocol": "SASL_SSL",
        "ssl_cafile": str(sb.pki.ca_file),
        "sasl_plain_username": USER,
        "topics": dataclasses.asdict(topics(prefix)),
        "group_id": f"{prefix}.group",
        "commit_interval_s": 0.5,
        "idle_flush_s": 2.0,
        "session_timeout_ms": 6000,
        "state_signing": SIGNING_YAML,
    }
    # the publisher takes its password from the environment, the detector from a secret file;
    # neither YAML file holds a secret
    pub_conf = write_cli_config(
        tmp_path / "publish.yaml",
        scenario,
        tmp_path / "state-pub",
        {
            **common,
            "sasl_mechanism": "SCRAM-SHA-512",
            "sasl_plain_password": "${ROCEWATCH_KAFKA_PASSWORD}",
        },
    )
    pw_file = tmp_path / "kafka-password"
    pw_file.write_text(secret + "\n")
    pw_file.chmod(0o600)
    det_conf = write_cli_config(
        tmp_path / "detect.yaml",
        scenario,
        tmp_path / "state",
        {**common, "sasl_mechanism": "SCRAM-SHA-256", "sasl_plain_password_file": str(pw_file)},
    )
    for conf in (pub_conf, det_conf):
        assert secret not in conf.read_text()
    env = {**os.environ, "ROCEWATCH_KAFKA_PASSWORD": secret, "PYTHONUNBUFFERED": "1"}
    cli = [sys.executable, "-m", "rocewatch.cli", "-v"]
    pub = subprocess.run(
        [*cli, "publish", str(scenario), "--config", str(pub_conf)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert pub.returncode == 0, pub.stderr[-3000:]
    k = sasl_kafka(sb, prefix)
    out, err = tmp_path / "detect.out", tmp_path / "detect.err"
    with out.open("wb") as fo, err.open("wb") as fe:  # (--max-idle: a safety net)
        proc = subprocess.Popen(
            [*cli, "detect", "--config", str(det_conf), "--max-idle", "60"],
            env=env,
            stdout=fo,
            stderr=fe,
        )
    try:
        # once every alert is in its final state and the drains are made, a graceful stop
        # (SIGTERM: the final checkpoint and transaction), not an idle one
        wait_for_replay_outputs(k, replay_result, proc)
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(120)
    finally:
        if proc.poll() is None:
            proc.kill()
    det_stdout, det_stderr = out.read_text(errors="replace"), err.read_text(errors="replace")
    assert code == 0, det_stderr[-3000:]
    for text in (pub.stdout, pub.stderr, det_stdout, det_stderr):
        assert secret not in text
    assert "accepts this client (SASL_SSL)" in pub.stderr + det_stderr  # the preflight ran

    events = [orjson.loads(m.value) for m in read_topic(k, k.topics.alerts)]
    keys = Counter((e["fingerprint"], e["startsAt"], e["status"]) for e in events)
    assert max(keys.values()) == 1, "an alert event was published twice"
    acts = [orjson.loads(m.value) for m in read_topic(k, k.topics.actions)]
    assert comparable(events) == comparable(replay_result.alerts)
    assert sorted_actions(acts) == sorted_actions(replay_result.actions)
    # written in transactions: each commit's marker takes an offset of its own
    probe = KafkaConsumer(**k.client_kwargs(), group_id=None)
    try:
        tps = [
            TopicPartition(k.topics.alerts, p) for p in probe.partitions_for_topic(k.topics.alerts)
        ]
        assert sum(probe.end_offsets(tps).values()) > len(events)
    finally:
        probe.close()


def test_wrong_password_is_a_clear_authentication_error(secure_kafka_broker, scenario, tmp_path):
    sb = secure_kafka_broker
    wrong = "not-the-Password-91x"
    prefix = new_topic_prefix("badpw")
    conf = write_cli_config(
        tmp_path / "c.yaml",
        scenario,
        tmp_path / "state",
        {
            "bootstrap_servers": sb.sasl_ssl_bootstrap,
            "security_protocol": "SASL_SSL",
            "ssl_cafile": str(sb.pki.ca_file),
            "sasl_mechanism": "SCRAM-SHA-512",
            "sasl_plain_username": USER,
            "sasl_plain_password": "${ROCEWATCH_KAFKA_PASSWORD}",
            "topics": dataclasses.asdict(topics(prefix)),
            "state_signing": SIGNING_YAML,
        },
    )
    env = {**os.environ, "ROCEWATCH_KAFKA_PASSWORD": wrong}
    for cmd in (["publish", str(scenario)], ["detect"]):
        res = subprocess.run(
            [sys.executable, "-m", "rocewatch.cli", "-v", *cmd, "--config", str(conf)],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert res.returncode == 1, res.stderr[-2000:]
        last = res.stderr.strip().splitlines()[-1]
        assert last.startswith("rocewatch: error: Kafka broker " + sb.sasl_ssl_bootstrap), last
        assert f"refused SASL SCRAM-SHA-512 authentication for user '{USER}'" in last
        assert "invalid credentials" in last
        assert wrong not in res.stderr + res.stdout
        assert sb.users[USER] not in res.stderr + res.stdout


def test_both_scram_mechanisms_and_unknown_users(secure_kafka_broker):
    sb = secure_kafka_broker
    for mech in ("SCRAM-SHA-512", "SCRAM-SHA-256"):
        preflight(sasl_kafka(sb, "x", mech))  # accepted
        with pytest.raises(KafkaAuthError, match="user 'nobody'"):
            preflight(sasl_kafka(sb, "x", mech, sasl_plain_username="nobody"))
    with pytest.raises(KafkaAuthError, match="does not enable SASL mechanism PLAIN"):
        preflight(sasl_kafka(sb, "x", "PLAIN"))


def test_untrusted_broker_certificate_is_a_clear_tls_error(secure_kafka_broker, tmp_path):
    sb = secure_kafka_broker
    other_ca = make_pki(tmp_path / "other", label="someone else").ca_file
    for k in (
        sasl_kafka(sb, "x", ssl_cafile=str(other_ca)),
        sasl_kafka(sb, "x", ssl_cafile=None),  # the system's CAs do not know the test CA
        KafkaConfig(
            bootstrap_servers=sb.ssl_bootstrap, security_protocol="SSL", ssl_cafile=str(other_ca)
        ),
    ):
        host = k.bootstrap_servers
        with pytest.raises(KafkaTlsError) as err:
            ensure_topics(k)
        msg = str(err.value)
        assert msg.startswith(f"TLS handshake with Kafka broker {host} failed"), msg
        assert "not trusted" in msg and "certificate" in msg
    # TLS spoken to a plaintext listener
    k = KafkaConfig(
        bootstrap_servers=sb.plaintext_bootstrap, security_protocol="SSL", ssl_cafile=str(other_ca)
    )
    with pytest.raises(KafkaTlsError, match=f"is {sb.plaintext_bootstrap} a TLS listener"):
        ensure_topics(k)


def test_ssl_listener_carries_telemetry(secure_kafka_broker, scenario):
    sb = secure_kafka_broker
    prefix = new_topic_prefix("ssl")
    k = KafkaConfig(
        bootstrap_servers=sb.ssl_bootstrap,
        security_protocol="SSL",
        ssl_cafile=str(sb.pki.ca_file),
        topics=topics(prefix),
    )
    ensure_topics(k)
    topo = Topology.load(scenario / "topology.yaml")
    src = scenario_sources(scenario, topo, Stats())
    df, _ = next(iter(merged(src, 0)))
    for s in src:
        s.close()
    pub = TelemetryPublisher(k)
    pub.publish(df)
    pub.close()
    from rocewatch import wire

    got = sum(wire.decode(m.value).height for m in read_topic(k, k.topics.telemetry))
    assert got == df.height


def test_secrets_stay_out_of_logs_and_reprs(secure_kafka_broker, caplog, tmp_path):
    sb = secure_kafka_broker
    secret = sb.users[USER]
    caplog.set_level(logging.DEBUG)  # everything, kafka-python's debug lines included
    prefix = new_topic_prefix("logs")
    k = sasl_kafka(sb, prefix)
    ensure_topics(k)
    pub = TelemetryPublisher(k)
    pub.producer.send(k.topics.alerts, b"x")
    pub.close()
    assert read_topic(k, k.topics.alerts)
    with pytest.raises(KafkaAuthError):
        ensure_topics(dataclasses.replace(k, sasl_plain_password=secret + "-wrong"))
    cfg = Config(kafka=k)
    assert caplog.records, "expected log output to check"
    for text in (caplog.text, repr(k), repr(cfg), str(cfg)):
        assert secret not in text


def test_password_from_env_or_file_never_in_the_yaml(tmp_path, monkeypatch):
    pw = tmp_path / "pw"
    pw.write_text("from-a-file\n")
    conf = tmp_path / "c.yaml"
    conf.write_text(
        "kafka:\n  security_protocol: SASL_SSL\n  sasl_mechanism: SCRAM-SHA-512\n"
        f"  sasl_plain_username: u\n  sasl_plain_password_file: {pw}\n"
    )
    assert load_config(conf).kafka.client_kwargs()["sasl_plain_password"] == "from-a-file"
    monkeypatch.setenv("RW_TEST_PW", "from-env")
    conf.write_text(
        "kafka:\n  security_protocol: SASL_SSL\n  sasl_mechanism: SCRAM-SHA-256\n"
        "  sasl_plain_username: u\n  sasl_plain_password: ${RW_TEST_PW}\n"
    )
    assert load_config(conf).kafka.client_kwargs()["sasl_plain_password"] == "from-env"
    monkeypatch.delenv("RW_TEST_PW")
    with pytest.raises(ConfigError, match="RW_TEST_PW is not set"):
        load_config(conf)
    conf.write_text(
        "kafka:\n  security_protocol: SASL_SSL\n  sasl_mechanism: SCRAM-SHA-512\n"
        f"  sasl_plain_username: u\n  sasl_plain_password_file: {tmp_path / 'missing'}\n"
    )
    with pytest.raises(ConfigError, match="sasl_plain_password_file: cannot read"):
        load_config(conf)
    conf.write_text(
        "kafka:\n  security_protocol: SASL_SSL\n  sasl_mechanism: SCRAM-SHA-512\n"
        "  sasl_plain_username: u\n"
    )
    with pytest.raises(ConfigError, match="needs a password"):
        load_config(conf)
    # a missing CA file is named when connecting; the config itself still parses
    conf.write_text(f"kafka:\n  security_protocol: SSL\n  ssl_cafile: {tmp_path / 'no-ca.pem'}\n")
    k = load_config(conf).kafka
    with pytest.raises(ConfigError, match=r"ssl_cafile: .*no-ca\.pem: no such file"):
        k.client_kwargs()
