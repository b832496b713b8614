"""The inhibition stage: Alertmanager-style inhibit rules between the detectors and the
notification and drain paths (rocewatch/alerting/inhibit.py), through the real pipeline with
scripted detectors, and through replay."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import orjson
import polars as pl
import pytest
from sqlalchemy import select

from actions.policy import PolicyConfig
from detectors.base import Finding, StepContext, node_labels, port_labels
from detectors.fabric_incident import FabricIncidentDetector
from rocewatch.alerting.inhibit import (
    DEFAULT_RULES,
    InhibitConfig,
    Inhibitor,
    parse_rule,
)
from rocewatch.config import Config, config_from_dict
from rocewatch.core.errors import ConfigError
from rocewatch.core.model import Action, Alert, conform
from rocewatch.core.topology import Topology
from rocewatch.pipeline import Output, Pipeline
from rocewatch.replay import replay
from storage.store import ALERTS, Store
from tests.support.restart import restart_pipeline

S = 1_000_000_000
STEP = S // 10
T0 = 1_795_946_400 * S
NODES = [f"gpu-00{i}" for i in range(1, 9)]
TOPO = Topology.from_dict(
    {
        "switches": [{"name": "leaf-0", "role": "leaf", "rail": 0}],
        "nodes": [
            {"name": n, "nics": [{"nic": "mlx5_0", "switch_port": f"leaf-0/Ethernet{i + 1}"}]}
            for i, n in enumerate(NODES)
        ],
        "jobs": [
            {"name": "llm", "tenant": "a", "nodes": NODES[:6]},
            {"name": "other", "tenant": "b", "nodes": NODES[6:]},
        ],
    }
)


# --- scripted detectors: findings as a function of the step's time (seconds after T0) ----------


@dataclass
class Scripted:
    name: str
    script: Callable[[float], list[Finding]]
    reads: ClassVar[frozenset[str]] = frozenset()
    STATE_TYPES: ClassVar[tuple[type, ...]] = ()

    def evaluate(self, ctx: StepContext) -> list[Finding]:
        return self.script(round((ctx.end - T0) / S, 3))

    def state(self) -> dict[str, Any]:
        return {}  # a script of the step's time: nothing learned

    def restore(self, data: dict[str, Any]) -> None:
        pass


def straggler(node: str, t: float, nic: str | None = "mlx5_0") -> Finding:
    return Finding("Straggler", node_labels(TOPO, node, nic), "warning", at(t), "slow", "ev")


def at(t: float) -> int:
    return T0 + round(t * S)


def storm(t: float) -> list[Finding]:
    """gpu-002 storms: it pauses its leaf port, the leaf pauses gpu-001."""
    origin = {**node_labels(TOPO, "gpu-002", "mlx5_0"), "priority": "3", "role": "origin"}
    port = {**port_labels(TOPO, "leaf-0", "Ethernet2"), "priority": "3", "role": "victim"}
    nic = {**node_labels(TOPO, "gpu-001", "mlx5_0"), "priority": "3", "role": "victim"}
    return [
        Finding("PFCStorm", origin, "critical", at(t), "storm", "pause"),
        Finding("PFCStorm", port, "warning", at(t), "paused", "pause"),
        Finding("PFCStorm", nic, "warning", at(t), "paused", "pause"),
    ]


def storm_1_to_4(t: float) -> list[Finding]:
    return storm(t) if 1.0 <= t < 4.0 else []


def storm_3_to_6(t: float) -> list[Finding]:
    return storm(t) if 3.0 <= t < 6.0 else []


def slow_2_to_9(t: float) -> list[Finding]:
    return [straggler("gpu-001", t)] if 2.0 <= t < 9.0 else []


def slow_2_to_40(t: float) -> list[Finding]:
    return [straggler("gpu-001", t)] if 2.0 <= t < 40.0 else []


def slow_1_to_40(t: float) -> list[Finding]:
    return [straggler("gpu-001", t)] if 1.0 <= t < 40.0 else []


def slow_1_to_9(t: float) -> list[Finding]:
    return [straggler("gpu-001", t)] if 1.0 <= t < 9.0 else []


def slow_node_only(t: float) -> list[Finding]:
    return [straggler("gpu-001", t, nic=None)] if 2.0 <= t < 9.0 else []


def mass_slowdown(t: float) -> list[Finding]:
    """Three NICs of job llm and one of job other are slow at once."""
    if not 1.0 <= t < 6.0:
        return []
    return [straggler(n, t) for n in ("gpu-001", "gpu-002", "gpu-003", "gpu-007")]


def pipeline(*dets: object, cfg: Config | None = None, topology: Topology = TOPO) -> Pipeline:
    p = Pipeline(topology, cfg or Config(), rollup_s=None)
    p.detectors = list(dets)  # type: ignore[arg-type]
    return p


HOLD_S = 3.0  # the storm rules' hold_s in the tests that wait for it (default: STORM_HOLD_S)


def short_hold() -> InhibitConfig:
    """The default rules with the storm's hold shortened, so a test need not run 20 s more."""
    rules = tuple(dataclasses.replace(r, hold_s=min(r.hold_s, HOLD_S)) for r in DEFAULT_RULES)
    return InhibitConfig(rules=rules)


def drains_on(drain_on: tuple[str, ...]) -> Config:
    return Config(policy=PolicyConfig(drain_on=drain_on, hold_down_s=1.0), inhibit=short_hold())


def run(p: Pipeline, start_s: float, end_s: float) -> list[tuple[float, Output]]:
    """Feed one sample per step (the scripted detectors need only steps to close)."""
    outs = []
    for i in range(round(start_s * 10), round(end_s * 10)):
        ts = T0 + i * STEP + 1_000_000
        p.ingest(
            conform(
                pl.DataFrame(
                    {
                        "ts": [ts],
                        "device": ["gpu-001"],
                        "port": ["mlx5_0"],
                        "qual": [""],
                        "metric": ["nic_link_speed_mbps"],
                        "value": [400_000.0],
                    }
                )
            )
        )
        wm = ts - p.engine.lateness_ns()
        outs.append(((wm - T0) / S, p.advance(wm)))
    return outs


def named(outs: list[tuple[float, Output]], name: str, which: str = "alerts") -> list[Alert]:
    return [a for _, o in outs for a in getattr(o, which) if a.name == name]


def first_time(outs: list[tuple[float, Output]], name: str, which: str = "alerts") -> float:
    return min(t for t, o in outs for a in getattr(o, which) if a.name == name)


def drains(outs: list[tuple[float, Output]]) -> list[Action]:
    return [x for _, o in outs for x in o.actions if x.action == "drain"]


# --- the default rules --------------------------------------------------------------------------


def test_a_paused_nics_straggler_is_stored_inhibited_not_notified_nor_drained_until_the_storm_ends(
    tmp_path: Path,
) -> None:
    p = pipeline(
        Scripted("pfc_storm", storm_1_to_4),
        Scripted("straggler", slow_2_to_40),
        cfg=drains_on(("Straggler",)),
    )
    store = Store(f"sqlite:///{tmp_path / 'a.db'}")
    store.create_schema()
    during = run(p, 0, 3.5)
    for _, o in during:
        store.write_alerts(o.alerts + o.inhibited)
    victims = [a for a in named(during, "PFCStorm") if a.labels["role"] == "victim"]
    assert len(victims) == 1  # the storm's victims: one alert
    (muted,) = named(during, "Straggler", "inhibited")
    assert muted.labels["node"] == "gpu-001" and muted.status == "firing"
    assert muted.annotations["inhibited_by"] == victims[0].fingerprint
    assert named(during, "Straggler") == [] and drains(during) == []
    with store.engine.connect() as conn:
        rows = conn.execute(select(ALERTS.c.alertname, ALERTS.c.inhibited_by)).all()
    assert ("Straggler", victims[0].fingerprint) in rows
    assert all(by is None for name, by in rows if name != "Straggler")

    # the storm ends (its victim alert resolves 1 s later); the straggler outlives it, and is
    # held for the rule's hold_s more (a symptom drains down after its cause) before it shows
    after = run(p, 3.5, 12)
    for _, o in after:
        store.write_alerts(o.alerts + o.inhibited)
    (shown,) = [a for a in named(after, "Straggler") if a.status == "firing"]
    assert "inhibited_by" not in shown.annotations
    assert shown.starts_at == muted.starts_at  # the same alert, not a new one
    storm_over = max(a.ends_at for a in named(after, "PFCStorm") if a.ends_at)
    released = first_time(after, "Straggler")
    hold = round(HOLD_S * S)
    assert storm_over + hold <= at(released) <= storm_over + hold + 2 * STEP
    (drain,) = drains(after)  # drained on once it is an ordinary alert, never before
    assert drain.node == "gpu-001" and drain.time >= storm_over
    with store.engine.connect() as conn:
        by = conn.execute(
            select(ALERTS.c.inhibited_by).where(ALERTS.c.alertname == "Straggler")
        ).scalar_one()
    assert by is None  # stored as an ordinary alert from then on
    # it fired after its source: not in inhibited.jsonl's list
    assert [a.name for a in p.inhibited_alerts()] == []
    assert "Straggler" in {a.name for a in p.all_alerts()}


def congestion_on_the_paused_port(t: float, since: float, until: float) -> list[Finding]:
    """ECN marking on leaf-0/Ethernet2's queue, the port the storm pauses."""
    if not since <= t < until:
        return []
    labels = {**port_labels(TOPO, "leaf-0", "Ethernet2"), "queue": "3"}
    return [Finding("ECNCongestion", labels, "warning", at(t), "marking", "ecn")]


def ecn_2_to_5(t: float) -> list[Finding]:
    return congestion_on_the_paused_port(t, 2.0, 5.0)


def ecn_0_5_to_8(t: float) -> list[Finding]:
    return congestion_on_the_paused_port(t, 0.5, 8.0)


def ecn_2_to_40(t: float) -> list[Finding]:
    return congestion_on_the_paused_port(t, 2.0, 40.0)


def test_congestion_in_a_storms_pause_tree_is_the_storms_until_it_outlives_it() -> None:
    """The port a storm pauses fills and marks: that congestion, begun after the storm, is
    stored inhibited by the storm (its origin, whose tree lists the port) for its whole life
    when it clears within the hold; one that outlives the storm by more is notified then."""
    p = pipeline(Scripted("pfc_storm", storm_1_to_4), Scripted("ecn", ecn_2_to_5))
    outs = run(p, 0, 8)
    (origin,) = [
        a for a in named(outs, "PFCStorm") if a.labels["role"] == "origin" and not a.ends_at
    ]
    storm_fps = {a.fingerprint for a in named(outs, "PFCStorm")}
    tree = origin.annotations["tree"]
    assert '"port":"Ethernet2"' in tree and '"node":"gpu-001"' in tree  # its victims
    assert named(outs, "ECNCongestion") == []
    (muted,) = p.inhibited_alerts()
    assert muted.name == "ECNCongestion" and muted.annotations["inhibited_by"] in storm_fps
    assert muted.ends_at  # it cleared a second after the storm: the storm's, all its life

    cfg = Config(inhibit=short_hold())
    p = pipeline(Scripted("pfc_storm", storm_1_to_4), Scripted("ecn", ecn_2_to_40), cfg=cfg)
    outs = run(p, 0, 12)
    storm_over = max(a.ends_at for a in named(outs, "PFCStorm") if a.ends_at)
    (shown,) = [a for a in named(outs, "ECNCongestion") if a.status == "firing"]
    assert at(first_time(outs, "ECNCongestion")) >= storm_over + round(HOLD_S * S)
    assert shown.starts_at == at(2.0) and "inhibited_by" not in shown.annotations


def test_congestion_that_began_before_the_storm_is_not_inhibited_by_it() -> None:
    """Marking on the port from 0.5 s, the storm from 1 s: still held for its wait when the
    storm comes, but it began first, so it is its own fault, notified when the wait ends."""
    p = pipeline(Scripted("pfc_storm", storm_1_to_4), Scripted("ecn", ecn_0_5_to_8))
    outs = run(p, 0, 12)
    assert named(outs, "ECNCongestion", "inhibited") == []
    assert first_time(outs, "ECNCongestion") == pytest.approx(0.5 + 5.0, abs=0.15)
    assert [a.name for a in p.inhibited_alerts()] == []


def test_a_target_that_fires_before_its_source_is_held_and_still_inhibited() -> None:
    p = pipeline(
        Scripted("pfc_storm", storm_3_to_6),
        Scripted("straggler", slow_1_to_40),
        cfg=Config(inhibit=short_hold()),
    )
    outs = run(p, 0, 14)
    # held from 1 s (wait 5 s), inhibited when the storm starts at 3 s
    assert first_time(outs, "Straggler", "inhibited") == pytest.approx(3.0, abs=0.15)
    storm_over = max(a.ends_at for a in named(outs, "PFCStorm") if a.ends_at)
    assert at(first_time(outs, "Straggler")) >= storm_over + round(HOLD_S * S)
    # with a shorter wait it is notified before the storm begins, and stays notified
    short = Config(inhibit=InhibitConfig(wait_s=1.0))
    p = pipeline(Scripted("pfc_storm", storm_3_to_6), Scripted("straggler", slow_1_to_9), cfg=short)
    outs = run(p, 0, 12)
    assert first_time(outs, "Straggler") == pytest.approx(2.0, abs=0.15)
    assert named(outs, "Straggler", "inhibited") == []


def test_a_target_without_the_tying_label_is_not_inhibited() -> None:
    """A node-level straggler lacks the ``nic`` the default rule ties on: nothing says the
    storm explains it, so it is notified after the wait."""
    p = pipeline(Scripted("pfc_storm", storm_1_to_4), Scripted("straggler", slow_node_only))
    outs = run(p, 0, 8)
    assert named(outs, "Straggler", "inhibited") == []
    assert first_time(outs, "Straggler") == pytest.approx(2.0 + 5.0, abs=0.15)


def test_a_fabric_incident_inhibits_its_members_stragglers_only() -> None:
    p = pipeline(Scripted("straggler", mass_slowdown), FabricIncidentDetector(TOPO))
    outs = run(p, 0, 10)
    (incident,) = [a for a in named(outs, "FabricIncident") if a.status == "firing"]
    assert incident.labels["scope"] == "job:llm"
    muted = {a.labels["node"]: a for a in p.inhibited_alerts()}
    assert sorted(muted) == ["gpu-001", "gpu-002", "gpu-003"]
    assert {a.annotations["inhibited_by"] for a in muted.values()} == {incident.fingerprint}
    # gpu-007 is in another job, not one of the incident's members: notified after the wait
    shown = [a for a in named(outs, "Straggler") if a.status == "firing"]
    assert [a.labels["node"] for a in shown] == ["gpu-007"]
    assert first_time(outs, "Straggler") == pytest.approx(1.0 + 5.0, abs=0.15)


def test_inhibition_state_survives_a_checkpoint() -> None:
    """The scale-out detect stage checkpoints the pipeline's state (the product's codec) and
    restores it into a pipeline built anew: an alert inhibited before the checkpoint is
    released after it, once, as in the uninterrupted run."""
    dets = (Scripted("pfc_storm", storm_1_to_4), Scripted("straggler", slow_2_to_40))
    cfg = Config(inhibit=short_hold())
    whole = pipeline(*dets, cfg=cfg)
    released = [a for a in named(run(whole, 0, 12), "Straggler") if a.status == "firing"]
    assert len(released) == 1
    p = pipeline(*dets, cfg=cfg)
    run(p, 0, 3)
    assert p.inhibitor.state() and p.inhibited_alerts()  # held mid-storm
    p = restart_pipeline(p, detectors=lambda q: [Scripted(d.name, d.script) for d in dets])
    outs = run(p, 3, 12)
    firing = [a for a in named(outs, "Straggler") if a.status == "firing"]
    assert len(firing) == 1
    assert firing[0].to_json() == released[0].to_json()


def test_alertmanager_semantics_of_one_rule() -> None:
    """Equal labels missing on both sides count as equal (hence the check at start); an alert
    never inhibits itself; ``members`` ties by the source's member list."""
    rule = parse_rule(
        {
            "source_match": {"alertname": "A"},
            "target_match_re": {"alertname": "B|C", "node": ".+"},
            "equal": ["node"],
        }
    )
    inh = Inhibitor(InhibitConfig(rules=(rule,), wait_s=0))

    class Alerts:
        def __init__(self, *alerts: Alert) -> None:
            self.firing = {a.fingerprint: a for a in alerts}

        def mark(self, fingerprint: str, starts_at: int, source: str | None) -> None:
            pass

    a = Alert({"alertname": "A", "node": "n1"}, {}, T0)
    b = Alert({"alertname": "B", "node": "n1"}, {}, T0)
    c = Alert({"alertname": "C", "node": "n2"}, {}, T0)
    shown, hidden = inh.update(T0, [a, b, c], Alerts(a, b, c))
    assert [x.name for x in shown] == ["A", "C"] and [x.name for x in hidden] == ["B"]
    assert hidden[0].annotations["inhibited_by"] == a.fingerprint
    # a rule that matches an alert on both sides does not let it inhibit itself
    both = parse_rule(
        {
            "source_matchers": ['alertname="B"'],
            "target_matchers": ['alertname="B"', 'node=~".+"'],
            "equal": ["node"],
        }
    )
    inh = Inhibitor(InhibitConfig(rules=(both,), wait_s=0))
    assert inh.update(T0, [b], Alerts(b)) == ([b], [])


# --- configuration ------------------------------------------------------------------------------


def test_inhibit_rules_from_the_config_file_replace_the_defaults() -> None:
    cfg = config_from_dict(
        {
            "inhibit_rules": [
                {
                    "source_matchers": ["alertname = PCIeDowngrade"],
                    "target_matchers": ['alertname="Straggler"', 'node=~".+"', 'nic=~".+"'],
                    "equal": ["node", "nic"],
                }
            ],
            "inhibit_wait_s": 2.5,
        }
    )
    assert cfg.inhibit.wait_s == 2.5 and len(cfg.inhibit.rules) == 1
    (rule,) = cfg.inhibit.rules
    assert rule.is_source({"alertname": "PCIeDowngrade"})
    assert rule.is_target({"alertname": "Straggler", "node": "a", "nic": "b"})
    assert not rule.is_target({"alertname": "Straggler", "node": "a"})
    assert config_from_dict({"inhibit_rules": []}).inhibit.rules == ()
    assert len(Config().inhibit.rules) >= 3  # the defaults


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ({"inhibit_rules": {"a": 1}}, "must be a list"),
        ({"inhibit_rules": ["x"]}, "inhibit_rules[0]: must be a mapping"),
        ({"inhibit_rules": [{"source_matchers": ["alertname=A"], "bogus": 1}]}, "bogus"),
        (
            {"inhibit_rules": [{"source_matchers": ["alertname"], "target_matchers": ["a=b"]}]},
            "not of the form",
        ),
        (
            {
                "inhibit_rules": [
                    {
                        "source_matchers": ['alertname=~"(("'],
                        "target_matchers": ['alertname="B"', 'node=~".+"'],
                        "equal": ["node"],
                    }
                ]
            },
            "bad regular expression",
        ),
        (
            {"inhibit_rules": [{"source_matchers": ["alertname=A"], "equal": ["node"]}]},
            "no target matchers",
        ),
        (
            {
                "inhibit_rules": [
                    {"source_matchers": ["alertname=A"], "target_matchers": ["alertname=B"]}
                ]
            },
            "no 'equal' labels and no 'members'",
        ),
        (
            {
                "inhibit_rules": [
                    {
                        "source_matchers": ["alertname=A"],
                        "target_matchers": ["alertname=B"],
                        "equal": ["node"],
                    }
                ]
            },
            "equal label 'node' is not required by the target matchers",
        ),
        (
            {
                "inhibit_rules": [
                    {
                        "source_matchers": ["alertname=A"],
                        "target_matchers": ["alertname=B", 'node=~".*"'],  # matches ""
                        "equal": ["node"],
                    }
                ]
            },
            "equal label 'node' is not required",
        ),
        (
            {
                "inhibit_rules": [
                    {
                        "source_matchers": ["alertname=A"],
                        "target_matchers": ["alertname=B"],
                        "members": 3,
                    }
                ]
            },
            "members: must be true, false or an annotation name",
        ),
        (
            {
                "inhibit_rules": [
                    {
                        "source_matchers": ["alertname=A"],
                        "target_matchers": ["alertname=B"],
                        "members": "the tree",
                    }
                ]
            },
            "'the tree' is not an annotation name",
        ),
        (
            {
                "inhibit_rules": [
                    {
                        "source_matchers": ["alertname=A"],
                        "target_matchers": ["alertname=B"],
                        "members": "tree",
                        "hold_s": -1,
                    }
                ]
            },
            "hold_s: must be a number of seconds >= 0",
        ),
        (
            {
                "inhibit_rules": [
                    {
                        "source_matchers": ["alertname=A"],
                        "target_matchers": ["alertname=B"],
                        "members": True,
                        "started_after_source": "yes",
                    }
                ]
            },
            "started_after_source: must be true or false",
        ),
        ({"inhibit_wait_s": -1}, "inhibit_wait_s"),
        ({"inhibit_wait_s": "soon"}, "inhibit_wait_s"),
        ({"inhibit": {}}, "use inhibit_rules"),
    ],
)
def test_bad_inhibit_config_is_refused_at_start(doc: dict, message: str) -> None:
    with pytest.raises(ConfigError) as e:
        config_from_dict(doc)
    assert message in str(e.value)


# --- replay -------------------------------------------------------------------------------------


def test_replay_writes_alerts_inhibited_for_their_whole_life_to_inhibited_jsonl(
    tmp_path: Path,
) -> None:
    """Both NICs of a node trained their PCIe link down; a rule says the first explains the
    second: the second's alert goes to inhibited.jsonl, with its source, and is stored."""
    scen = tmp_path / "scenario"
    scen.mkdir()
    (scen / "topology.yaml").write_text(
        "switches: [{name: leaf-0}]\n"
        "nodes:\n"
        "  - name: gpu-001\n"
        "    nics:\n"
        "      - {nic: mlx5_0, switch_port: leaf-0/Ethernet1}\n"
        "      - {nic: mlx5_1, switch_port: leaf-0/Ethernet2}\n"
    )
    lines = []
    for i in range(41):
        for nic in ("mlx5_0", "mlx5_1"):
            lines.append(
                orjson.dumps(
                    {
                        "timestamp": T0 + i * STEP,
                        "node": "gpu-001",
                        "nic": nic,
                        "pcie": {
                            "current_link_speed": "16.0 GT/s PCIe",
                            "max_link_speed": "32.0 GT/s PCIe",
                            "current_link_width": 16,
                            "max_link_width": 16,
                        },
                    }
                )
            )
    (scen / "nic.jsonl").write_bytes(b"\n".join(lines) + b"\n")
    cfg = config_from_dict(
        {
            "inhibit_rules": [
                {
                    "source_matchers": ['alertname="PCIeDowngrade"', 'nic="mlx5_0"'],
                    "target_matchers": ['alertname="PCIeDowngrade"', 'nic="mlx5_1"', 'node=~".+"'],
                    "equal": ["node"],
                }
            ]
        }
    )
    store = Store(f"sqlite:///{tmp_path / 'r.db'}")
    store.create_schema()
    out = tmp_path / "out"
    res = replay(scen, out, cfg, store=store)
    alerts = [orjson.loads(x) for x in (out / "alerts.jsonl").read_bytes().splitlines()]
    muted = [orjson.loads(x) for x in (out / "inhibited.jsonl").read_bytes().splitlines()]
    assert [a["labels"]["nic"] for a in alerts] == ["mlx5_0"]
    assert [a["labels"]["nic"] for a in muted] == ["mlx5_1"]
    assert muted[0]["annotations"]["inhibited_by"] == alerts[0]["fingerprint"]
    assert res.alerts == alerts and res.inhibited == muted
    with store.engine.connect() as conn:
        rows = dict(conn.execute(select(ALERTS.c.nic, ALERTS.c.inhibited_by)).all())
    assert rows == {"mlx5_0": None, "mlx5_1": alerts[0]["fingerprint"]}
    store.close()
    # no rules: both are ordinary alerts and inhibited.jsonl is empty
    replay(scen, tmp_path / "plain", config_from_dict({"inhibit_rules": []}))
    assert (tmp_path / "plain" / "inhibited.jsonl").read_bytes() == b""
    assert len((tmp_path / "plain" / "alerts.jsonl").read_bytes().splitlines()) == 2
