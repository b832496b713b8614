"""The provisioned Grafana dashboards: every SQL query runs against a real PostgreSQL filled by
a replay of a simulated scenario with faults, and returns rows showing the injected faults.

Grafana itself does not run here; its PostgreSQL macros are expanded as Grafana 11 expands them.
"""

from __future__ import annotations

import datetime as dt
import json
import re
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
import yaml
from sqlalchemy import text
from sqlalchemy.engine import make_url

from rocewatch.replay import replay
from storage.grafana import dashboards
from storage.store import Store
from tests.pg_fresh import fresh_database

ROOT = Path(__file__).resolve().parents[1]
PROV = ROOT / "storage" / "grafana" / "provisioning"


def dashboard_files() -> list[Path]:
    return sorted((PROV / "dashboards" / "rocewatch").glob("*.json"))


def queries(nccl: bool = False) -> list[tuple[str, str, str]]:
    """(dashboard file, panel title, rawSql) for every target of every panel: of the NCCL jobs
    dashboard (``nccl``: its rows come from a replay with NCCL jobs, tests/test_grafana_nccl.py)
    or of the others, with the others' SQL annotation queries ("annotation: <name>")."""
    out = []
    for f in dashboard_files():
        if (f.stem == "nccl-jobs") != nccl:
            continue
        dash = json.loads(f.read_text())
        for p in dash["panels"]:
            for t in p.get("targets", []):
                out.append((f.stem, p["title"], t["rawSql"]))
        for a in dash.get("annotations", {}).get("list", []) if not nccl else []:
            if "rawSql" in a.get("target", {}):
                out.append((f.stem, f"annotation: {a['name']}", a["target"]["rawSql"]))
    return out


def _args(sql: str, start: int) -> tuple[list[str], int]:
    """Split the macro arguments from the '(' at ``start``; return them and the index after ')'."""
    depth, args, cur = 0, [], ""
    for i in range(start, len(sql)):
        c = sql[i]
        if c == "(":
            depth += 1
            if depth == 1:
                continue
        elif c == ")":
            depth -= 1
            if depth == 0:
                args.append(cur.strip())
                return [a for a in args if a], i + 1
        elif c == "," and depth == 1:
            args.append(cur.strip())
            cur = ""
            continue
        cur += c
    raise ValueError("unbalanced macro call")


def _seconds(interval: str) -> int:
    m = re.fullmatch(r"'?(\d+)([smhd])'?", interval)
    assert m, f"interval {interval!r}"
    return int(m.group(1)) * {"s": 1, "m": 60, "h": 3600, "d": 86400}[m.group(2)]


def expand(
    sql: str, t_from: dt.datetime, t_to: dt.datetime, variables: dict[str, str] | None = None
) -> str:
    """Grafana's PostgreSQL macros (pkg/tsdb/grafana-postgresql-datasource/macros.go), after
    the dashboard's template variables (``$name``, ``${name}``) as Grafana interpolates them."""
    for name, value in (variables or {}).items():
        sql = re.sub(rf"\$\{{{name}\}}|\${name}\b", value, sql)
    f = t_from.strftime("%Y-%m-%dT%H:%M:%SZ")
    t = t_to.strftime("%Y-%m-%dT%H:%M:%SZ")
    out = ""
    i = 0
    for m in re.finditer(r"\$__(\w+)", sql):
        if m.start() < i:
            continue
        out += sql[i : m.start()]
        name = m.group(1)
        args, i = _args(sql, m.end())
        if name == "timeFilter":
            out += f"{args[0]} BETWEEN '{f}' AND '{t}'"
        elif name == "timeFrom":
            out += f"'{f}'"
        elif name == "timeTo":
            out += f"'{t}'"
        elif name == "timeGroupAlias":
            s = _seconds(args[1])
            out += f'floor(extract(epoch from {args[0]})/{s})*{s} AS "time"'
        else:
            raise AssertionError(f"macro $__{name} is not expanded by this test")
    out += sql[i:]
    assert "$" not in out, out
    return out


def test_dashboards_are_generated_from_the_source() -> None:
    built = dashboards.build()
    files = dashboard_files()
    assert {f.stem for f in files} == set(built)
    for f in files:
        assert json.loads(f.read_text()) == built[f.stem], (
            f"{f.name} is stale: run python -m storage.grafana.dashboards"
        )


def test_replay_stores_10s_and_1min_rollups(filled_pg: tuple[Store, dict[str, Any]]) -> None:
    store, _ = filled_pg
    with store.engine.connect() as conn:
        res = dict(
            conn.execute(text("SELECT resolution_s, count(*) FROM metric_rollups GROUP BY 1")).all()
        )
    assert set(res) == {10, 60} and res[10] > res[60] > 0


def test_provisioning_files() -> None:
    ds = yaml.safe_load((PROV / "datasources" / "rocewatch.yaml").read_text())
    (src,) = ds["datasources"]
    assert src["type"] == "grafana-postgresql-datasource"
    uids = {
        t["datasource"]["uid"]
        for f in dashboard_files()
        for p in json.loads(f.read_text())["panels"]
        for t in p["targets"]
    }
    assert uids == {src["uid"]}
    prov = yaml.safe_load((PROV / "dashboards" / "rocewatch.yaml").read_text())
    assert (
        prov["providers"][0]["options"]["path"] == "/etc/grafana/provisioning/dashboards/rocewatch"
    )
    titles = {json.loads(f.read_text())["title"] for f in dashboard_files()}
    assert len(titles) == 8
    kinds = {p["type"] for f in dashboard_files() for p in json.loads(f.read_text())["panels"]}
    assert {"heatmap", "timeseries", "table", "state-timeline", "stat", "nodeGraph"} <= kinds


CHANGED_NIC = ("gpu-003", "mlx5_0")


def with_config_change(scenario: Path, factory: pytest.TempPathFactory) -> Path:
    """The scenario (its files linked, not copied) with one NIC switched to PCP trust 5 s in:
    a configuration change and a RoCEConfigMismatch for the dashboards to show."""
    d = factory.mktemp("scenario-config-change")
    for f in scenario.iterdir():
        if f.name != "nic_config.jsonl":
            (d / f.name).symlink_to(f)
    lines = (scenario / "nic_config.jsonl").read_bytes().splitlines()
    snaps = [json.loads(x) for x in lines if x.strip()]
    (snap,) = [n for n in snaps if (n["node"], n["nic"]) == CHANGED_NIC]
    pcp = json.loads(json.dumps(snap))
    pcp["dcb"]["apptrust"] = {"order": ["pcp"]}
    pcp["timestamp"] = snap["timestamp"] + 5_000_000_000
    (d / "nic_config.jsonl").write_text("".join(json.dumps(n) + "\n" for n in [*snaps, pcp]))
    return d


@pytest.fixture(scope="module")
def filled_pg(
    postgres_url: str, scenario_16n: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Store, dict[str, Any]]]:
    """A fresh PostgreSQL database holding a replay of the default faulty scenario."""
    base = make_url(postgres_url)
    name = f"rw_grafana_{uuid.uuid4().hex[:10]}"
    admin = base.set(drivername="postgresql", database="postgres")
    dsn = admin.render_as_string(hide_password=False)
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute(f'CREATE DATABASE "{name}"')
    store = Store(base.set(database=name).render_as_string(hide_password=False))
    try:
        store.create_schema()
        replay(
            with_config_change(scenario_16n, tmp_path_factory),
            tmp_path_factory.mktemp("out"),
            store=store,
        )
        truth = json.loads((scenario_16n / "truth.json").read_text())
        yield store, truth
    finally:
        store.close()
        with psycopg.connect(dsn, autocommit=True) as c:
            c.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(scope="module")
def tenant_pg(
    postgres_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Store, dict[str, Any]]]:
    """A fresh PostgreSQL database holding a replay of one tenant's incast into another's ring
    (the default scenario's two tenants never interfere)."""
    from rocewatch.sim import write_scenario
    from rocewatch.sim.scenarios import tenant_incast_scenario

    scen = write_scenario(tenant_incast_scenario(8, 12.0, 1), tmp_path_factory.mktemp("tenant"))
    with fresh_database(postgres_url, "rw_grafana_tenant") as url:
        store = Store(url)
        try:
            store.create_schema()
            replay(scen, tmp_path_factory.mktemp("tenant-out"), store=store)
            yield store, json.loads((scen / "truth.json").read_text())
        finally:
            store.close()


# panels about what only the tenant incast shows, read from ``tenant_pg``
TENANT_PANELS = {"Pause time suffered from other tenants"}

# panel title -> what the injected faults must make it show (checked in the rows' text)
EXPECT = {
    "Pause time received per switch port (% of time)": ["leaf-r7-p0/Ethernet1/8"],
    "Pause time requested per NIC (sent, % of time)": ["gpu-008/mlx5_7"],
    "PFC storms: origin and victims": ["gpu-008/mlx5_7", "'origin'"],
    "FCS/CRC errors per switch port": ["leaf-r0-p0/Ethernet1/12"],
    "Flaky links": ["leaf-r0-p0/Ethernet1/12"],
    "ECN-marked packets per queue (switch)": ["leaf-r6-p0/Ethernet1/9 p3"],
    "NICs whose PCIe link is below its maximum": ["'gpu-016', 'mlx5_5'"],
    "Straggler and PCIe alerts": ["gpu-016/mlx5_5"],
    "Congestion alerts": ["gpu-015/mlx5_4", "leaf-r6-p0/Ethernet1/9"],
    "Drain and resume decisions": ["'gpu-008'"],
    "RoCE configuration changes": ["'gpu-003/mlx5_0', 'trust', 'dscp', 'pcp'"],
    "RoCE configuration mismatches": ["gpu-003/mlx5_0", "'RoCEConfigMismatch'"],
    "annotation: RoCE configuration changes": ["trust on gpu-003/mlx5_0 changed dscp -> pcp"],
    "Alerts timeline": ["PFCStorm gpu-008/mlx5_7", "FlakyLink leaf-r0-p0/Ethernet1/12"],
    # the incident dashboard, on the storm's incident ($incident)
    "Pause graph": ["gpu-008/mlx5_7"],
    "Timeline": ["PFC storm on priority 3 originating at gpu-008/mlx5_7"],
    "Pause and ECN of $entity (click a node of the graph)": ["gpu-008/mlx5_7 p3 nic_tx_pause_us"],
    "Pause time suffered from other tenants": ["'team-b', 'team-a'", "'ring-b', 'moe-a'"],
}


def storm_incident(store: Store) -> str:
    """The $incident of the scenario's storm (what the dashboard's variable offers)."""
    return str(next(i["id"] for i in store.incidents() if "gpu-008/mlx5_7" in i["title"]))


@pytest.mark.parametrize(("dash", "title", "sql"), queries(), ids=lambda v: str(v)[:60])
def test_every_dashboard_query_returns_the_faults(
    request: pytest.FixtureRequest,
    filled_pg: tuple[Store, dict[str, Any]],
    dash: str,
    title: str,
    sql: str,
) -> None:
    store, truth = request.getfixturevalue("tenant_pg") if title in TENANT_PANELS else filled_pg
    start = dt.datetime.fromtimestamp(truth["start_ns"] / 1e9, tz=dt.UTC)
    end = dt.datetime.fromtimestamp(truth["end_ns"] / 1e9, tz=dt.UTC)
    var = {
        "incident": "0" if title in TENANT_PANELS else storm_incident(store),
        "entity": "gpu-008/mlx5_7",
    }
    q = expand(sql, start - dt.timedelta(minutes=5), end + dt.timedelta(minutes=5), var)
    with store.engine.connect() as conn:
        rows = [tuple(r) for r in conn.execute(text(q)).all()]
    assert rows, f"{dash}: {title!r} returned no rows"
    numbers = [v for r in rows for v in r if isinstance(v, int | float) and not isinstance(v, bool)]
    strings = [v for r in rows for v in r if isinstance(v, str)]
    assert strings or any(numbers), f"{dash}: {title!r} returned only zeros: {rows[:5]}"
    shown = repr(rows)
    for want in EXPECT.get(title, []):
        assert want in shown, f"{dash}: {title!r} does not show {want}: {shown[:800]}"
    # over a long range the same panels read the 1 min rollups
    q_long = expand(sql, start - dt.timedelta(hours=7), end + dt.timedelta(minutes=5), var)
    with store.engine.connect() as conn:
        long_rows = conn.execute(text(q_long)).all()
    assert long_rows, f"{dash}: {title!r} returned no rows over 7 hours"
    # nothing outside the range leaks in (a count answers one row of zero)
    if title == "Alerts firing now":  # the current state, whatever the range
        return
    q_empty = expand(sql, start - dt.timedelta(days=3), start - dt.timedelta(days=2), var)
    with store.engine.connect() as conn:
        early = [tuple(r) for r in conn.execute(text(q_empty)).all()]
    assert all(v in (0, None) for r in early for v in r), (
        f"{dash}: {title!r} ignores the time range: {early[:3]}"
    )


def test_the_node_graph_queries_return_grafanas_nodes_and_edges_frames(
    filled_pg: tuple[Store, dict[str, Any]],
) -> None:
    """The incident dashboard's Node graph: a ``nodes`` and an ``edges`` frame with the field
    names Grafana's node graph reads, for the stored incident of the scenario's storm."""
    store, truth = filled_pg
    dash = json.loads((PROV / "dashboards" / "rocewatch" / "incident.json").read_text())
    (graph,) = [p for p in dash["panels"] if p["type"] == "nodeGraph"]
    frames = {t["refId"]: t["rawSql"] for t in graph["targets"]}
    assert set(frames) == {"nodes", "edges"}  # the frames are named after their refId
    start = dt.datetime.fromtimestamp(truth["start_ns"] / 1e9, tz=dt.UTC)
    end = dt.datetime.fromtimestamp(truth["end_ns"] / 1e9, tz=dt.UTC)
    t0, t1 = start - dt.timedelta(minutes=5), end + dt.timedelta(minutes=5)
    var, entity = dash["templating"]["list"]
    assert entity["name"] == "entity"  # set by the nodes' data link
    (link, *_) = next(
        o["properties"][0]["value"]
        for o in graph["fieldConfig"]["overrides"]
        if o["matcher"]["options"] == "id"
    )
    assert "var-entity=${__data.fields.title}" in link["url"]
    with store.engine.connect() as conn:
        offered = conn.execute(text(expand(var["query"], t0, t1))).mappings().all()
        incident = storm_incident(store)
        assert incident in {str(r["__value"]) for r in offered}
        assert any("PFC storm from gpu-008/mlx5_7" in r["__text"] for r in offered)
        q = {k: expand(v, t0, t1, {"incident": incident}) for k, v in frames.items()}
        nodes = conn.execute(text(q["nodes"])).mappings().all()
        edges = conn.execute(text(q["edges"])).mappings().all()
    assert list(nodes[0].keys()) == [
        "id", "title", "subtitle", "mainstat", "secondarystat", "arc__paused", "arc__unpaused",
        "detail__kind", "detail__first_paused", "detail__ports", "color",
    ]  # fmt: skip
    assert list(edges[0].keys()) == ["id", "source", "target", "mainstat", "thickness", "color"]
    by_id = {n["id"]: n for n in nodes}
    origin = by_id["nic:gpu-008/mlx5_7"]
    assert origin["detail__kind"] == "origin" and origin["color"] == "#d62728"
    assert float(origin["mainstat"]) > 99 and origin["secondarystat"]  # share, first paused
    for n in nodes:
        assert float(n["arc__paused"]) + float(n["arc__unpaused"]) == pytest.approx(1.0)
        assert n["color"].startswith("#")
    # every truth victim of the storm is a node of its graph
    (fault,) = [f for f in truth["faults"] if f["alertname"] == "PFCStorm"]
    want = {
        f"nic:{v['node']}/{v['nic']}" if "node" in v else f"switch:{v['switch']}"
        for v in fault["victims"]
    }
    assert want <= set(by_id)
    assert {e["source"] for e in edges} | {e["target"] for e in edges} <= set(by_id)
    assert len({e["id"] for e in edges}) == len(edges)
    pauses = [e for e in edges if e["mainstat"].startswith("pauses")]
    assert any(e["source"] == "nic:gpu-008/mlx5_7" for e in pauses)
    assert all(float(e["thickness"]) >= 1 for e in edges)
