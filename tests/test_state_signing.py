"""The state topic's MAC (rocewatch/bus/signing.py): keys from the operator's file or
environment, checked at start-up and never shown; records signed over key and value; a record
with a wrong or missing MAC refused, counted and logged, the stage starting from its committed
offsets; rotation with read keys. The last two against the real broker."""

from __future__ import annotations

import dataclasses
import doctest
import logging
import secrets
from pathlib import Path
from typing import Any

import pytest
from kafka import KafkaProducer

from rocewatch.bus import signing
from rocewatch.bus.publish import TelemetryPublisher
from rocewatch.bus.signing import HEADER, SignatureError, StateKeys, load_state_keys
from rocewatch.bus.state_store import StateStore, Stored
from rocewatch.bus.topics import ensure_topics
from rocewatch.config import (
    Config,
    KafkaConfig,
    StateKeyConfig,
    StateSigningConfig,
    TopicsConfig,
    config_from_dict,
)
from rocewatch.core.errors import ConfigError
from rocewatch.runtime.service import DetectService
from tests.support.until_done import run_service, stop_when_done

# --- the MAC --------------------------------------------------------------------------------------


def test_the_module_examples_hold() -> None:
    assert doctest.testmod(signing).failed == 0


def test_a_mac_binds_value_key_and_key_id() -> None:
    keys = StateKeys("new", {"new": b"n" * 32, "old": b"o" * 32})
    headers = keys.sign(b"detect", b"state")
    keys.verify(b"detect", b"state", headers)
    ((name, value),) = headers
    assert name == HEADER and value.startswith(b"v1 new ") and len(value) == 3 + 4 + 64
    for key, val, hdrs, why in [
        (b"detect", b"statf", headers, "does not match"),  # another value
        (b"detect@1", b"state", headers, "does not match"),  # replayed under another key
        (b"detect", b"state", [(HEADER, value.replace(b"new", b"old"))], "does not match"),
        (b"detect", b"state", [(HEADER, value.replace(b"new", b"gone"))], "does not read"),
        (b"detect", b"state", [], "no MAC"),
        (b"detect", b"state", None, "no MAC"),
        (b"detect", b"state", [(HEADER, b"v2 new " + b"0" * 64)], "malformed"),
        (b"detect", b"state", [(HEADER, None)], "malformed"),
        (b"detect", b"state", headers * 2, "malformed"),  # which one would count?
    ]:
        with pytest.raises(SignatureError, match=why):
            keys.verify(key, val, hdrs)
    # an old key reads what it signed; only the write key signs
    StateKeys("old", {"old": b"o" * 32}).verify(b"k", b"v", keys_old(b"k", b"v"))
    keys.verify(b"k", b"v", keys_old(b"k", b"v"))


def keys_old(key: bytes, value: bytes) -> list[tuple[str, bytes]]:
    return StateKeys("old", {"old": b"o" * 32}).sign(key, value)


# --- the keys, from the config --------------------------------------------------------------------


def signing_cfg(doc: Any) -> StateSigningConfig:
    return config_from_dict({"kafka": {"state_signing": doc}}).kafka.state_signing


def test_keys_come_from_a_file_or_the_environment_and_never_show(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    new, old = secrets.token_hex(32), secrets.token_hex(24)
    (tmp_path / "new.key").write_text(new + "\n")  # as `openssl rand -hex 32 > FILE` writes it
    monkeypatch.setenv("RW_OLD_STATE_KEY", old)
    caplog.set_level(logging.DEBUG)
    doc = {
        "key": {"id": "2026-12", "file": str(tmp_path / "new.key")},
        "read_keys": [{"id": "2026-06", "env": "RW_OLD_STATE_KEY"}],
    }
    cfg = config_from_dict({"kafka": {"state_signing": doc}})
    keys = load_state_keys(cfg.kafka.state_signing)
    assert keys.write_id == "2026-12" and keys.read_ids == ["2026-06", "2026-12"]
    # the key is the file's bytes less the final newline
    assert StateKeys("2026-12", {"2026-12": new.encode()}).sign(b"k", b"v") == keys.sign(b"k", b"v")
    for text in (repr(cfg), str(cfg), repr(keys), str(keys), caplog.text):
        assert new not in text and old not in text
    with pytest.raises(TypeError):  # the keys are never serialised, pickle or checkpoint
        keys.__reduce__()


@pytest.mark.parametrize(
    ("doc", "error"),
    [
        (
            {"key": {"id": "a", "file": "/k", "env": "K"}},
            r"state_signing\.key: key 'a': give file or env",
        ),
        ({"key": {"id": "a"}}, "give file or env"),
        ({"key": {"file": "/k"}}, r"state_signing\.key: id: 1 to 64"),
        ({"key": {"id": "a b", "file": "/k"}}, "id: 1 to 64"),
        ({"key": {"id": "a", "env": "0" * 64}}, "env must be an environment variable's name"),
        ({"read_keys": [{"id": "a", "file": "/k"}]}, "read_keys without a key"),
        (
            {"key": {"id": "a", "file": "/k"}, "read_keys": [{"id": "a", "env": "K"}]},
            "two keys with one id",
        ),
        (
            {"key": {"id": "a", "file": "/k"}, "read_keys": {"id": "b"}},
            r"read_keys: must be a list",
        ),
        (
            {"key": {"id": "a", "file": "/k"}, "read_keys": [{"id": "b"}]},
            r"read_keys\[0\]: key 'b'",
        ),
        ({"key": {"id": "a", "path": "/k"}}, r"state_signing\.key\.path: unknown setting"),
    ],
)
def test_a_bad_key_setting_names_its_key(doc: Any, error: str) -> None:
    with pytest.raises(ConfigError, match=error) as e:
        signing_cfg(doc)
    assert "0" * 64 not in str(e.value)  # (a key given where its variable's name goes)


def test_a_key_that_cannot_be_used_stops_the_start_with_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    short = "s3cr3t-but-too-short"
    (tmp_path / "short.key").write_text(short)
    monkeypatch.setenv("RW_SHORT_KEY", short)
    monkeypatch.delenv("RW_UNSET_KEY", raising=False)
    (tmp_path / "dir.key").mkdir()
    (tmp_path / "big.key").write_bytes(b"x" * (signing.MAX_KEY_FILE_BYTES + 1))
    cases = [
        (StateSigningConfig(), r"^kafka\.state_signing\.key is not set: rocewatch detect signs"),
        (file_key(tmp_path / "absent.key"), r"key\.file: cannot read .*absent\.key: No such file"),
        (file_key(tmp_path / "short.key"), r"key\.file \(.*\): the key is 20 bytes, at least 32"),
        (file_key(tmp_path / "dir.key"), r"dir\.key is not a file"),
        (file_key(tmp_path / "big.key"), r"is 65537 bytes, not a key file"),
        (env_key("RW_SHORT_KEY"), r"key\.env \(RW_SHORT_KEY\): the key is 20 bytes"),
        (env_key("RW_UNSET_KEY"), r"key\.env: environment variable RW_UNSET_KEY is not set"),
    ]
    for cfg, error in cases:
        with pytest.raises(ConfigError, match=error) as e:
            load_state_keys(cfg)
        assert "\n" not in str(e.value) and short not in str(e.value)


def file_key(path: Path) -> StateSigningConfig:
    return StateSigningConfig(key=StateKeyConfig(id="k", file=str(path)))


def env_key(name: str) -> StateSigningConfig:
    return StateSigningConfig(key=StateKeyConfig(id="k", env=name))


def test_detect_without_a_key_refuses_to_start_before_it_touches_kafka(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """No broker listens on the address: the refusal comes before any connection."""
    from rocewatch.cli import main

    conf = tmp_path / "c.yaml"
    conf.write_text("kafka: {bootstrap_servers: '127.0.0.1:1'}\ntopology: /nonexistent.yaml\n")
    assert main(["detect", "--config", str(conf)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "rocewatch: error: kafka.state_signing.key is not set: rocewatch detect signs its state "
        "records and reads only signed ones; give it a key of at least 32 bytes in a file or an "
        "environment variable (docs/operations.md, State topic keys)"
    ]


def test_refused_records_are_a_prometheus_counter() -> None:
    """What the detect service's /metrics make of the stages' counts (``update_scaleout``)."""
    import types

    from rocewatch.core.metrics import ServiceMetrics
    from rocewatch.core.stats import Stats
    from tests.support.prom import scrape

    agg_stats, det_stats = Stats(), Stats()
    agg_stats.inc("checkpoint_rejected", 2)
    agg_stats.inc("state_mac_rejected", 2)
    det_stats.inc("checkpoint_rejected")
    det_stats.inc("state_mac_rejected")
    agg = types.SimpleNamespace(samples=0, stats=agg_stats, parts={}, consumer=None)
    det = types.SimpleNamespace(all_stats=lambda: [det_stats])
    m = ServiceMetrics(0, addr="127.0.0.1")
    try:
        m.update_scaleout(types.SimpleNamespace(agg=agg, det=det, cfg=Config()))
        m.update_scaleout(types.SimpleNamespace(agg=agg, det=det, cfg=Config()))  # no double
        got = scrape(m.port)
    finally:
        m.close()
    assert got[("rocewatch_state_mac_rejected_total", ())] == 3
    assert got[("rocewatch_checkpoint_rejected_total", ())] == 3
    assert got[("rocewatch_input_skipped", (("reason", "state_mac_rejected"),))] == 3


# --- against the real broker ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def fabric() -> tuple[Any, list[Any], list[Any]]:
    """A small fabric's telemetry, in two halves (a run before a restart, one after)."""
    from rocewatch.sim import Simulator
    from rocewatch.sim.scenarios import default_scenario

    sim = Simulator(default_scenario(nodes=4, duration_s=8.0, seed=11))
    frames = [f for f in sim.ticks() if f.height]
    half = len(frames) // 2
    return sim.topology, frames[:half], frames[half:]


def key_file(path: Path) -> str:
    secret = secrets.token_hex(32)
    path.write_text(secret)
    path.chmod(0o600)
    return secret


def cfg_with(
    kafka_bootstrap: str, kafka_topics: Any, tmp: Path, sign: StateSigningConfig
) -> Config:
    names = ("telemetry", "alerts", "actions", "dead_letter", "steps", "state", "rollups")
    k = KafkaConfig(
        bootstrap_servers=kafka_bootstrap,
        topics=TopicsConfig(**{n: kafka_topics(n) for n in names}),
        group_id=kafka_topics("group"),
        partitions=2,
        commit_interval_s=0.5,
        idle_flush_s=2.0,
        session_timeout_ms=6000,
        state_signing=sign,
    )
    return Config(kafka=k, state_dir=str(tmp / "state"))


def run_once(cfg: Config, topology: Any, frames: list[Any]) -> DetectService:
    """Publish ``frames``, run a detect service until it has done them, stop it gracefully."""
    pub = TelemetryPublisher(cfg.kafka)
    for f in frames:
        pub.publish(f)
    pub.close()
    svc = DetectService(cfg, topology=topology)
    worker, errors = run_service(svc, 60.0)
    stop_when_done(svc, worker)
    assert not errors, errors
    return svc


def state_records(cfg: Config, keys: StateKeys) -> dict[str, Stored]:
    """The last record of every key the stages write, as stored (the telemetry partitions'
    ``agg-<p>``, the one domain's ``detect`` on the partition after them)."""
    store = StateStore(cfg.kafka, None, 1 << 20, keys=keys)
    try:
        n = cfg.kafka.partitions
        out = {f"agg-{p}": store.load_stored(p, key=f"agg-{p}") for p in range(n)}
        out["detect"] = store.load_stored(n, key="detect")
    finally:
        store.close()
    assert all(r is not None for r in out.values()), out
    return out  # type: ignore[return-value]


def samples(frames: list[Any]) -> int:
    return sum(f.height for f in frames)


def test_a_record_signed_with_another_key_or_unsigned_is_refused_and_the_stage_starts_afresh(
    kafka_bootstrap: str,
    kafka_topics: Any,
    tmp_path: Path,
    fabric: tuple[Any, list[Any], list[Any]],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Whoever can produce to the state topic but lacks the key writes well-formed state
    records (the stages' own, taken from the topic): one re-signed with another key under the
    right key id, one without a MAC, and one whose genuine MAC is for another record key (a
    telemetry partition's state replayed as the detect stage's). Each is refused, counted and
    logged with topic, partition and offset; the telemetry partitions resume from their
    group's committed offsets (the second half is all they read), the detect stage from the
    first step; no key reaches a log line."""
    topology, first, second = fabric
    secret = key_file(tmp_path / "state.key")
    sign = StateSigningConfig(key=StateKeyConfig(id="prod", file=str(tmp_path / "state.key")))
    cfg = cfg_with(kafka_bootstrap, kafka_topics, tmp_path, sign)
    ensure_topics(cfg.kafka)
    caplog.set_level(logging.INFO)
    run_once(cfg, topology, first)
    keys = load_state_keys(sign)
    genuine = state_records(cfg, keys)
    other = secrets.token_hex(32)
    forger = StateKeys("prod", {"prod": other.encode()})  # the right id, another key
    forged = {
        "agg-0": (0, genuine["agg-0"].value, forger.sign(b"agg-0", genuine["agg-0"].value)),
        "agg-1": (1, genuine["agg-1"].value, []),
        "detect": (2, genuine["agg-0"].value, genuine["agg-0"].headers),
    }
    producer = KafkaProducer(bootstrap_servers=kafka_bootstrap)
    at = {}
    for key, (p, value, headers) in forged.items():
        fut = producer.send(
            cfg.kafka.topics.state, key=key.encode(), value=value, headers=headers, partition=p
        )
        at[key] = (p, fut.get(timeout=30).offset)
    producer.close()
    caplog.clear()

    svc = run_once(cfg, topology, second)
    stats = svc.summary()["stats"]
    assert stats.get("checkpoint_rejected") == 3 and stats.get("state_mac_rejected") == 3, stats
    topic = cfg.kafka.topics.state
    lines = [r.getMessage() for r in caplog.records if " rejected (" in r.getMessage()]
    assert len(lines) == 3, lines
    for key, why in (("agg-0", "MAC does not match"), ("agg-1", "no MAC"), ("detect", "MAC")):
        p, off = at[key]
        (line,) = [x for x in lines if f"{topic}/{p}@{off} rejected" in x]
        assert why in line, line
    assert sum("starts afresh from its committed offset" in x for x in lines) == 2
    assert sum("starts afresh from the first step" in x for x in lines) == 1
    # from the committed offsets: the second half, not the whole stream again
    assert svc.agg.samples == samples(second)
    for text in (caplog.text, repr(cfg), str(svc.store.keys)):
        assert secret not in text and other not in text
    # and what it wrote since is signed with its key
    for rec in state_records(cfg, keys).values():
        keys.verify(rec.key, rec.value, rec.headers)


def test_keys_rotate_old_records_read_new_ones_written_with_the_new_key(
    kafka_bootstrap: str,
    kafka_topics: Any,
    tmp_path: Path,
    fabric: tuple[Any, list[Any], list[Any]],
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Run with key k1; restart with k2 writing and k1 listed for reading: every stage
    restores its k1 record (nothing refused, each partition resumes at its offset), and the
    records written since carry k2, which alone reads them: k1 can be retired."""
    topology, first, second = fabric
    old = key_file(tmp_path / "k1.key")
    k1 = StateKeyConfig(id="k1", file=str(tmp_path / "k1.key"))
    cfg = cfg_with(kafka_bootstrap, kafka_topics, tmp_path, StateSigningConfig(key=k1))
    ensure_topics(cfg.kafka)
    caplog.set_level(logging.INFO)
    run_once(cfg, topology, first)
    before = state_records(cfg, load_state_keys(cfg.kafka.state_signing))
    assert all(dict(r.headers)[HEADER].startswith(b"v1 k1 ") for r in before.values())

    new = secrets.token_hex(32)
    monkeypatch.setenv("RW_TEST_NEW_STATE_KEY", new)
    rotated = config_from_dict(  # as an operator writes it
        {
            "kafka": {
                "state_signing": {
                    "key": {"id": "k2", "env": "RW_TEST_NEW_STATE_KEY"},
                    "read_keys": [{"id": "k1", "file": str(tmp_path / "k1.key")}],
                }
            }
        }
    ).kafka.state_signing
    cfg2 = dataclasses.replace(cfg, kafka=dataclasses.replace(cfg.kafka, state_signing=rotated))
    caplog.clear()
    svc = run_once(cfg2, topology, second)
    stats = svc.summary()["stats"]
    assert not stats.get("checkpoint_rejected") and not stats.get("state_mac_rejected"), stats
    resumed = [r.getMessage() for r in caplog.records if "resumes at offset" in r.getMessage()]
    assert len(resumed) == cfg.kafka.partitions, resumed
    assert [
        r.getMessage() for r in caplog.records if "active (steps offset 0)" in r.getMessage()
    ] == []
    assert svc.agg.samples == samples(second)
    only_new = StateKeys("k2", {"k2": new.encode()})
    after = state_records(cfg, only_new)
    for key, rec in after.items():
        assert rec.offset > before[key].offset, key  # written since
        assert dict(rec.headers)[HEADER].startswith(b"v1 k2 "), key
        only_new.verify(rec.key, rec.value, rec.headers)
    for text in (caplog.text, repr(cfg2)):
        assert old not in text and new not in text
