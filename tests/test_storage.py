"""storage.Store on SQLite and on the test PostgreSQL (ROCEWATCH_TEST_PG_URL; marked postgres)."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterator
from pathlib import Path

import polars as pl
import pytest
from sqlalchemy import text

from rocewatch.core.errors import ConfigError, RetryableError
from rocewatch.core.model import Action, Alert
from rocewatch.core.roce import ConfigChange
from storage import SCHEMA_VERSION, Store

T0 = 1_795_946_400_000_000_000  # 2026-11-29T10:00:00Z
S = 1_000_000_000


@pytest.fixture(
    params=[
        "sqlite",
        pytest.param("postgresql", marks=pytest.mark.postgres),
    ]
)
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'rocewatch.db'}"
    # A dedicated test database: start every test from empty tables.
    pg: str = request.getfixturevalue("postgres_url")
    s = Store(pg)
    s.drop_schema()
    s.close()
    return pg


@pytest.fixture
def store(url: str) -> Iterator[Store]:
    s = Store(url)
    s.create_schema()
    yield s
    s.close()


def storm(starts: int = T0 + 1_200_000_000, ends: int = 0, summary: str = "storm") -> Alert:
    return Alert(
        labels={
            "alertname": "PFCStorm",
            "severity": "critical",
            "node": "gpu-017",
            "nic": "mlx5_3",
            "priority": "3",
            "role": "origin",
            "job": "llm-70b",
        },
        annotations={"summary": summary, "evidence": "tx_prio3_pause_duration 199.8ms/200ms"},
        starts_at=starts,
        ends_at=ends,
    )


def drain(t: int = T0 + 3 * S, outcome: str = "dry-run", fp: str = "3f2a") -> Action:
    return Action(
        time=t,
        action="drain",
        node="gpu-017",
        scheduler="slurm",
        reason="rocewatch: PFCStorm origin mlx5_3",
        alert_fingerprint=fp,
        executed=False,
        outcome=outcome,
    )


def rollups(mean: float = 1.0, n: int = 3) -> pl.DataFrame:
    return pl.DataFrame(
        {
            "bucket_start_ns": [T0 + i * 60 * S for i in range(n)],
            "resolution_s": [60] * n,
            "device": ["leaf-r0-p0"] * n,
            "port": ["Ethernet1/1"] * n,
            "qual": ["3"] * n,
            "metric": ["pfc_rx_pause_us"] * n,
            "mean": [mean + i for i in range(n)],
            "max": [10.0] * n,
            "min": [0.0] * n,
            "last": [2.0] * n,
            "count": [600] * n,
        },
        schema_overrides={"bucket_start_ns": pl.Int64},
    )


def test_same_alert_twice_is_one_row_and_resolved_update_wins(store: Store) -> None:
    assert store.write_alerts([storm()]) == 1
    store.write_alerts([storm()])
    assert [a.status for a in store.alerts()] == ["firing"]

    resolved = storm(ends=T0 + 9 * S, summary="storm over")
    store.write_alerts([resolved])
    (row,) = store.alerts()
    assert row.to_json() == resolved.to_json()

    # A late re-send of the firing state (an outbox retry) does not reopen the event.
    store.write_alerts([storm(summary="stale")])
    assert [a.to_json() for a in store.alerts()] == [resolved.to_json()]
    assert store.alerts(status="firing") == []


def test_firing_and_resolved_in_one_batch_resolved_wins(store: Store) -> None:
    resolved = storm(ends=T0 + 9 * S)
    store.write_alerts([storm(), resolved, storm()])
    assert [a.to_json() for a in store.alerts()] == [resolved.to_json()]


def test_alert_json_round_trip(store: Store) -> None:
    alerts = [
        storm(),
        Alert(
            labels={
                "alertname": "FlakyLink",
                "severity": "warning",
                "switch": "leaf-r0-p0",
                "port": "Ethernet1/1",
                "node": "gpu-002",
                "nic": "mlx5_0",
            },
            annotations={"summary": "BER 3.1e-5 over 1e-5 for 10 s", "description": "µ ± ünïcode"},
            starts_at=T0 + 123_456_789,
            ends_at=T0 + 60 * S + 999_000_000,
        ),
        Alert(
            labels={"alertname": "FabricIncident", "severity": "critical", "scope": "rail:3"},
            annotations={},
            starts_at=T0 + 5 * S,
        ),
    ]
    store.write_alerts(alerts)
    got = {a.fingerprint: a.to_json() for a in store.alerts()}
    assert got == {a.fingerprint: a.to_json() for a in alerts}
    assert [a.name for a in store.alerts(alertname="FlakyLink")] == ["FlakyLink"]
    assert {a.name for a in store.alerts(status="firing")} == {"PFCStorm", "FabricIncident"}


def test_entity_columns_are_filled(store: Store) -> None:
    store.write_alerts([storm()])
    with store.engine.connect() as conn:
        row = conn.execute(text("SELECT node, nic, role, priority, switch FROM alerts")).one()
    assert tuple(row) == ("gpu-017", "mlx5_3", "origin", "3", None)


def test_actions_round_trip_and_replays_are_ignored(store: Store) -> None:
    acts = [
        drain(),
        Action(
            T0 + 400 * S,
            "resume",
            "gpu-017",
            "slurm",
            "rocewatch: healthy 300s",
            "3f2a",
            True,
            "done",
        ),
    ]
    assert store.write_actions(acts) == 2
    store.write_actions(acts)
    store.write_actions([drain(outcome="done")])  # same decision replayed: the first one stays
    assert [a.to_json() for a in store.actions()] == [a.to_json() for a in acts]
    assert store.actions() == acts


def test_an_approved_drain_at_its_waiting_time_shows_the_approval_outcome(store: Store) -> None:
    """Approved while telemetry time stands still, a drain is decided again at the waiting
    drain's own time: its row takes the drain's outcome (the later event), in one batch or
    two, and a replay of the waiting event does not put it back."""
    done = dataclasses.replace(drain(outcome="done"), executed=True)
    store.write_actions([drain(outcome="pending-approval")])
    store.write_actions([done])
    store.write_actions([drain(outcome="pending-approval")])  # a replay of the first event
    assert [(a.outcome, a.executed) for a in store.actions()] == [("done", True)]
    store.write_actions([drain(fp="other", outcome="pending-approval"), drain(fp="other")])
    assert {a.alert_fingerprint: a.outcome for a in store.actions()}["other"] == "dry-run"


def test_rollups_upsert(store: Store) -> None:
    assert store.write_rollups(rollups(mean=1.0)) == 3
    store.write_rollups(rollups(mean=5.0, n=2))
    got = store.rollups()
    assert got.height == 3
    assert got["mean"].to_list() == [5.0, 6.0, 3.0]
    assert got["bucket_start_ns"].to_list() == rollups()["bucket_start_ns"].to_list()
    assert got.select(["device", "port", "qual", "metric", "count"]).row(0) == (
        "leaf-r0-p0",
        "Ethernet1/1",
        "3",
        "pfc_rx_pause_us",
        600,
    )


def test_rollups_in_many_batches(url: str) -> None:
    with Store(url, batch_size=7) as s:
        s.create_schema()
        assert s.write_rollups(rollups(n=50)) == 50
        assert s.rollups().height == 50


def test_rollups_missing_columns_rejected(store: Store) -> None:
    with pytest.raises(ValueError, match="count"):
        store.write_rollups(rollups().drop("count"))


def test_prune(store: Store) -> None:
    old_resolved = storm(starts=T0, ends=T0 + 10 * S)
    old_firing = Alert({"alertname": "Straggler", "severity": "warning", "node": "gpu-3"}, {}, T0)
    new_resolved = storm(starts=T0 + 100 * S, ends=T0 + 110 * S)
    store.write_alerts([old_resolved, old_firing, new_resolved])
    store.write_actions([drain(t=T0 + 3 * S), drain(t=T0 + 103 * S)])
    store.write_rollups(rollups(n=3))  # buckets at T0, T0+60s, T0+120s
    ann = {"victim_tenant": "b", "victim_job": "rb", "aggressor_tenant": "a", "aggressor_job": "ra"}
    interference = [
        Alert(
            {"alertname": "ECNCongestion", "severity": "warning", "switch": "leaf-0", "port": "e1"},
            {**ann, "victim_pause_s": pause},
            starts,
            starts + 10 * S,
        )
        for starts, pause in ((T0, "1.5"), (T0 + 100 * S, "0.25"))
    ]
    assert store.write_interference(interference) == 2
    store.write_config_changes(
        [
            ConfigChange(T0 + 5 * S, "switch", "leaf-0", "Ethernet1", "pfc", "3", "4"),
            ConfigChange(T0 + 95 * S, "switch", "leaf-0", "Ethernet1", "pfc", "4", "3"),
        ]
    )

    deleted = store.prune(T0 + 90 * S)
    assert deleted == {
        "alerts": 1,
        "actions": 1,
        "tenant_interference": 1,
        "metric_rollups": 2,
        "config_changes": 1,
        "incidents": 1,
    }
    assert store.tenant_pause() == {("b", "a"): 0.25}
    assert [c.ts for c in store.config_changes()] == [T0 + 95 * S]
    assert {(a.name, a.starts_at) for a in store.alerts()} == {
        ("Straggler", T0),
        ("PFCStorm", T0 + 100 * S),
    }
    assert [a.time for a in store.actions()] == [T0 + 103 * S]
    assert store.rollups()["bucket_start_ns"].to_list() == [T0 + 120 * S]


def test_schema_version(store: Store, url: str) -> None:
    store.create_schema()  # twice is fine
    assert store.schema_version() == SCHEMA_VERSION
    with store.engine.begin() as conn:
        conn.execute(text("UPDATE meta SET value = '99' WHERE key = 'schema_version'"))
    with Store(url) as other, pytest.raises(ConfigError, match="schema version 99"):
        other.create_schema()


def test_writes_are_visible_to_a_new_connection(url: str) -> None:
    with Store(url) as a:
        a.create_schema()
        a.write_alerts([storm()])
        a.write_actions([drain()])
    with Store(url) as b:
        assert len(b.alerts()) == 1
        assert len(b.actions()) == 1


def test_sqlite_uses_wal(tmp_path: Path) -> None:
    with Store(f"sqlite:///{tmp_path / 'w.db'}") as s:
        s.create_schema()
        with s.engine.connect() as conn:
            assert conn.execute(text("PRAGMA journal_mode")).scalar() == "wal"
            assert conn.execute(text("PRAGMA busy_timeout")).scalar() == 10000


def test_password_is_never_logged(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    s = Store("postgresql://rw:s3cret-pw@127.0.0.1:1/rocewatch?connect_timeout=2")
    assert "s3cret-pw" not in s.url and "***" in s.url
    with pytest.raises(RetryableError) as err:
        s.create_schema()
    s.close()
    assert "s3cret-pw" not in str(err.value)
    assert "s3cret-pw" not in caplog.text


def test_unsupported_url_is_a_config_error() -> None:
    with pytest.raises(ConfigError):
        Store("mysql://root:pw@localhost/x")
    with pytest.raises(ConfigError):
        Store("not a url")


def test_retention_by_age_includes_the_outbox(url: str) -> None:
    from storage.outbox import Outbox

    now = [T0 + 40 * 86400 * S]  # 40 days after T0
    with Store(url, clock=lambda: now[0]) as s:
        s.create_schema()
        s.write_alerts([storm(starts=T0, ends=T0 + S), storm(starts=now[0] - S, ends=now[0])])
        s.write_actions([drain(t=T0), drain(t=now[0] - S)])
        ob = Outbox(s, clock=lambda: T0 / 1e9)  # queued 40 days ago...
        ob.enqueue([storm(starts=T0, ends=T0 + S), storm(starts=T0 + 5 * S)], ["ops"])
        (first, _pending) = ob.claim("ops", 10, lease_s=1)
        ob.delivered([first])  # ...one delivered, one still pending: that one is kept
        assert s.apply_retention(30) == {
            "alerts": 1,
            "actions": 1,
            "tenant_interference": 0,
            "metric_rollups": 0,
            "config_changes": 0,
            "incidents": 1,
            "notify_outbox": 1,
        }
        assert [a.starts_at for a in s.alerts()] == [now[0] - S]
        assert ob.depth() == {"ops": 1}
        with pytest.raises(ConfigError):
            s.apply_retention(0)


def test_storage_config_retention() -> None:
    from rocewatch.config import config_from_dict

    c = config_from_dict({"storage": {"url": "sqlite://", "retention_days": 7}})
    assert (c.storage_url, c.storage_retention_days) == ("sqlite://", 7)
    with pytest.raises(ConfigError, match="retention_days"):
        config_from_dict({"storage": {"retention_days": -1}})
    with pytest.raises(ConfigError, match=r"storage\.bogus"):
        config_from_dict({"storage": {"bogus": 1}})


def test_rollups_with_awkward_names_and_nulls(store: Store) -> None:
    df = rollups(n=3).with_columns(
        pl.Series("port", ["", 'Eth"1,2', "et-0/0/1\nx"]),
        pl.Series("qual", ["", "", "3"]),
        pl.Series("mean", [None, float("nan"), 1.5]),
        pl.Series("max", [float("inf"), 2.0, 3.0]),
    )
    assert store.write_rollups(df) == 3
    got = store.rollups()
    assert got["port"].to_list() == ["", 'Eth"1,2', "et-0/0/1\nx"]
    assert got["qual"].to_list() == ["", "", "3"]
    assert got["mean"].to_list() == [None, None, 1.5]
    assert got["max"].to_list() == [float("inf"), 2.0, 3.0]


def test_config_changes_are_stored_once_and_read_back(store: Store) -> None:
    """A configuration change written twice (a replayed stream) is one row; read back whole."""
    c = ConfigChange(T0 + S, "switch", "leaf-0", "Ethernet1/1", "pfc", "3", "4", "CONFIG_DB")
    d = ConfigChange(T0 + 2 * S, "nic", "gpu-1", "mlx5_0", "trust", "dscp", "pcp", "nic-agent")
    store.write_config_changes([c, d])
    store.write_config_changes([c])
    assert store.config_changes() == [c, d]
    assert store.config_changes(device="gpu-1") == [d]
