"""PortAnomaly (detectors/isolation_forest/) on simulated telemetry.

A small fabric (8 nodes x 4 NICs, 2 spines) keeps the suite fast: each scenario is simulated
and closed into window-engine steps once, then replayed into as many detectors as the tests
need. Expectations come from the simulator's ground truth, never from numbers of an earlier run.
"""

from __future__ import annotations

import dataclasses
import json
import pickle
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
from sklearn.ensemble import IsolationForest

from detectors.base import Finding, StepContext
from detectors.isolation_forest import (
    MODEL_KIND,
    CompiledForest,
    ForestModel,
    IsolationForestConfig,
    IsolationForestDetector,
    _transform,
    feature_names,
)
from detectors.isolation_forest.model import MODEL_TYPES
from detectors.transport_errors import TransportErrorsConfig
from detectors.windows import Step, WindowEngine
from rocewatch.cli import main
from rocewatch.config import config_from_dict
from rocewatch.core import checkpoint
from rocewatch.core.errors import ConfigError
from rocewatch.sim import (
    JobSpec,
    PcieDowngrade,
    SimConfig,
    Simulator,
    TransportErrors,
    write_scenario,
)
from rocewatch.sim import scenarios as sc
from tests.support.restart import restart_part

S = 1_000_000_000
BASELINE = IsolationForestConfig(baseline_s=8.0, retrain_every_s=0.0)


def small(cfg: SimConfig) -> SimConfig:
    return dataclasses.replace(cfg, nics_per_node=4, spines=2)


HEALTHY = small(sc.healthy_scenario(nodes=8, duration_s=16, seed=5))
MOE = small(sc.moe_scenario(nodes=8, duration_s=16, seed=5))
FAULTS = small(sc.default_scenario(nodes=8, duration_s=20, seed=1))
# rare retransmissions on one NIC (~1-2 errors/s, out_of_sequence ~20/s) next to a PCIe downgrade
# that the rules explain (and whose congestion spills onto its leaf's other NICs). The
# TransportErrors rule's baseline rule (5+ errors in 8 s, far past a NIC's own and its peers'
# near-zero baseline) finds the retransmissions since 047d006: with every rule on, they are the
# rule's. With that rule off (NO_TRANSPORT_RULE: what a fault no enabled rule covers looks like)
# only the forest sees them
SUBTLE = small(
    SimConfig(
        nodes=8,
        duration_s=14,
        seed=11,
        name="subtle",
        faults=(
            TransportErrors(onset_s=3.0, duration_s=10.0, scale=0.01),
            PcieDowngrade(onset_s=3.0),
        ),
    )
)

# the detectors' settings of a fabric without the TransportErrors rule
NO_TRANSPORT_RULE: dict[str, Any] = {"transport_errors": TransportErrorsConfig(enabled=False)}

_RECORDED: dict[SimConfig, tuple[Simulator, list[Step]]] = {}


def recorded(cfg: SimConfig) -> tuple[Simulator, list[Step]]:
    """The scenario's telemetry as closed window-engine steps (simulated once per session)."""
    if cfg not in _RECORDED:
        sim = Simulator(cfg)
        eng = WindowEngine()
        steps: list[Step] = []
        for frame in sim.ticks():
            eng.add(frame)
            newest = frame.get_column("ts").max()
            assert isinstance(newest, int)
            steps += eng.close_until(newest - eng.lateness_ns())
        steps += eng.finish()
        _RECORDED[cfg] = (sim, steps)
    return _RECORDED[cfg]


def run(
    cfg: SimConfig,
    config: IsolationForestConfig,
    cut: int | None = None,
    after: IsolationForestConfig | None = None,
) -> tuple[IsolationForestDetector, dict[tuple[tuple[str, str], ...], tuple[int, Finding]]]:
    """Feed a scenario to a fresh detector; its first finding per entity, with the step end.
    With ``cut``, the detector stops before that step and starts again: its state through the
    product's checkpoint codec, laid over one built anew from ``after`` (``config`` if none)."""
    sim, steps = recorded(cfg)
    det = IsolationForestDetector(sim.topology, config)
    eng = WindowEngine()
    eng.keep_history(det.window_s)
    first: dict[tuple[tuple[str, str], ...], tuple[int, Finding]] = {}
    for i, st in enumerate(steps):
        if i == cut:
            det = restart_part(det, IsolationForestDetector(sim.topology, after or config))
        eng.enter(st)
        for f in det.evaluate(StepContext(eng, sim.topology, st.start, st.end)):
            first.setdefault(tuple(sorted(f.labels.items())), (st.end, f))
    return det, first


def entity(labels: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in labels.items() if k in ("node", "nic", "switch", "port")}


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> tuple[IsolationForestDetector, Path]:
    det, found = run(HEALTHY, BASELINE)
    assert not found, [entity(f.labels) for _, f in found.values()]
    path = tmp_path_factory.mktemp("iforest") / "model.rwforest"
    det.save(path)
    return det, path


# --- baseline ------------------------------------------------------------------------------------


@pytest.mark.slow
def test_learns_a_baseline_then_stays_silent_on_healthy_traffic(
    trained: tuple[IsolationForestDetector, Path],
) -> None:
    det, _ = trained
    sim, _ = recorded(HEALTHY)
    assert det.model is not None and det.fits == 1
    meta = det.model.meta
    assert meta["trained"] == "baseline" and meta["seed"] == 0
    start = HEALTHY.start_ns
    assert 8 * S <= meta["to_ns"] - start <= 10 * S  # fitted once 8 windows of 1 s were in
    nics = len(sim.topology.nics)
    assert meta["rows"]["nic"] == 8 * nics  # every NIC, every baseline window
    for kind in ("nic", "port"):
        m = det.model.kinds[kind]
        assert m.features == feature_names(kind)
        assert 0.5 < m.threshold < 1.0
        assert len(det.kinds[kind].last_scores) > 0  # it scored after the baseline


@pytest.mark.slow
def test_raises_nothing_until_the_baseline_is_complete() -> None:
    # faults from 3.3 s on; with no model the first 10 s only teach the baseline
    det, found = run(FAULTS, dataclasses.replace(BASELINE, baseline_s=10.0))
    assert det.model is not None
    fitted = det.model.meta["to_ns"]
    assert fitted - FAULTS.start_ns >= 10 * S
    assert found, "faults after the baseline (incast, transport errors) go unnoticed"
    assert all(end > fitted for end, _ in found.values())
    truth = Simulator(FAULTS).truth()
    late = next(f for f in truth["faults"] if f["kind"] == "TransportErrors")
    assert any(late["labels"].items() <= f.labels.items() for _, f in found.values())


# --- detection -----------------------------------------------------------------------------------


@pytest.mark.slow
def test_flags_each_fault_on_its_own_entity(trained: tuple[IsolationForestDetector, Path]) -> None:
    _, path = trained
    _, found = run(FAULTS, dataclasses.replace(BASELINE, model_path=str(path)))
    truth = Simulator(FAULTS).truth()
    faults = [f for f in truth["faults"] if "PortAnomaly" in f["also"]]
    assert {f["kind"] for f in faults} == {
        "FlakyLink",
        "PcieDowngrade",
        "EcnIncast",
        "TransportErrors",
    }
    for fault in faults:
        hits = [
            (end, f)
            for end, f in found.values()
            if fault["onset_ns"] <= f.ts <= fault["end_ns"] + S
            and any(m.items() <= f.labels.items() for m in fault["match"])
        ]
        assert hits, f"{fault['kind']} on {fault['labels']} not flagged"
        ttd = (min(f.ts for _, f in hits) - fault["onset_ns"]) / S
        assert 0 < ttd <= 5.0, (fault["kind"], ttd)
        _, f = hits[0]
        assert f.alertname == "PortAnomaly" and f.severity == "warning"
        assert "features that pushed it" in f.evidence and f.extra["features"]
    # the explanation names what broke
    by_kind = {
        fault["kind"]: {
            f.extra["features"]
            for _, f in found.values()
            if any(m.items() <= f.labels.items() for m in fault["match"])
        }
        for fault in faults
    }
    assert any("retransmit_errors" in x for x in by_kind["TransportErrors"])
    assert any("crc_errors" in x or "fcs_errors" in x for x in by_kind["FlakyLink"])
    assert any("pcie_speed_ratio" in x for x in by_kind["PcieDowngrade"])
    # nothing in the healthy lead-in, and nothing outside the faults' time
    onset = min(f["onset_ns"] for f in truth["faults"])
    for _, f in found.values():
        assert f.ts > onset
        assert any(x["onset_ns"] <= f.ts <= x["end_ns"] + 2 * S for x in truth["faults"])


@pytest.mark.slow  # the faults' scenario twice
def test_a_checkpoint_taken_mid_fault_carries_on() -> None:
    """Stopped mid-fault, its baseline learned and its first findings raised, and started
    again from its state through the product's checkpoint codec (built anew from the
    configuration): the same findings at the same steps as the uninterrupted detector."""
    _, steps = recorded(FAULTS)
    onset = min(f["onset_ns"] for f in Simulator(FAULTS).truth()["faults"])
    whole_det, whole = run(FAULTS, BASELINE)
    assert whole_det.model is not None and whole_det.fits >= 1
    # mid-fault: some found before the stop, some after
    ends = sorted(end for end, _ in whole.values())
    cut = next(i for i, st in enumerate(steps) if st.end > ends[0])
    assert onset < steps[cut].start and steps[cut].end <= ends[-1]
    det, found = run(FAULTS, BASELINE, cut=cut)
    assert found == whole
    assert det.fits == whole_det.fits and det.windows == whole_det.windows


def test_a_restored_detector_takes_todays_sustain_and_clear_windows() -> None:
    """The thresholds' streaks are state, their ``sustain``/``clear`` configuration
    (``Threshold.PARAMS``): restored into a detector built with ``sustain_windows`` 5, two
    windows above before the stop count, and the entity enters at today's fifth, not the
    third the old configuration said."""
    topo = Simulator(SimConfig(nodes=2, nics_per_node=2, spines=1, duration_s=0.5)).topology
    old = IsolationForestDetector(topo, BASELINE)
    th = old.kinds["nic"].threshold
    assert (th.sustain, th.clear) == (3, 2)
    idx, hot = np.array([0, 1]), np.array([0.9, 0.9])
    for _ in range(2):
        th.update(idx, hot, 2)
    today = dataclasses.replace(BASELINE, sustain_windows=5, clear_windows=4)
    new = restart_part(old, IsolationForestDetector(topo, today))
    t2 = new.kinds["nic"].threshold
    assert (t2.sustain, t2.clear) == (5, 4) and t2.streak.tolist() == [2, 2]
    assert [t2.update(idx, hot, 2)[0].tolist() for _ in range(3)] == [[], [], [0, 1]]
    # and it leaves after today's 4 calm windows
    cool = np.array([0.1, 0.1])
    assert [t2.update(idx, cool, 2)[1].tolist() for _ in range(4)] == [[], [], [], [0, 1]]


@pytest.mark.slow
def test_moe_traffic_with_its_own_baseline_raises_nothing() -> None:
    det, found = run(MOE, BASELINE)
    assert det.model is not None and len(det.kinds["nic"].last_scores) > 0
    assert not found, [entity(f.labels) for _, f in found.values()]


@pytest.mark.slow
def test_a_workload_the_model_never_saw_is_not_a_flood_of_anomalies(
    trained: tuple[IsolationForestDetector, Path],
) -> None:
    # MoE all-to-all scored by a model of all-reduce traffic: nearly everything is "novel"
    _, path = trained
    det, found = run(MOE, dataclasses.replace(BASELINE, model_path=str(path)))
    assert det.shifted_windows > 0
    assert not found


# --- persistence ---------------------------------------------------------------------------------


@pytest.mark.slow
def test_save_and_load_give_identical_scores(
    trained: tuple[IsolationForestDetector, Path],
) -> None:
    det, path = trained
    assert det.model is not None
    loaded = ForestModel.load(path)
    assert loaded.meta == det.model.meta and loaded.features == det.model.features
    for kind in ("nic", "port"):
        raw = np.concatenate([r for _, r in det.kinds[kind].rows])
        x = _transform(kind, raw)
        a = det.model.score(kind, x, det.config.envelope_scales)
        b = loaded.score(kind, x, det.config.envelope_scales)
        assert np.array_equal(a, b)
        assert loaded.kinds[kind].threshold == det.model.kinds[kind].threshold
        # the array scorer is scikit-learn's own score, without scikit-learn
        m = loaded.kinds[kind]
        filled = np.where(np.isnan(x), m.median, x)
        forest = IsolationForest(n_estimators=20, max_samples=64, random_state=1).fit(filled)
        assert np.allclose(
            CompiledForest.of(forest).score(filled), -forest.score_samples(filled), atol=1e-12
        )
    # a detector that loads the file scores the next telemetry like the one that learned it
    fresh, _ = run(HEALTHY, dataclasses.replace(BASELINE, model_path=str(path)))
    for kind in ("nic", "port"):
        raw = np.concatenate([r for _, r in det.kinds[kind].rows])
        assert fresh.model is not None
        x = _transform(kind, raw)
        assert np.array_equal(fresh.model.score(kind, x, 8.0), det.model.score(kind, x, 8.0))


def test_a_model_for_another_feature_list_is_a_config_error(
    trained: tuple[IsolationForestDetector, Path], tmp_path: Path
) -> None:
    _, path = trained
    doc: dict[str, Any] = checkpoint.loads(path.read_bytes(), MODEL_KIND, MODEL_TYPES)
    doc["features"]["nic"] = [*feature_names("nic")[:-1], "nvlink_errors_per_s"]
    bad = tmp_path / "other.model"
    bad.write_bytes(checkpoint.dumps(doc, MODEL_KIND, MODEL_TYPES))
    with pytest.raises(ConfigError, match="another feature list"):
        ForestModel.load(bad)
    sim, _ = recorded(HEALTHY)
    with pytest.raises(ConfigError, match="another feature list"):
        IsolationForestDetector(sim.topology, IsolationForestConfig(model_path=str(bad)))
    doc["features"]["nic"] = feature_names("nic")
    doc["version"] = 99
    bad.write_bytes(checkpoint.dumps(doc, MODEL_KIND, MODEL_TYPES))
    with pytest.raises(ConfigError, match="version"):
        ForestModel.load(bad)
    (tmp_path / "junk.joblib").write_bytes(b"not a model")
    with pytest.raises(ConfigError, match="not an isolation-forest model"):
        ForestModel.load(tmp_path / "junk.joblib")
    with pytest.raises(ConfigError, match="no such model file"):
        ForestModel.load(tmp_path / "missing.joblib")
    # a model file of before (a joblib pickle) is refused, never unpickled
    (tmp_path / "old.joblib").write_bytes(pickle.dumps({"format": "rocewatch-isolation-forest"}))
    with pytest.raises(ConfigError, match=r"never loaded.*retrain it"):
        ForestModel.load(tmp_path / "old.joblib")


@pytest.mark.slow
def test_cli_replay_refuses_a_bad_model_in_one_line(
    trained: tuple[IsolationForestDetector, Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    scenario = tmp_path / "tiny"
    write_scenario(SimConfig(nodes=2, nics_per_node=2, spines=1, duration_s=0.5), scenario)
    doc: dict[str, Any] = checkpoint.loads(trained[1].read_bytes(), MODEL_KIND, MODEL_TYPES)
    doc["features"]["port"] = ["role"]
    (tmp_path / "bad.joblib").write_bytes(checkpoint.dumps(doc, MODEL_KIND, MODEL_TYPES))
    code = main(
        [
            "replay",
            str(scenario),
            "--out",
            str(tmp_path / "o"),
            "--model",
            str(tmp_path / "bad.joblib"),
        ]
    )
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "another feature list" in err


# --- determinism, retraining, config -------------------------------------------------------------


@pytest.mark.slow
def test_the_seed_alone_decides_the_model(trained: tuple[IsolationForestDetector, Path]) -> None:
    det, _ = trained
    again, _ = run(HEALTHY, BASELINE)
    other, _ = run(HEALTHY, dataclasses.replace(BASELINE, seed=7))
    assert det.model is not None and again.model is not None and other.model is not None
    for kind in ("nic", "port"):
        a, b, c = (d.model.kinds[kind] for d in (det, again, other))  # type: ignore[union-attr]
        assert a.threshold == b.threshold and a.train_quantiles == b.train_quantiles
        assert np.array_equal(det.kinds[kind].last_scores, again.kinds[kind].last_scores)
        assert a.threshold != c.threshold


@pytest.mark.slow
def test_retrains_on_schedule_from_recent_calm_windows() -> None:
    det, found = run(HEALTHY, dataclasses.replace(BASELINE, baseline_s=4.0, retrain_every_s=4.0))
    assert det.fits >= 3 and det.model is not None
    assert det.model.meta["trained"] == "retrain" and det.model.meta["fit"] == det.fits
    assert det.model.meta["rows"]["nic"] > 4 * len(recorded(HEALTHY)[0].topology.nics)
    assert not found


def test_nics_outside_any_job_compare_with_their_rail() -> None:
    cfg = SimConfig(
        nodes=4,
        nics_per_node=2,
        spines=1,
        duration_s=4,
        jobs=(JobSpec("solo", "team-a", ("gpu-001", "gpu-002")),),
    )
    det, found = run(cfg, dataclasses.replace(BASELINE, baseline_s=2.0))
    assert det.model is not None and not found
    assert set(det.groups) == {"job:solo|rail:0", "job:solo|rail:1", "rail:0", "rail:1"}


def test_config_is_validated_and_read_from_yaml() -> None:
    with pytest.raises(ConfigError, match="threshold_quantile"):
        IsolationForestConfig(threshold_quantile=0.0)
    with pytest.raises(ConfigError, match="baseline_s"):
        IsolationForestConfig(baseline_s=0.5)
    with pytest.raises(ConfigError, match="whole number"):
        IsolationForestConfig(sustain_windows=2.5)  # type: ignore[arg-type]
    cfg = config_from_dict(
        {"detectors": {"isolation_forest": {"baseline_s": 30, "seed": 3, "save_path": "m.joblib"}}}
    )
    forest = cfg.detectors["isolation_forest"]
    assert forest.baseline_s == 30 and forest.seed == 3 and forest.save_path == "m.joblib"
    with pytest.raises(ConfigError, match="unknown setting"):
        config_from_dict({"detectors": {"isolation_forest": {"contamination": 0.1}}})


# --- in the pipeline: only what no rule explains -------------------------------------------------


@pytest.mark.slow
def test_replay_with_a_model_flags_what_no_rule_explains(
    trained: tuple[IsolationForestDetector, Path], tmp_path: Path
) -> None:
    """With no enabled rule that covers the retransmissions, the forest alone raises them, on
    their NIC only (the PCIe downgrade and its congestion spill are the rules')."""
    scenario = tmp_path / "subtle"
    write_scenario(SUBTLE, scenario)
    conf = tmp_path / "rocewatch.yaml"
    conf.write_text("detectors:\n  transport_errors:\n    enabled: false\n")
    out = tmp_path / "out"
    args = ["replay", str(scenario), "--out", str(out), "--model", str(trained[1])]
    assert main([*args, "--config", str(conf)]) == 0
    alerts = [orjson.loads(x) for x in (out / "alerts.jsonl").read_bytes().splitlines()]
    truth = json.loads((scenario / "truth.json").read_text())
    quiet = next(f for f in truth["faults"] if f["kind"] == "TransportErrors")["labels"]
    pcie = next(f for f in truth["faults"] if f["kind"] == "PcieDowngrade")["labels"]
    names = {a["labels"]["alertname"] for a in alerts}
    assert "TransportErrors" not in names  # the rule is off
    assert "PCIeDowngrade" in names
    anomalies = [a for a in alerts if a["labels"]["alertname"] == "PortAnomaly"]
    assert [entity(a["labels"]) for a in anomalies] == [quiet], [a["labels"] for a in anomalies]
    a = anomalies[0]
    assert "retransmit_errors_per_s" in a["annotations"]["features"]
    assert float(a["annotations"]["score"]) > float(a["annotations"]["threshold"])
    assert pcie["node"] != quiet["node"] or pcie["nic"] != quiet["nic"]


@pytest.mark.slow
def test_replay_with_a_model_leaves_what_a_rule_finds_to_the_rule(
    trained: tuple[IsolationForestDetector, Path], tmp_path: Path
) -> None:
    """With every rule on, the same faults are one rule alert each: the retransmissions a
    TransportErrors alert on their NIC, the downgrade a PCIeDowngrade, and no PortAnomaly
    repeats either (an operator would get two pages for one fault)."""
    scenario = tmp_path / "subtle"
    write_scenario(SUBTLE, scenario)
    out = tmp_path / "out"
    assert main(["replay", str(scenario), "--out", str(out), "--model", str(trained[1])]) == 0
    alerts = [orjson.loads(x) for x in (out / "alerts.jsonl").read_bytes().splitlines()]
    truth = json.loads((scenario / "truth.json").read_text())
    quiet = next(f for f in truth["faults"] if f["kind"] == "TransportErrors")["labels"]
    pcie = next(f for f in truth["faults"] if f["kind"] == "PcieDowngrade")["labels"]
    found = [(a["labels"]["alertname"], entity(a["labels"])) for a in alerts]
    assert ("TransportErrors", quiet) in found, found
    assert ("PCIeDowngrade", pcie) in found, found
    assert not [e for name, e in found if name == "PortAnomaly"], found
