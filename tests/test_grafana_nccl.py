"""The NCCL jobs dashboard (storage/grafana/nccl.py): every query, its annotations' too, runs
against a real PostgreSQL filled by a replay of a job whose NIC's PCIe link trains down, and
shows the job's series, its ranks and the fabric alert on its path."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from sqlalchemy import text
from sqlalchemy.engine import make_url

from rocewatch.replay import replay
from storage.store import Store
from tests.test_grafana import PROV, expand, queries

pytestmark = pytest.mark.slow  # simulates and replays a 4-node, 12 s scenario into PostgreSQL

JOB = "llm-train-a"
EXPECT = {
    "Bus bandwidth of $job (GB/s)": ["AllReduce 2147483648 B"],
    "Collective time of $job (us)": ["AllReduce 2147483648 B"],
    "Kernel start lag of $job's latest ranks (us)": ["gpu-002 rank9"],
    "Ranks of $job": ["'gpu-002', 1, 'mlx5_1'"],
    "Fabric and NCCL alerts on $job's path": [
        "'PCIeDowngrade'",
        "gpu-002/mlx5_1",
        "llm-train-a rank 9 (gpu-002 GPU 1 mlx5_1)",
        "'SlowRank'",
    ],
    "annotations": ["PCIeDowngrade gpu-002/mlx5_1"],
}


@pytest.fixture(scope="module")
def nccl_pg(
    postgres_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Store, dict[str, Any]]]:
    from rocewatch.evaluate.nccl import NCCL_CASES
    from rocewatch.sim.writers import write_scenario

    base = make_url(postgres_url)
    name = f"rw_grafana_nccl_{uuid.uuid4().hex[:10]}"
    admin = base.set(drivername="postgresql", database="postgres")
    dsn = admin.render_as_string(hide_password=False)
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute(f'CREATE DATABASE "{name}"')
    store = Store(base.set(database=name).render_as_string(hide_password=False))
    try:
        store.create_schema()
        case = next(c for c in NCCL_CASES if c.fault == "pcie")
        tmp = tmp_path_factory.mktemp("nccl")
        scen = write_scenario(dataclasses.replace(case.scenario()), tmp / "s", nccl=True)
        replay(scen, tmp / "out", store=store)
        yield store, json.loads((scen / "truth.json").read_text())
    finally:
        store.close()
        with psycopg.connect(dsn, autocommit=True) as c:
            c.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def nccl_queries() -> list[tuple[str, str]]:
    dash = json.loads((PROV / "dashboards" / "rocewatch" / "nccl-jobs.json").read_text())
    out = [(title, sql) for _, title, sql in queries(nccl=True)]
    out += [("annotations", a["target"]["rawSql"]) for a in dash["annotations"]["list"]]
    return out


def test_the_ranks_are_stored_with_their_job(nccl_pg: tuple[Store, dict[str, Any]]) -> None:
    store, _ = nccl_pg
    ranks = store.ranks()
    assert {r["job"] for r in ranks} == {JOB, "llm-train-b"}
    mine = [r for r in ranks if r["job"] == JOB]
    assert len(mine) == 16 and {r["rank"] for r in mine} == set(range(16))
    r9 = next(r for r in mine if r["rank"] == 9)
    assert (r9["host"], r9["gpu"], r9["nic"]) == ("gpu-002", 1, "mlx5_1")
    assert r9["first_seen"] <= r9["last_seen"]


@pytest.mark.parametrize(("title", "sql"), nccl_queries(), ids=lambda v: str(v)[:50])
def test_every_nccl_dashboard_query_shows_the_job(
    nccl_pg: tuple[Store, dict[str, Any]], title: str, sql: str
) -> None:
    store, truth = nccl_pg
    start = dt.datetime.fromtimestamp(truth["start_ns"] / 1e9, tz=dt.UTC)
    end = dt.datetime.fromtimestamp(truth["end_ns"] / 1e9, tz=dt.UTC)
    q = expand(sql, start - dt.timedelta(minutes=5), end + dt.timedelta(minutes=5), {"job": JOB})
    with store.engine.connect() as conn:
        rows = [tuple(r) for r in conn.execute(text(q)).all()]
    assert rows, f"{title!r} returned no rows"
    shown = repr(rows)
    for want in EXPECT[title]:
        assert want in shown, f"{title!r} does not show {want}: {shown[:800]}"
    # another job's view holds none of this job's ranks or its NIC's alert
    other = expand(sql, start - dt.timedelta(minutes=5), end, {"job": "llm-train-b"})
    with store.engine.connect() as conn:
        theirs = repr(conn.execute(text(other)).all())
    assert "gpu-002" not in theirs
    # nothing outside the range leaks in
    early = expand(sql, start - dt.timedelta(days=3), start - dt.timedelta(days=2), {"job": JOB})
    with store.engine.connect() as conn:
        assert conn.execute(text(early)).all() == []
