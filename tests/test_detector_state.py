"""Every registered detector's state (rocewatch/core/state.py), as the detect stage checkpoints
it: data that round-trips exactly through the product's codec with only the types the
detector declares, that holds none of its configuration, and that a detector built from
another configuration takes over with that configuration's values (``PARAMS``).

What a user relies on: an edited configuration file is what runs after a restart, and a
restart loses nothing a detector had learned (docs/operations.md).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

import polars as pl
import pytest

from detectors.registry import DETECTORS
from rocewatch.config import Config
from rocewatch.core import checkpoint
from rocewatch.core.errors import ConfigError
from rocewatch.pipeline import Pipeline
from tests.support.restart import own_types, restart_part, through_codec

NAMES = list(DETECTORS)
# the helpers that take configuration values, where each detector keeps them (so that the
# check below cannot pass by finding none)
HELPERS = {
    "ecn_congestion": {"['sustain']"},
    "queue_buildup": {"['sustain']", "['sketch']"},
    "transport_errors": {"['sustain']"},
    "isolation_forest": {"['kinds']['nic'].threshold", "['kinds']['port'].threshold"},
}


@pytest.fixture(scope="module")
def mid_fault() -> tuple[Any, Pipeline]:
    """A pipeline of every detector, 8 s into the simulator's default scenario (a storm over,
    a flaky link, a PCIe downgrade and a fabric incident firing)."""
    from rocewatch.sim import Simulator
    from rocewatch.sim.scenarios import default_scenario

    sim = Simulator(default_scenario(nodes=4, duration_s=8.5, seed=3))
    p = Pipeline(sim.topology, Config(), rollup_s=None)
    lateness = p.engine.lateness_ns()
    for f in sim.ticks():
        p.ingest(f)
        p.advance(int(f["ts"].max()) - lateness)  # type: ignore[arg-type]
    assert {"FlakyLink", "PCIeDowngrade", "FabricIncident"} <= {
        a.name for a in p.lifecycle.firing.values()
    }
    return sim.topology, p


def encoded(det: Any) -> bytes:
    """A detector's state as a record (the same state gives the same bytes)."""
    return checkpoint.dumps(det.state(), "detector", own_types(det))


def changed_configs(cfg_cls: type) -> Iterator[tuple[str, Any]]:
    """The configuration with each numeric setting changed in turn (settings whose change
    its validation refuses left out)."""
    base = cfg_cls()
    for f in dataclasses.fields(cfg_cls):
        v = getattr(base, f.name)
        if isinstance(v, bool) or not isinstance(v, int | float):
            continue
        new = v + 1 if isinstance(v, int) else (v * 1.5 if v else 0.5)
        try:
            yield f.name, dataclasses.replace(base, **{f.name: new})
        except (ConfigError, ValueError, TypeError):
            continue


def walk(a: Any, b: Any, path: str = "", depth: int = 0) -> Iterator[tuple[str, Any, Any]]:
    """Pairs of helpers (objects with ``PARAMS``) found at the same place in two states."""
    if depth > 4 or type(a) is not type(b):
        return
    if getattr(type(a), "PARAMS", None) is not None:
        yield path, a, b
    if isinstance(a, dict):
        for k in a.keys() & b.keys():
            yield from walk(a[k], b[k], f"{path}[{k!r}]", depth + 1)
    elif hasattr(a, "__dict__") and not isinstance(a, type | pl.DataFrame):
        for k in vars(a).keys() & vars(b).keys():
            yield from walk(vars(a)[k], vars(b)[k], f"{path}.{k}", depth + 1)


@pytest.mark.parametrize("name", NAMES)
def test_a_detectors_state_round_trips_exactly_mid_fault(
    mid_fault: tuple[Any, Pipeline], name: str
) -> None:
    """Mid-fault, a detector's state through the codec with only its own declared types,
    restored into a detector built anew, is the same state (the same record, byte for byte)."""
    topology, p = mid_fault
    (det,) = [d for d in p.detectors if d.name == name]
    cls = DETECTORS[name].detector
    again = restart_part(det, cls(topology, det.config))
    assert again is not det
    assert encoded(again) == encoded(det)


@pytest.mark.parametrize("name", NAMES)
def test_a_fresh_detectors_state_holds_none_of_its_configuration(name: str) -> None:
    """The state of a detector just built, laid over one built from a configuration with any
    one setting changed, leaves that detector exactly as its own configuration built it: no
    configured value travels in the state (each setting changed in turn)."""
    from rocewatch.sim import Simulator
    from rocewatch.sim.scenarios import default_scenario

    topology = Simulator(default_scenario(nodes=2, duration_s=0.5, seed=3)).topology
    cls, cfg_cls = DETECTORS[name].detector, DETECTORS[name].config
    old = cls(topology, cfg_cls())
    tried = 0
    for setting, cfg in changed_configs(cfg_cls):
        want = encoded(cls(topology, cfg))
        got = restart_part(old, cls(topology, cfg))
        assert encoded(got) == want, f"{name}.{setting}: the state carried the old value"
        tried += 1
    assert tried or name == "fabric_incident" or not dataclasses.fields(cfg_cls)


@pytest.mark.parametrize("name", NAMES)
def test_restored_helpers_take_todays_configuration_mid_fault(
    mid_fault: tuple[Any, Pipeline], name: str
) -> None:
    """Mid-fault, restored into a detector built from a configuration with any one setting
    changed: every helper that takes configuration values (a ``Sustain``, a ``Sketch``, a
    ``Threshold``) has today's values where the new detector has the same helper."""
    topology, p = mid_fault
    (det,) = [d for d in p.detectors if d.name == name]
    cls, cfg_cls = DETECTORS[name].detector, DETECTORS[name].config
    data = through_codec(det.state(), own_types(det))
    for setting, cfg in changed_configs(cfg_cls):
        fresh = cls(topology, cfg)
        got = cls(topology, cfg)
        got.restore(data)
        found = set()
        for path, a, b in walk(got.state(), fresh.state()):
            found.add(path)
            for param in type(a).PARAMS:
                assert getattr(a, param) == getattr(b, param), f"{name}.{setting}: {path}.{param}"
        assert found >= HELPERS.get(name, set()), found
        data = through_codec(det.state(), own_types(det))  # restore takes its data over


def test_slow_edge_checkpoint_taken_mid_fault_carries_on_without_a_new_alert() -> None:
    """A SlowEdge firing when the checkpoint is taken (the default scenario has no NCCL job:
    a four-rank communicator with one slow edge instead): restored through the codec with only
    its declared types into a detector built anew (window engine included), the same state,
    byte for byte; it keeps firing as the same alert (same startsAt) and resolves as the one
    that never stopped would."""
    from detectors.slow_edge import SlowEdgeDetector
    from tests.support.nccl_edges import run, topology

    topo = topology()

    def slow(sec: int) -> dict[tuple[int, int], float]:
        return {(1, 2): 3.0} if 3 <= sec < 14 else {}

    det = SlowEdgeDetector(topo)
    eng, found = run(det, topo, range(10), slow)
    assert found[-1] and det.edges[(found[-1][0].labels["comm"], 1, 2)].active
    again = restart_part(det, SlowEdgeDetector(topo))
    assert encoded(again) == encoded(det)
    eng2 = restart_part(eng, type(eng)(eng.config))
    _, cont = run(det, topo, range(10, 24), slow, engine=eng)
    _, cont2 = run(again, topo, range(10, 24), slow, engine=eng2)
    assert cont2 == cont
    assert cont[0][0].ts == found[-1][0].ts  # still the alert that fired before the restart
    assert cont[-1] == []  # and it resolved once the edge was back
