"""The checkpoint format (rocewatch/core/checkpoint.py, docs/formats/checkpoint.md).

What a user relies on: a restored detector carries on as if it had never stopped; a state
record or file that is damaged, foreign, of another version or forged is refused with one line,
counted, and never executed; nothing in the product unpickles anything.
"""

from __future__ import annotations

import builtins
import collections
import hashlib
import logging
import math
import pickle
import re
import struct
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import polars as pl
import pytest

from rocewatch.bus.signing import StateKeys
from rocewatch.bus.state_store import StateStore, Stored
from rocewatch.config import Config
from rocewatch.core import checkpoint
from rocewatch.core.checkpoint import CheckpointError
from rocewatch.core.stats import Stats
from rocewatch.pipeline import Pipeline
from tests.support.state_keys import SIGNING

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = Path(__file__).parent / "fixtures"
PRODUCT = ("rocewatch", "detectors", "collector", "storage", "actions")


class _Boom:
    """What a forged pickle holds: unpickling it creates ``path`` (any code could run)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Any, tuple[str, str]]:
        return (builtins.open, (str(self.path), "w"))


def forged_pickle(path: Path) -> bytes:
    return pickle.dumps({"pipeline": _Boom(path)}, protocol=pickle.HIGHEST_PROTOCOL)


def test_a_forged_pickle_would_run_code(tmp_path: Path) -> None:
    """The control for the tests below: unpickling the forged record does create the file."""
    marker = tmp_path / "ran"
    pickle.loads(forged_pickle(marker))
    assert marker.exists()


def record(root: Any, kind: str = "test", blobs: list[bytes] | None = None) -> bytes:
    """A checkpoint written by hand: a forger's, who knows the format."""
    blobs = blobs or []
    head = orjson.dumps({"kind": kind, "blobs": [["raw", len(b)] for b in blobs], "root": root})
    body = struct.pack("<I", len(head)) + head + b"".join(blobs)
    return b"RWCKPT" + bytes([1, 0]) + hashlib.sha256(body).digest() + body


# --- the codec ------------------------------------------------------------------------------------


def test_values_round_trip_exactly() -> None:
    frame = pl.DataFrame({"device": ["leaf-0", None], "v": [1.5, float("nan")]})
    value = {
        "tuple": (1, "a", (2.5, None)),
        "set": {1, 2, 3},
        "frozen": frozenset({"x"}),
        (7, "int-key"): {0: "zero", -1: "minus one"},
        "bytes": b"\x00\xff",
        "floats": [float("inf"), -float("inf"), -0.0, 5e-324, 0.1],
        "big": [2**64 - 1, -(2**63), 2**80, -(2**70)],
        "dollar": ["$t", "not a tag"],
        "deque": collections.deque([1, 2], maxlen=5),
        "counter": collections.Counter({"a": 3}),
        "arrays": [
            np.arange(6, dtype=np.uint64).reshape(2, 3),
            np.array([np.nan, 1.0], dtype=np.float32),
            np.array([True, False]),
            np.empty((0, 4), dtype=np.int32),
        ],
        "scalars": [np.float64(0.25), np.int64(-3), np.bool_(True)],
        "dtype": np.dtype("<u4"),
        "pattern": re.compile("(?:a|b)+", re.IGNORECASE),
        "frame": frame,
        "series": pl.Series("s", [1, 2, 3]),
    }
    back = checkpoint.loads(checkpoint.dumps(value, "test"), "test")
    for k in ("tuple", "set", "frozen", (7, "int-key"), "bytes", "big", "dollar", "dtype"):
        assert back[k] == value[k] and type(back[k]) is type(value[k]), k
    assert math.isnan(back["arrays"][1][0]) and back["arrays"][1].dtype == np.float32
    assert [str(f) for f in back["floats"]] == ["inf", "-inf", "-0.0", "5e-324", "0.1"]
    assert back["deque"] == value["deque"] and back["deque"].maxlen == 5
    assert back["counter"] == value["counter"] and type(back["counter"]) is collections.Counter
    for a, b in zip(back["arrays"], value["arrays"], strict=True):
        assert a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b, equal_nan=True)
        assert a.flags.writeable  # a restored state changes its arrays in place
    assert [type(s) for s in back["scalars"]] == [np.float64, np.int64, np.bool_]
    assert back["scalars"] == value["scalars"]
    assert back["pattern"].pattern == "(?:a|b)+" and back["pattern"].flags & re.IGNORECASE
    assert back["frame"].equals(frame) and back["series"].equals(value["series"])


def test_shared_objects_stay_shared() -> None:
    """A frame, an array or an object held twice comes back as one (as the state had it)."""
    from rocewatch.core.topology import PortEnd

    frame = pl.DataFrame({"x": [1]})
    arr = np.zeros(3)
    end = PortEnd("leaf-0", "Ethernet1")
    back = checkpoint.loads(
        checkpoint.dumps({"a": [frame, arr, end], "b": {end: (frame, arr)}}, "test"), "test"
    )
    f, a, e = back["a"]
    assert back["b"][e] == (f, a) and back["b"][e][0] is f and back["b"][e][1] is a
    assert next(iter(back["b"])) is e and e == end


def test_a_topology_is_written_as_it_is_now() -> None:
    """The writer keeps a topology's encoding between checkpoints; a change of its jobs (live
    membership from the schedulers) is in the next one."""
    from rocewatch.core.topology import Job, Topology
    from tests.test_topology import GOOD

    topo = Topology.from_dict(GOOD)
    node = next(iter(topo.nodes))
    first = checkpoint.loads(checkpoint.dumps({"t": topo, "again": [topo]}, "test"), "test")
    assert first["again"][0] is first["t"] and first["t"].nodes.keys() == topo.nodes.keys()
    topo.set_jobs([Job("train", None, 3, (node,))])
    back = checkpoint.loads(checkpoint.dumps(topo, "test"), "test")
    assert back.jobs == topo.jobs and back.node_jobs == {node: ["train"]}
    assert back.peer(next(iter(topo._peer))) == topo.peer(next(iter(topo._peer)))


def test_a_snapshot_is_the_state_when_taken() -> None:
    """Encoded at once, written later (the scale-out stages write on a worker thread): what
    changes meanwhile, in place or not, is not in the record."""
    arr = np.arange(3.0)
    state = {"arr": arr, "n": 1}
    snap = checkpoint.Snapshot(state, "test")
    arr[0] = 99.0
    state["n"] = 2
    back = checkpoint.loads(snap.record(), "test")
    assert back == {"arr": back["arr"], "n": 1} and back["arr"].tolist() == [0.0, 1.0, 2.0]


def test_a_field_added_since_takes_its_default() -> None:
    """Compatibility within v1: a record written before a dataclass gained a field restores
    with the field's default (docs/formats/checkpoint.md says how other state evolves)."""
    from rocewatch.core.topology import Switch

    old = record(["$o", 0, "rocewatch.core.topology:Switch", {"name": "leaf-0", "role": "leaf"}])
    sw = checkpoint.loads(old)
    assert sw == Switch("leaf-0", "leaf") and sw.int_ports == {} and sw.domain is None


def test_what_is_not_data_is_not_written() -> None:
    """A class off the allowlist, an object array, a function: refused when writing (a bug to
    fix here, not a record nobody can read back)."""
    for bad in (object(), np.array([object()]), len, logging.getLogger("x")):
        with pytest.raises(CheckpointError):
            checkpoint.dumps({"x": bad}, "test")


def test_the_allowlist_holds_data_classes_only() -> None:
    """Product classes only, and none that acts on the world: no executor, scheduler or
    network client (a forged state could otherwise point one at something)."""
    table = checkpoint.allowed()
    assert "rocewatch.pipeline:Pipeline" in table
    for name, cls in table.items():
        assert name.split(".")[0] in PRODUCT, name
        assert not any(hasattr(cls, m) for m in ("drain", "resume", "send", "connect")), name
        assert not name.endswith("Executor") and "Client" not in name, name


# --- what is refused ------------------------------------------------------------------------------


def test_a_pickle_is_refused_not_run(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    with pytest.raises(CheckpointError, match=r"not a rocewatch checkpoint \(a pickle"):
        checkpoint.loads(forged_pickle(marker))
    assert not marker.exists()


@pytest.mark.parametrize(
    "name",
    ["builtins:open", "os:system", "subprocess:Popen", "actions.executors:SlurmExecutor"],
)
def test_a_record_naming_a_class_off_the_allowlist_is_refused(tmp_path: Path, name: str) -> None:
    marker = tmp_path / "ran"
    forged = record(["$o", 0, name, {"args": [str(marker), "w"]}])
    with pytest.raises(CheckpointError, match="not allowed here"):
        checkpoint.loads(forged)
    with pytest.raises(CheckpointError, match="not allowed here"):
        checkpoint.loads(record(["$N", name, str(marker), "w"]))
    assert not marker.exists()


def test_damaged_records_are_refused() -> None:
    good = checkpoint.dumps({"a": np.arange(100), "b": "x" * 100}, "test")
    assert checkpoint.loads(good, "test")["b"] == "x" * 100
    for cut in (0, 5, 20, 40, len(good) // 2, len(good) - 1):
        with pytest.raises(CheckpointError, match=r"truncated|checksum|not a rocewatch"):
            checkpoint.loads(good[:cut])
    for at in (41, 60, len(good) // 2, len(good) - 1):  # a flipped bit in the body
        bad = bytearray(good)
        bad[at] ^= 0x01
        with pytest.raises(CheckpointError, match="checksum mismatch"):
            checkpoint.loads(bytes(bad))
    with pytest.raises(CheckpointError, match="expected 'detect-state'"):
        checkpoint.loads(good, "detect-state")
    with pytest.raises(CheckpointError, match="unknown tag"):
        checkpoint.loads(record(["$exec", "print(1)"]))
    with pytest.raises(CheckpointError, match="not allowed"):
        checkpoint.loads(record(["$A", 0, 0, "|O", [1]], blobs=[b"\x00" * 8]))
    with pytest.raises(CheckpointError, match="size does not match"):
        checkpoint.loads(record(["$A", 0, 0, "<f8", [2]], blobs=[b"\x00" * 8]))


def test_another_major_version_gives_the_promised_error() -> None:
    good = bytearray(checkpoint.dumps({"a": 1}, "test"))
    good[6] = 2
    with pytest.raises(
        CheckpointError, match=r"^checkpoint format v2 not supported by this build \(reads v1\)$"
    ):
        checkpoint.loads(bytes(good))
    good[6], good[7] = 1, 7  # a newer minor version of v1 is read
    assert checkpoint.loads(bytes(good), "test") == {"a": 1}


# --- the services refuse, count and start from their committed offsets ----------------------------


class _Store:
    """The state topic (a Kafka boundary): its last record, and where it is. The record is
    signed with the store's own key, as if whoever forged it held the key: what refuses it
    here is the codec (the MAC's own tests are in tests/test_state_signing.py)."""

    topic = "rocewatch.state"
    keys = StateKeys("tests", {"tests": b"k" * 32})
    open = StateStore.open

    def __init__(self, value: bytes, offset: int, key: str) -> None:
        self.rec = Stored(key.encode(), value, offset, self.keys.sign(key.encode(), value))

    def load_stored(self, partition: int, key: str | None = None) -> Stored:
        return self.rec


def test_the_scale_out_stages_refuse_a_forged_state_record(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from rocewatch.runtime.aggregate import Aggregator
    from rocewatch.runtime.detect import DomainStage

    marker = tmp_path / "ran"
    cfg = Config()
    agg = Aggregator.__new__(Aggregator)
    agg.cfg, agg.k, agg.stats, agg.forest_s, agg.refused = cfg, cfg.kafka, Stats(), None, {}
    agg.store = _Store(forged_pickle(marker), 41, "agg-3")  # type: ignore[assignment]
    with caplog.at_level(logging.ERROR):
        part = agg._restore(3)
        again = agg._restore(3)  # the partition back before a state of it was written
    # fresh state, read from the group's committed offset (the consumer's own start)
    assert part.offset is None and part.from_committed
    assert again.offset is None and again.from_committed
    assert agg.stats.get("checkpoint_rejected") == 1  # one record: counted and logged once
    det = DomainStage.__new__(DomainStage)
    det.store = _Store(forged_pickle(marker)[:-9], 77, "detect")  # type: ignore[assignment]
    det.n_parts, det.state_key, det.name, det.holds = 4, "detect", "detect stage", Stats()
    det.refused = None
    with caplog.at_level(logging.ERROR):
        assert det._restore(None) is None  # type: ignore[arg-type]  # refused before use
        assert det._restore(None) is None  # type: ignore[arg-type]
    assert det.holds.get("checkpoint_rejected") == 1
    assert not marker.exists()
    lines = [r.getMessage() for r in caplog.records if "rejected" in r.getMessage()]
    assert len(lines) == 2
    assert "rocewatch.state/3@41" in lines[0] and "rocewatch.state/4@77" in lines[1]


# --- a pipeline carries on ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def recording() -> tuple[Any, list[pl.DataFrame]]:
    from rocewatch.sim import Simulator
    from rocewatch.sim.scenarios import default_scenario

    sim = Simulator(default_scenario(nodes=4, duration_s=12, seed=3))
    return sim.topology, list(sim.ticks())


def replay(topology: Any, frames: list[pl.DataFrame], cuts: set[int]) -> Pipeline:
    """Ticks into a pipeline, half a second per advance as a Kafka poll would; before each
    tick in ``cuts``, the pipeline is checkpointed and a restored one carries on."""
    p = Pipeline(topology, Config(), rollup_s=10)
    lateness, newest = p.engine.lateness_ns(), 0
    for i, f in enumerate(frames):
        if i in cuts:
            p = checkpoint.loads(checkpoint.dumps(p, "pipeline"), "pipeline")
        p.ingest(f)
        if f.height:
            newest = max(newest, int(f["ts"].max()))  # type: ignore[arg-type]
        if i % 5 == 4:
            p.advance(newest - lateness)
    p.finish()
    return p


def alerts(p: Pipeline) -> list[dict[str, Any]]:
    return [a.to_json() for a in p.all_alerts()] + [a.to_json() for a in p.inhibited_alerts()]


@pytest.mark.slow  # two replays of 12 s of a small fabric: 3 to 5 s
def test_a_restored_pipeline_gives_the_alerts_of_an_uninterrupted_one(
    recording: tuple[Any, list[pl.DataFrame]],
) -> None:
    topology, frames = recording
    whole = replay(topology, frames, set())
    names = {a["labels"]["alertname"] for a in alerts(whole)}
    assert {"PFCStorm", "FlakyLink", "TransportErrors"} <= names  # the scenario's faults
    cut = replay(topology, frames, set(range(7, len(frames), 23)))  # mid-fault too
    assert alerts(cut) == alerts(whole)
    assert [a.to_json() for a in cut.actions] == [a.to_json() for a in whole.actions]
    assert cut.policy.state() == whole.policy.state()


def test_a_restored_partition_closes_the_steps_an_uninterrupted_one_closes() -> None:
    """Stage 1 of scale-out: a telemetry partition's state record (window engine, rollups,
    the forest's feed) read back carries on with the same steps."""
    import dataclasses

    from detectors.isolation_forest import FeatureFeed
    from detectors.windows import WindowEngine
    from rocewatch.bus.state_store import StateSnapshot
    from rocewatch.pipeline import Rollups
    from rocewatch.runtime.aggregate import AggState, load_agg_state
    from rocewatch.sim import Simulator
    from rocewatch.sim.scenarios import default_scenario

    cfg = default_scenario(nodes=2, duration_s=2.5, seed=5)
    frames = list(Simulator(dataclasses.replace(cfg, nics_per_node=2, spines=1)).ticks())

    def run(cut: int | None) -> list[pl.DataFrame]:
        eng, feed, out = WindowEngine(Config().window, Stats()), FeatureFeed(1.0), []
        for i, f in enumerate(frames):
            if i == cut:
                st = AggState(1, 0, eng, i, 0, [Rollups(10)], feed)
                back = load_agg_state(StateSnapshot(st).start().record())
                assert back.offset == i and isinstance(back.rollups[0], Rollups)  # type: ignore[index]
                eng, feed = back.engine, back.forest  # type: ignore[assignment]
            eng.add(f)
            for step in eng.close_until(int(f["ts"].max()) - eng.lateness_ns()):  # type: ignore[arg-type]
                eng.enter(step)
                feed.add(step)
                out.append(step.frame.sort(["device", "port", "qual", "metric"]))
        return out

    whole, cut = run(None), run(len(frames) // 2)
    assert len(whole) == len(cut) > 15
    assert all(a.equals(b) for a, b in zip(whole, cut, strict=True))


# --- format version 1, as released ---------------------------------------------------------------


def test_a_version_1_checkpoint_restores_and_carries_on() -> None:
    """tests/fixtures/checkpoint_v1.ckpt (made by tests/fixtures/checkpoint_v1_make.py): a
    pipeline written by the first build of format v1, halfway through a storm."""
    import dataclasses

    from rocewatch.sim import Simulator
    from rocewatch.sim.scenarios import default_scenario

    data = (FIXTURES / "checkpoint_v1.ckpt").read_bytes()
    assert data[:8] == b"RWCKPT\x01\x00" and len(data) < 200_000
    p = checkpoint.loads(data, "pipeline")
    assert isinstance(p, Pipeline)
    assert {a.name for a in p.lifecycle.firing.values()} >= {"PFCStorm"}
    before = p.engine.closed_ns
    cfg = default_scenario(nodes=2, duration_s=12, seed=3)  # the script's scenario
    frames = list(Simulator(dataclasses.replace(cfg, nics_per_node=2, spines=1)).ticks())
    lateness, newest = p.engine.lateness_ns(), 0
    for f in frames[30:60]:  # the rest of the storm and after: it carries on
        p.ingest(f)
        newest = max(newest, int(f["ts"].max()))  # type: ignore[arg-type]
        p.advance(newest - lateness)
    assert p.engine.closed_ns is not None and before is not None and p.engine.closed_ns > before
    # and what it restored is written again as it was read
    again = checkpoint.loads(checkpoint.dumps(p, "pipeline"), "pipeline")
    assert alerts(again) == alerts(p)


# --- no pickle in the product ---------------------------------------------------------------------


def test_no_product_module_can_unpickle() -> None:
    banned = re.compile(
        r"^\s*(import|from)\s+(pickle|joblib|dill|shelve|marshal|cloudpickle|_pickle)\b"
        r"|allow_pickle\s*=\s*True",
        re.MULTILINE,
    )
    found = [
        f"{path.relative_to(ROOT)}: {m.group(0).strip()}"
        for pkg in PRODUCT
        for path in sorted((ROOT / pkg).rglob("*.py"))
        for m in banned.finditer(path.read_text())
    ]
    assert not found, found


# --- against the real broker ----------------------------------------------------------------------


def test_a_running_scale_out_service_refuses_forged_state_records(
    kafka_bootstrap: str, kafka_topics: Any, tmp_path: Path, scenario_8n: Path
) -> None:
    """Whoever can produce to the state topic writes, before the service starts, a record that
    would run code if it were unpickled, for every telemetry partition and for the detect
    stage. Each one is refused and counted (it carries no MAC; signed, the codec refuses it:
    the test above); nothing runs; the service works from scratch."""
    from kafka import KafkaProducer

    from rocewatch.bus.topics import ensure_detect_topics
    from rocewatch.config import KafkaConfig, TopicsConfig
    from rocewatch.runtime.service import DetectService

    names = ("telemetry", "alerts", "actions", "dead_letter", "steps", "state", "rollups")
    k = KafkaConfig(
        bootstrap_servers=kafka_bootstrap,
        topics=TopicsConfig(**{n: kafka_topics(n) for n in names}),
        group_id=kafka_topics("group"),
        partitions=2,
        commit_interval_s=0.5,
        idle_flush_s=2.0,
        session_timeout_ms=6000,
        scale_out=True,
        state_signing=SIGNING,
    )
    cfg = Config(topology=str(scenario_8n / "topology.yaml"), kafka=k, state_dir=str(tmp_path))
    n = ensure_detect_topics(k)
    marker = tmp_path / "ran"
    producer = KafkaProducer(bootstrap_servers=kafka_bootstrap)
    for p in range(n):
        producer.send(
            k.topics.state, key=f"agg-{p}".encode(), value=forged_pickle(marker), partition=p
        )
    producer.send(k.topics.state, key=b"detect", value=forged_pickle(marker), partition=n)
    producer.flush()
    producer.close()
    svc = DetectService(cfg)
    svc.run(max_idle_s=6.0)
    stats = svc.summary()["stats"]
    assert stats.get("checkpoint_rejected") == n + 1, stats
    assert stats.get("state_mac_rejected") == n + 1, stats
    assert not marker.exists()


def test_every_configuration_section_can_be_checkpointed() -> None:
    """The pipeline's checkpoint holds its Config: every section's dataclass must be on the
    allowlist, or a service configured with it (webhooks, gNMI targets, a Kubernetes executor)
    fails at its first checkpoint. The simulator's SimConfig is never part of a pipeline."""
    import dataclasses
    import importlib
    import pkgutil

    allowed = set(checkpoint.allowed().values())
    missing = []
    for pkg in ("rocewatch", "detectors", "actions", "collector", "storage"):
        for m in pkgutil.walk_packages(importlib.import_module(pkg).__path__, pkg + "."):
            if m.name.startswith(("rocewatch.sim", "storage.migrations")) or m.name.endswith(
                "_pb2"
            ):
                continue  # the simulator; Alembic's env (run by Alembic only)
            mod = importlib.import_module(m.name)
            for n, c in vars(mod).items():
                if (
                    isinstance(c, type)
                    and c.__module__ == mod.__name__
                    and dataclasses.is_dataclass(c)
                    and n.endswith("Config")
                    and c not in allowed
                ):
                    missing.append(f"{c.__module__}:{c.__qualname__}")
    assert missing == []


def test_a_package_of_state_names_every_class_of_its_modules_by_the_package() -> None:
    """The isolation forest is a package of modules: each of their classes is allowed and
    named by the package, as the committed v1 fixture names them (before the package existed),
    so moving a class between its modules changes no record."""
    import importlib
    import pkgutil

    import detectors.isolation_forest as pkg

    table = checkpoint.allowed()
    for m in pkgutil.iter_modules(pkg.__path__, pkg.__name__ + "."):
        mod = importlib.import_module(m.name)
        for c in vars(mod).values():
            if isinstance(c, type) and c.__module__ == mod.__name__:
                assert table.get(f"detectors.isolation_forest:{c.__qualname__}") is c, c
    raw = checkpoint.dumps(pkg.Threshold(sustain=2, clear=1), "example")
    body = checkpoint.check(raw)
    (n,) = checkpoint._LEN.unpack_from(body)
    header = checkpoint._header(body[checkpoint._LEN.size : checkpoint._LEN.size + n])
    assert b'"detectors.isolation_forest:Threshold"' in header
    assert b"isolation_forest.detector" not in header
    assert type(checkpoint.loads(raw, "example")) is pkg.Threshold


def test_a_config_with_webhooks_and_alertmanagers_round_trips() -> None:
    from rocewatch.config import config_from_dict

    cfg = config_from_dict(
        {
            "notify": {
                "webhooks": [{"name": "ops", "url": "https://hooks.example/x", "secret": "s3"}],
                "alertmanagers": [{"name": "am", "url": "http://127.0.0.1:9093"}],
            }
        }
    )
    assert checkpoint.loads(checkpoint.dumps(cfg, "test"), "test") == cfg
