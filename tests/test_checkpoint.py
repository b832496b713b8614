"""The checkpoint format (rocewatch/core/checkpoint.py, docs/formats/checkpoint.md).

What a user relies on: a restarted detector runs the configuration it is started with, and
carries on from its parts' state as if it had never stopped; a checkpoint holds that state as
data (never configuration, topology or the parts themselves); a state record or file that is
damaged, foreign, of another version or forged is refused with one line, counted, and never
executed; a record naming a type its reader did not declare is refused; nothing in the product
unpickles anything.
"""

from __future__ import annotations

import builtins
import collections
import dataclasses
import hashlib
import importlib
import logging
import math
import pickle  # to forge the pickles a checkpoint reader must refuse, never to read state
import pkgutil
import re
import struct
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import polars as pl
import pytest

from detectors.base import Finding
from detectors.registry import DETECTORS
from rocewatch.bus.signing import StateKeys
from rocewatch.bus.state_store import StateStore, Stored
from rocewatch.config import Config
from rocewatch.core import checkpoint
from rocewatch.core.checkpoint import CheckpointError, StateTypes
from rocewatch.core.model import Alert
from rocewatch.core.stats import Stats
from rocewatch.pipeline import Pipeline
from tests.support.state_keys import SIGNING

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = Path(__file__).parent / "fixtures"
PRODUCT = ("rocewatch", "detectors", "collector", "storage", "actions")
V1_REFUSED = r"^checkpoint format v1 not supported by this build \(reads v2\)$"


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


def record(
    root: Any, kind: str = "test", blobs: list[bytes] | None = None, major: int = 2
) -> bytes:
    """A checkpoint written by hand: a forger's, who knows the format."""
    blobs = blobs or []
    head = orjson.dumps({"kind": kind, "blobs": [["raw", len(b)] for b in blobs], "root": root})
    body = struct.pack("<I", len(head)) + head + b"".join(blobs)
    return b"RWCKPT" + bytes([major, 0]) + hashlib.sha256(body).digest() + body


def header(raw: bytes) -> dict[str, Any]:
    """A checkpoint's JSON header, as the reader finds it (after its checks)."""
    body = checkpoint.check(raw)
    (n,) = checkpoint._LEN.unpack_from(body)
    head = orjson.loads(checkpoint._header(body[checkpoint._LEN.size : checkpoint._LEN.size + n]))
    assert isinstance(head, dict)
    return head


def type_names(v: Any) -> Iterator[str]:
    """Every type name a header's value names (its ``$o`` objects and ``$N`` named tuples)."""
    if isinstance(v, list):
        if v and v[0] == "$o":
            yield v[2]
        elif v and v[0] == "$N":
            yield v[1]
        for x in v:
            yield from type_names(x)
    elif isinstance(v, dict):
        for x in v.values():
            yield from type_names(x)


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


@dataclasses.dataclass(frozen=True)
class _Cell:
    """A record type a test part declares (hashable: it keys a mapping below)."""

    row: int
    name: str


_Pair = collections.namedtuple("_Pair", "a b")


def test_declared_records_round_trip_and_shared_objects_stay_shared() -> None:
    """A frame, an array or a declared record held twice comes back as one (as the state had
    it); named tuples and records keep their type."""
    types = StateTypes([_Cell, _Pair, Finding])
    frame = pl.DataFrame({"x": [1]})
    arr = np.zeros(3)
    cell = _Cell(2, "leaf-0")
    f = Finding("PFCStorm", {"switch": "leaf-0"}, "critical", 5, "s", "e", extra={"k": "v"})
    value = {"a": [frame, arr, cell, f], "b": {cell: (frame, arr, f)}, "p": _Pair(1, cell)}
    back = checkpoint.loads(checkpoint.dumps(value, "test", types), "test", types)
    fr, a, c, g = back["a"]
    assert back["b"][c] == (fr, a, g)
    assert back["b"][c][0] is fr and back["b"][c][1] is a and back["b"][c][2] is g
    assert next(iter(back["b"])) is c and c == cell and type(c) is _Cell
    assert g == f and type(g) is Finding
    assert back["p"] == _Pair(1, cell) and type(back["p"]) is _Pair and back["p"].b is c


def test_a_snapshot_is_the_state_when_taken() -> None:
    """Encoded at once, written later (the scale-out stages write on a worker thread): what
    changes meanwhile, in place or not, in a declared record or not, is not in the record."""
    types = StateTypes([Finding])
    arr = np.arange(3.0)
    f = Finding("X", {"node": "gpu-001"}, "warning", 1, "s", "e")
    state = {"arr": arr, "n": 1, "f": f}
    snap = checkpoint.Snapshot(state, "test", types=types)
    arr[0] = 99.0
    state["n"] = 2
    f.labels["node"] = "gpu-002"
    state["f"] = dataclasses.replace(f, ts=7)
    back = checkpoint.loads(snap.record(), "test", types)
    assert back["n"] == 1 and back["arr"].tolist() == [0.0, 1.0, 2.0]
    assert back["f"].labels == {"node": "gpu-001"} and back["f"].ts == 1


def test_a_field_added_since_takes_its_default() -> None:
    """Compatibility within v2: a record written before a dataclass gained a field restores
    with the field's default (docs/formats/checkpoint.md says how other state evolves)."""
    types = StateTypes([Finding])
    name = StateTypes.name(Finding)
    old = {"alertname": "X", "labels": {"node": "n"}, "severity": "warning", "ts": 3}
    old |= {"summary": "s", "evidence": "e"}  # before ``description`` and ``extra``
    f = checkpoint.loads(record(["$o", 0, name, old]), types=types)
    assert f == Finding("X", {"node": "n"}, "warning", 3, "s", "e")
    assert f.description == "" and f.extra == {}
    g = checkpoint.loads(record(["$o", 0, name, old]), types=types)
    g.extra["k"] = "v"
    assert f.extra == {}  # each record its own default (a factory's, not one shared dict)


def test_what_is_not_data_is_not_written() -> None:
    """An undeclared class, an object array, a function, a logger: refused when writing (a
    bug to fix here, not a record nobody can read back)."""
    for bad in (object(), np.array([object()]), len, logging.getLogger("x")):
        with pytest.raises(CheckpointError):
            checkpoint.dumps({"x": bad}, "test")
    f = Finding("X", {}, "warning", 1, "s", "e")
    with pytest.raises(CheckpointError, match="is not a declared state type"):
        checkpoint.dumps({"x": f}, "test")  # a product record, but not declared here
    with pytest.raises(CheckpointError, match="is not a declared state type"):
        checkpoint.dumps({"x": f}, "test", StateTypes([Alert]))
    with pytest.raises(CheckpointError, match="is not a declared state type"):
        checkpoint.dumps(_Pair(1, 2), "test")


# --- the types a state may hold ------------------------------------------------------------------


def product_classes() -> Iterator[type]:
    """Every class the product's modules define (the simulator and Alembic's env aside)."""
    for pkg in PRODUCT:
        for m in pkgutil.walk_packages(importlib.import_module(pkg).__path__, pkg + "."):
            if m.name.startswith(("rocewatch.sim", "storage.migrations")) or m.name.endswith(
                "_pb2"
            ):
                continue  # the simulator; Alembic's env (run by Alembic only); protobuf
            mod = importlib.import_module(m.name)
            for c in vars(mod).values():
                if isinstance(c, type) and c.__module__ == mod.__name__:
                    yield c


@pytest.mark.slow  # imports every module of the product: 2 to 5 s on a loaded machine
def test_configuration_can_never_be_a_state_type() -> None:
    """Every configuration class of the product (``...Config``, and every class of a config
    module) is refused as a state type: a checkpoint can never carry configuration, so the
    file the operator edited is what runs after a restart. Exceptions are refused too."""
    configs = [
        c
        for c in product_classes()
        if c.__name__.endswith("Config") or c.__module__.rsplit(".", 1)[-1] == "config"
    ]
    # the sections an operator edits are among them
    names = {c.__name__ for c in configs}
    assert {"Config", "PolicyConfig", "KafkaConfig", "LifecycleConfig", "InhibitConfig"} <= names
    assert {e.config.__name__ for e in DETECTORS.values()} <= names
    assert len(configs) > 30
    for c in configs:
        with pytest.raises(TypeError, match="configuration or an error, not state"):
            StateTypes([c])
        t = StateTypes()
        with pytest.raises(TypeError):
            t.add(c)
        assert len(t) == 0
    for exc in (CheckpointError, ValueError, KeyError):
        with pytest.raises(TypeError, match="not state"):
            StateTypes([exc])


def test_two_state_types_of_one_name_are_refused() -> None:
    """A record names its type by name: two classes of one name would make it ambiguous."""
    First = type("Twin", (), {"__module__": "a.b"})
    Second = type("Twin", (), {"__module__": "c.b"})
    with pytest.raises(TypeError, match=r"two state types named 'b\.Twin'"):
        StateTypes([First, Second])
    assert len(StateTypes([First, First])) == 1


def test_the_pipelines_state_types_are_records_only() -> None:
    """What a pipeline's state may hold besides data: small records its parts declare. No
    configuration, topology, executor, detector or other part; nothing that acts on the world
    (a forged state could otherwise point one at something); no exception."""
    from rocewatch.core import topology

    types = Pipeline.state_types()
    assert len(types) > 10
    # every part's declared types are in it (the detectors', the lifecycle's alerts, ...)
    for cls in (e.detector for e in DETECTORS.values()):
        assert set(cls.STATE_TYPES) <= set(types.names), cls
    assert {Alert, Finding} <= set(types.names)
    topo_classes = {c for c in vars(topology).values() if isinstance(c, type)}
    detector_classes = {e.detector for e in DETECTORS.values()}
    for c, name in types.names.items():
        assert types.by_name[name] is c
        assert c.__module__.split(".")[0] in PRODUCT, c
        assert not checkpoint.is_config(c) and not issubclass(c, BaseException), c
        assert c not in topo_classes and c.__module__ != "rocewatch.core.topology", c
        assert c not in detector_classes and c is not Pipeline, c
        assert not c.__name__.endswith(("Detector", "Executor", "Config", "Pipeline")), c
        assert "Client" not in c.__name__ and "Engine" not in c.__name__, c
        assert not any(hasattr(c, m) for m in ("drain", "resume", "send", "connect")), c
        # a record names no importable module: the reader looks it up in this table only
        assert ":" not in name and not name.startswith(PRODUCT), name


# --- what is refused ------------------------------------------------------------------------------


def test_a_pickle_is_refused_not_run(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    with pytest.raises(CheckpointError, match=r"not a rocewatch checkpoint \(a pickle"):
        checkpoint.loads(forged_pickle(marker))
    with pytest.raises(CheckpointError, match=r"not a rocewatch checkpoint \(a pickle"):
        checkpoint.loads(forged_pickle(marker), "detect-state", Pipeline.state_types())
    assert not marker.exists()


UNDECLARED = [
    "os:system",
    "builtins:open",
    "subprocess:Popen",
    "executors.SlurmExecutor",
    "actions.executors:SlurmExecutor",
    "pipeline.Pipeline",
    "config.PolicyConfig",
    "topology.Topology",
    "xmlrpc.server:SimpleXMLRPCServer",
]


@pytest.mark.parametrize("name", UNDECLARED)
def test_a_record_naming_a_type_not_declared_is_refused(tmp_path: Path, name: str) -> None:
    """Read with no types, or with every type a pipeline's state may hold: a name not among
    them is refused, and nothing is imported, created or run."""
    marker = tmp_path / "ran"
    assert "xmlrpc.server" not in sys.modules  # (so that its absence below means something)
    for types in (checkpoint.NO_TYPES, Pipeline.state_types()):
        forged = record(["$o", 0, name, {"args": [str(marker), "w"]}])
        with pytest.raises(CheckpointError, match="checkpoint names a type not declared here"):
            checkpoint.loads(forged, types=types)
        with pytest.raises(CheckpointError, match="checkpoint names a type not declared here"):
            checkpoint.loads(record(["$N", name, str(marker), "w"]), types=types)
        nested = {"version": 2, "engine": {"history": [["$o", 0, name, {"cmd": "id"}]]}}
        with pytest.raises(CheckpointError, match="not declared here"):
            checkpoint.loads(record(nested, "detect-state"), "detect-state", types)
    assert not marker.exists()
    assert "xmlrpc.server" not in sys.modules


def test_a_product_record_type_is_refused_where_it_is_not_declared() -> None:
    """A record of a real state type (a finding, an alert) read by a part that did not
    declare it is refused: each reader accepts its own types only."""
    f = Finding("X", {}, "warning", 1, "s", "e")
    raw = checkpoint.dumps({"f": f}, "test", StateTypes([Finding]))
    assert checkpoint.loads(raw, "test", StateTypes([Finding]))["f"] == f
    for types in (checkpoint.NO_TYPES, StateTypes([Alert])):
        name = re.escape(repr(StateTypes.name(Finding)))
        with pytest.raises(CheckpointError, match=f"not declared here: {name}"):
            checkpoint.loads(raw, "test", types)
    # a named tuple's name naming a class that is not a tuple is refused, not half-built
    with pytest.raises(CheckpointError, match="not declared here"):
        checkpoint.loads(record(["$N", StateTypes.name(Finding), 1]), types=StateTypes([Finding]))


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
    with pytest.raises(CheckpointError, match="unknown object"):
        checkpoint.loads(record(["$r", 5]))
    # a blob table that claims more than the body holds, under a checksum that matches
    head = orjson.dumps({"kind": "test", "blobs": [["raw", 80]], "root": ["$A", 0, 0, "<f8", [10]]})
    body = struct.pack("<I", len(head)) + head + b"\x00" * 8
    lying = b"RWCKPT\x02\x00" + hashlib.sha256(body).digest() + body
    with pytest.raises(CheckpointError, match="blob table does not match"):
        checkpoint.loads(lying)


def test_another_major_version_gives_the_promised_error() -> None:
    good = bytearray(checkpoint.dumps({"a": 1}, "test"))
    assert good[6] == 2
    good[6] = 3
    with pytest.raises(
        CheckpointError, match=r"^checkpoint format v3 not supported by this build \(reads v2\)$"
    ):
        checkpoint.loads(bytes(good))
    good[6] = 1
    with pytest.raises(CheckpointError, match=V1_REFUSED):
        checkpoint.loads(bytes(good))
    good[6], good[7] = 2, 7  # a newer minor version of v2 is read
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


def stage_records(marker: Path) -> dict[str, bytes]:
    """Forged records for a stage's state: a pickle, a cut one, one of format v1 (the build
    before), and well-formed v2 records naming an executor or a configuration."""
    pipe = {"version": 2, "policy": ["$o", 0, "actions.executors:SlurmExecutor", {}]}
    cfg = {"version": 2, "pipeline": {"config": ["$o", 0, "config.PolicyConfig", {"mode": "auto"}]}}
    return {
        "pickle": forged_pickle(marker),
        "cut pickle": forged_pickle(marker)[:-9],
        "v1": (FIXTURES / "checkpoint_v1.ckpt").read_bytes(),
        "executor": record(pipe, "detect-state"),
        "config": record(cfg, "aggregate-state"),
    }


@pytest.mark.parametrize("what", ["pickle", "cut pickle", "v1", "executor", "config"])
def test_the_scale_out_stages_refuse_a_forged_state_record(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, what: str
) -> None:
    from rocewatch.core.topology import Topology
    from rocewatch.runtime.aggregate import Aggregator
    from rocewatch.runtime.detect import DomainStage
    from tests.test_topology import GOOD

    marker = tmp_path / "ran"
    raw = stage_records(marker)[what]
    cfg = Config()
    agg = Aggregator.__new__(Aggregator)
    agg.cfg, agg.k, agg.stats, agg.forest_s, agg.refused = cfg, cfg.kafka, Stats(), None, {}
    agg.store = _Store(raw, 41, "agg-3")  # type: ignore[assignment]
    with caplog.at_level(logging.ERROR):
        part = agg._restore(3)
        again = agg._restore(3)  # the partition back before a state of it was written
    # fresh state, read from the group's committed offset (the consumer's own start)
    assert part.offset is None and part.from_committed and part.engine.closed_ns is None
    assert again.offset is None and again.from_committed
    assert agg.stats.get("checkpoint_rejected") == 1  # one record: counted and logged once
    det = DomainStage.__new__(DomainStage)
    det.store = _Store(raw, 77, "detect")  # type: ignore[assignment]
    det.n_parts, det.state_key, det.name, det.holds = 4, "detect", "detect stage", Stats()
    det.refused = None
    pipe = Pipeline(Topology.from_dict(GOOD), cfg)
    with caplog.at_level(logging.ERROR):
        assert det._restore(pipe) is None
        assert det._restore(pipe) is None
    assert det.holds.get("checkpoint_rejected") == 1
    assert not marker.exists()
    assert pipe.engine.closed_ns is None and not pipe.lifecycle.firing
    lines = [r.getMessage() for r in caplog.records if "rejected" in r.getMessage()]
    assert len(lines) == 2
    assert "rocewatch.state/3@41" in lines[0] and "rocewatch.state/4@77" in lines[1]
    if what == "v1":
        assert "checkpoint format v1 not supported by this build (reads v2)" in lines[0]


# --- a pipeline carries on ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def recording() -> tuple[Any, list[pl.DataFrame]]:
    from rocewatch.sim import Simulator
    from rocewatch.sim.scenarios import default_scenario

    sim = Simulator(default_scenario(nodes=4, duration_s=12, seed=3))
    return sim.topology, list(sim.ticks())


def restarted(p: Pipeline, config: Config | None = None) -> Pipeline:
    """``p`` stopped and started again as the detect stage does: its state as a checkpoint
    record (``Pipeline.state_types()``), read back and laid over a pipeline built anew from
    ``config`` (``p``'s if none) and the topology."""
    raw = checkpoint.dumps(p.state(), "pipeline", Pipeline.state_types())
    q = Pipeline(p.topology, config or p.config, rollup_s=10)
    q.restore(checkpoint.loads(raw, "pipeline", Pipeline.state_types()))
    return q


def replay(topology: Any, frames: list[pl.DataFrame], cuts: set[int]) -> Pipeline:
    """Ticks into a pipeline, half a second per advance as a Kafka poll would; before each
    tick in ``cuts``, the pipeline is stopped and a restarted one carries on."""
    p = Pipeline(topology, Config(), rollup_s=10)
    lateness, newest = p.engine.lateness_ns(), 0
    for i, f in enumerate(frames):
        if i in cuts:
            p = restarted(p)
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
    assert cut.samples_in == whole.samples_in


def test_the_pipelines_state_holds_no_configuration(
    recording: tuple[Any, list[pl.DataFrame]],
) -> None:
    """A pipeline's state mid-storm, as the detect stage writes it: every type it names is a
    declared record, none of configuration or topology; a secret and a URL of the
    configuration (a webhook's), its policy mode and its thresholds are nowhere in it."""
    from rocewatch.config import config_from_dict

    topology, frames = recording
    cfg = config_from_dict(
        {
            "notify": {
                "webhooks": [
                    {"name": "ops", "url": "https://hooks.example/x9q", "secret": "s3cr3t-7"}
                ]
            },
            "policy": {"mode": "auto"},
            "detectors": {"pfc_storm": {"pause_fraction": 0.987654}},
        }
    )
    p = Pipeline(topology, cfg, rollup_s=10)
    lateness = p.engine.lateness_ns()
    for f in frames[:40]:
        p.ingest(f)
        p.advance(int(f["ts"].max()) - lateness)  # type: ignore[arg-type]
    assert p.lifecycle.firing  # mid-fault
    raw = checkpoint.dumps(p.state(), "pipeline", Pipeline.state_types())
    head = header(raw)
    named = set(type_names(head["root"]))
    assert named and named <= set(Pipeline.state_types().by_name)
    for n in named:
        c = Pipeline.state_types().by_name[n]
        assert not checkpoint.is_config(c) and c.__module__ != "rocewatch.core.topology", n
    text = orjson.dumps(head).decode()
    for value in ("s3cr3t-7", "hooks.example", "0.987654", "Config", "topology"):
        assert value not in text, value
    assert b"s3cr3t-7" not in raw
    # and the top level is the parts' state, by part
    assert set(head["root"]) >= {"version", "engine", "detectors", "lifecycle", "policy"}
    assert set(head["root"]["detectors"]) == {d.name for d in p.detectors}


@pytest.mark.slow  # 12 s of a small fabric twice: 2 to 4 s
def test_a_restored_pipeline_runs_todays_configuration(
    recording: tuple[Any, list[pl.DataFrame]],
) -> None:
    """Stopped mid-fault and started with an edited configuration: a detector now disabled
    has its state dropped (counted) and its open alert resolved at the next step; a changed
    detector setting is what runs (TransportErrors' ``sustain_s`` 9 s: its fault, 1 s long
    before the scenario ends, is no longer raised); the other alerts stay the same alerts
    (same startsAt), and one that owes nothing to the change ends as in the uninterrupted
    run (a fabric incident counting the flaky link among its members may end sooner)."""
    from detectors.flaky_link import FlakyLinkConfig
    from detectors.transport_errors import TransportErrorsConfig

    topology, frames = recording
    whole = replay(topology, frames, set())
    assert "TransportErrors" in {a["labels"]["alertname"] for a in alerts(whole)}
    p = Pipeline(topology, Config(), rollup_s=10)
    lateness = p.engine.lateness_ns()
    cut = 80
    for f in frames[:cut]:
        p.ingest(f)
        p.advance(int(f["ts"].max()) - lateness)  # type: ignore[arg-type]
    flaky = {fp for fp, a in p.lifecycle.firing.items() if a.name == "FlakyLink"}
    kept = {fp: a.starts_at for fp, a in p.lifecycle.firing.items() if a.name != "FlakyLink"}
    assert flaky and kept  # mid-fault: FlakyLink, PCIeDowngrade, FabricIncident firing
    edited = Config(
        detectors={
            "flaky_link": FlakyLinkConfig(enabled=False),
            "transport_errors": TransportErrorsConfig(sustain_s=9.0),
        }
    )
    q = restarted(p, edited)
    assert "flaky_link" not in {d.name for d in q.detectors}
    assert q.stats.get("state_ignored_disabled_detectors") == 1
    assert q.stats.get("restored_alerts_resolved") == len(flaky)
    te = next(d for d in q.detectors if d.name == "transport_errors")
    assert te.sustain.sustain_s == 9.0  # type: ignore[attr-defined]
    out = q.advance(int(frames[cut]["ts"].max()) - lateness)  # type: ignore[arg-type]
    assert flaky <= {a.fingerprint for a in out.alerts if a.status == "resolved"}
    for f in frames[cut:]:
        q.ingest(f)
        q.advance(int(f["ts"].max()) - lateness)  # type: ignore[arg-type]
    q.finish()
    names = {a.name for a in q.all_alerts()}
    assert "TransportErrors" not in names and "FlakyLink" in names  # (resolved, retained)
    ends = {a["fingerprint"]: a for a in alerts(whole)}
    seen = set()
    for a in q.all_alerts():
        if a.fingerprint in kept:
            seen.add(a.name)
            assert a.starts_at == kept[a.fingerprint]
            if a.name == "PCIeDowngrade":
                assert a.to_json() == ends[a.fingerprint]
    assert {"PCIeDowngrade", "FabricIncident"} <= seen


def test_a_restored_partition_closes_the_steps_an_uninterrupted_one_closes() -> None:
    """Stage 1 of scale-out: a telemetry partition's state record (window engine, rollups,
    the forest's feed) read back into parts built anew carries on with the same steps."""
    from detectors.isolation_forest import FeatureFeed
    from detectors.windows import WindowEngine
    from rocewatch.bus.state_store import StateSnapshot
    from rocewatch.pipeline import Rollups
    from rocewatch.runtime.aggregate import STATE_VERSION, AggState, load_agg_state
    from rocewatch.sim import Simulator
    from rocewatch.sim.scenarios import default_scenario

    cfg = default_scenario(nodes=2, duration_s=2.5, seed=5)
    frames = list(Simulator(dataclasses.replace(cfg, nics_per_node=2, spines=1)).ticks())

    def run(cut: int | None) -> tuple[list[pl.DataFrame], list[pl.DataFrame]]:
        eng, feed, out, rolled = WindowEngine(Config().window, Stats()), FeatureFeed(1.0), [], []
        rollups = [Rollups(1)]  # 1 s buckets: some close before the cut, some after
        for i, f in enumerate(frames):
            if i == cut:
                st = AggState(STATE_VERSION, 0, eng, i, 0, rollups, feed)
                new_eng, new_feed = WindowEngine(Config().window, Stats()), FeatureFeed(1.0)
                new_rollups = [Rollups(1)]
                raw = StateSnapshot(st).start().record()
                back = load_agg_state(raw, new_eng, new_rollups, new_feed)
                assert back.offset == i and back.partition == 0
                assert back.engine is new_eng and back.forest is new_feed
                assert back.rollups == new_rollups
                assert new_rollups[0].bucket == rollups[0].bucket is not None
                assert new_eng.closed_ns == eng.closed_ns and new_eng.pending
                eng, feed, rollups = new_eng, new_feed, new_rollups
            eng.add(f)
            for step in eng.close_until(int(f["ts"].max()) - eng.lateness_ns()):  # type: ignore[arg-type]
                eng.enter(step)
                feed.add(step)
                done = rollups[0].add(step)
                if done is not None:
                    rolled.append(done)
                out.append(step.frame.sort(["device", "port", "qual", "metric"]))
        last = rollups[0].flush()
        return out, [*rolled, *([last] if last is not None else [])]

    (whole, whole_rolled), (cut, cut_rolled) = run(None), run(len(frames) // 2)
    assert len(whole) == len(cut) > 15
    assert all(a.equals(b) for a, b in zip(whole, cut, strict=True))
    # the open bucket at the stop is the same bucket after it: the same rollups
    assert len(whole_rolled) == len(cut_rolled) >= 2
    key = ["bucket_start_ns", "device", "port", "qual", "metric"]
    for a, b in zip(whole_rolled, cut_rolled, strict=True):
        assert a.sort(key).equals(b.sort(key))


def test_a_partition_state_of_another_kind_or_version_is_refused() -> None:
    from detectors.windows import WindowEngine
    from rocewatch.runtime.aggregate import AGG_STATE_KIND, load_agg_state

    eng = WindowEngine()
    with pytest.raises(CheckpointError, match="partition state version 1, reads 2"):
        load_agg_state(record({"version": 1}, AGG_STATE_KIND), eng)
    with pytest.raises(CheckpointError, match="expected 'aggregate-state'"):
        load_agg_state(record({"version": 2}, "detect-state"), eng)
    assert eng.closed_ns is None and not eng.pending


# --- format version 1, as released: refused -------------------------------------------------


def test_a_version_1_checkpoint_is_refused_with_the_promised_message() -> None:
    """tests/fixtures/checkpoint_v1.ckpt (made by tests/fixtures/checkpoint_v1_make.py with the
    build of format v1): a pipeline's object graph, its configuration included. This build
    refuses it with one line; the stage rebuilds from its committed offsets."""
    data = (FIXTURES / "checkpoint_v1.ckpt").read_bytes()
    assert data[:8] == b"RWCKPT\x01\x00" and len(data) < 200_000
    for kind, types in ((None, checkpoint.NO_TYPES), ("pipeline", Pipeline.state_types())):
        with pytest.raises(CheckpointError, match=V1_REFUSED):
            checkpoint.loads(data, kind, types)
    from rocewatch.runtime.detect import load_detect_state
    from rocewatch.sim import Simulator
    from tests.fixtures.checkpoint_v2_make import scenario

    pipe = Pipeline(Simulator(scenario()).topology, Config())
    with pytest.raises(CheckpointError, match=V1_REFUSED):
        load_detect_state(data, pipe)


# --- format version 2, as released ----------------------------------------------------------------


@pytest.mark.slow  # 6 s of a small fabric, twice: 2 to 4 s on a loaded machine
def test_a_version_2_checkpoint_restores_and_carries_on() -> None:
    """tests/fixtures/checkpoint_v2.ckpt (made by tests/fixtures/checkpoint_v2_make.py): a
    pipeline's state written by the first build of format v2, halfway through a storm. This
    build restores it into a pipeline built from ``Config()`` and the scenario's topology, and
    carries on as the uninterrupted pipeline does: the storm's alerts go on as the same
    alerts (same startsAt), and the storm's end gives the same alerts."""
    import itertools

    from rocewatch.sim import Simulator
    from tests.fixtures.checkpoint_v2_make import CUT, run, scenario

    data = (FIXTURES / "checkpoint_v2.ckpt").read_bytes()
    assert data[:8] == b"RWCKPT\x02\x00" and len(data) < 400_000
    sim = Simulator(scenario())
    frames = list(itertools.islice(sim.ticks(), 60))  # the rest of the storm and after
    p = Pipeline(sim.topology, Config(), rollup_s=None)
    dropped = p.restore(checkpoint.loads(data, "pipeline", Pipeline.state_types()))
    assert dropped == {}
    firing = {fp: a.starts_at for fp, a in p.lifecycle.firing.items()}
    assert "PFCStorm" in {a.name for a in p.lifecycle.firing.values()}
    before = p.engine.closed_ns
    whole = run(sim.topology, frames)  # today's build, uninterrupted
    run(sim.topology, frames[CUT:], p)
    assert p.engine.closed_ns is not None and before is not None and p.engine.closed_ns > before
    # the storm's alerts carried on as the same alerts, and the end is the uninterrupted one's
    for a in p.all_alerts():
        if a.fingerprint in firing:
            assert a.starts_at == firing[a.fingerprint]
    assert alerts(p) == alerts(whole)
    # and what it restored is written again as it is now, and read back the same
    again = checkpoint.loads(
        checkpoint.dumps(p.state(), "pipeline", Pipeline.state_types()),
        "pipeline",
        Pipeline.state_types(),
    )
    q = Pipeline(sim.topology, Config(), rollup_s=None)
    q.restore(again)
    assert alerts(q) == alerts(p)


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


def test_the_tests_checkpoint_through_the_product_codec() -> None:
    """A "checkpoint taken mid-fault" test must go through what the service does; pickle is
    imported only by tests that forge a pickle to show it is refused."""
    forging = {"test_checkpoint.py", "test_isolation_forest.py"}
    users = {
        p.name
        for p in (ROOT / "tests").rglob("*.py")
        if re.search(r"^\s*import pickle\b|^\s*from pickle\b", p.read_text(), re.MULTILINE)
    }
    assert users <= forging, users - forging


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
    # the detect stage's: a well-formed v2 record naming an executor, not a declared type
    forged = record(
        {"version": 2, "pipeline": {"policy": ["$o", 0, "executors.SlurmExecutor", {}]}},
        "detect-state",
    )
    producer.send(k.topics.state, key=b"detect", value=forged, partition=n)
    producer.flush()
    producer.close()
    svc = DetectService(cfg)
    svc.run(max_idle_s=6.0)
    stats = svc.summary()["stats"]
    assert stats.get("checkpoint_rejected") == n + 1, stats
    assert stats.get("state_mac_rejected") == n + 1, stats  # (unsigned; signed: the codec)
    assert not marker.exists()
