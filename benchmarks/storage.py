"""Benchmark: sustained metric-rollup writes into SQLite and PostgreSQL through storage.Store.

Prints one JSON object (--json) with:
  sqlite_rows_per_s     rollup rows upserted per second into an SQLite file (WAL, synchronous=FULL)
  postgres_rows_per_s   the same into PostgreSQL
and the conditions (rows per batch, series, seconds, the server's fsync setting). Each backend
is written for --seconds of wall time: one batch per bucket, every series once per bucket, as
the detector writes its 10 s rollups, each batch one committed transaction.

PostgreSQL: ROCEWATCH_TEST_PG_URL (a fresh database is created on that server and dropped), or
else a private throwaway cluster from Debian's postgresql binaries (needs root to run them as
the postgres user); without either it fails with a clear message.

  python benchmarks/storage.py --json [--series 5000] [--seconds 8]
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:] = [str(ROOT)] + [
    p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent
]

import polars as pl  # noqa: E402

T0 = 1_795_946_400_000_000_000


def log(msg: str) -> None:
    print(f"[storage-bench] {msg}", file=sys.stderr, flush=True)


def series_frame(n: int) -> pl.DataFrame:
    """n distinct series (device, port, qual, metric), like a fabric's rollup set."""
    metrics = [
        "pfc_rx_pause_us",
        "port_in_octets",
        "port_out_octets",
        "queue_ecn_marked_pkts",
        "port_in_fcs_errors",
        "queue_peak_bytes",
        "nic_rx_corrected_bits",
        "nic_cnp_sent",
    ]
    i = pl.int_range(0, n, eager=True)
    return pl.DataFrame(
        {
            "device": (i // 256).map_elements(lambda v: f"leaf-{v:03d}", return_dtype=pl.String),
            "port": ((i // len(metrics)) % 32).map_elements(
                lambda v: f"Ethernet1/{v + 1}", return_dtype=pl.String
            ),
            "qual": (i % 2).cast(pl.String),
            "metric": (i % len(metrics)).map_elements(lambda v: metrics[v], return_dtype=pl.String),
        }
    ).unique(maintain_order=True)


def bucket(series: pl.DataFrame, k: int) -> pl.DataFrame:
    n = series.height
    v = pl.int_range(0, n, eager=True).cast(pl.Float64) + k
    return series.with_columns(
        pl.lit(T0 + k * 10_000_000_000, dtype=pl.Int64).alias("bucket_start_ns"),
        pl.lit(10, dtype=pl.Int64).alias("resolution_s"),
        v.alias("mean"),
        (v * 2).alias("max"),
        (v / 2).alias("min"),
        v.alias("last"),
        pl.lit(20, dtype=pl.Int64).alias("count"),
    )


def run(url: str, series: pl.DataFrame, seconds: float) -> dict[str, float]:
    from storage.store import Store

    with Store(url) as s:
        s.create_schema(timescaledb=False)
        frames = [bucket(series, k) for k in range(4)]  # prepared up front: time only the writes
        rows = 0
        k = 0
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            f = frames[k % len(frames)].with_columns(
                pl.lit(T0 + k * 10_000_000_000, dtype=pl.Int64).alias("bucket_start_ns")
            )
            rows += s.write_rollups(f)
            k += 1
        dt = time.perf_counter() - t0
        stored = s.rollups().height
    assert stored == rows, (stored, rows)
    return {"rows": rows, "seconds": dt, "rows_per_s": rows / dt, "batches": k}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def postgres() -> Iterator[tuple[str, str]]:
    """(SQLAlchemy URL of a fresh database, where it came from)."""
    import psycopg
    from sqlalchemy.engine import make_url

    server = os.environ.get("ROCEWATCH_TEST_PG_URL")
    if server:
        with _fresh_db(server, psycopg, make_url) as url:
            yield url, "ROCEWATCH_TEST_PG_URL"
        return
    with _private_cluster() as server, _fresh_db(server, psycopg, make_url) as url:
        yield url, "private cluster"


@contextlib.contextmanager
def _fresh_db(server: str, psycopg: object, make_url: object) -> Iterator[str]:
    base = make_url(server)  # type: ignore[operator]
    admin = base.set(drivername="postgresql", database="postgres").render_as_string(
        hide_password=False
    )
    name = f"rw_bench_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(admin, autocommit=True) as c:  # type: ignore[attr-defined]
        c.execute(f'CREATE DATABASE "{name}"')
    try:
        yield base.set(database=name).render_as_string(hide_password=False)
    finally:
        with psycopg.connect(admin, autocommit=True) as c:  # type: ignore[attr-defined]
            c.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@contextlib.contextmanager
def _private_cluster() -> Iterator[str]:
    bins = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"))
    if not bins:
        sys.exit(
            "storage benchmark: no ROCEWATCH_TEST_PG_URL and no PostgreSQL server binaries "
            "(bash scripts/services.sh install, or set ROCEWATCH_TEST_PG_URL)"
        )
    if os.geteuid() != 0 or shutil.which("runuser") is None:
        sys.exit(
            "storage benchmark: no ROCEWATCH_TEST_PG_URL; starting a private PostgreSQL "
            "needs root (to run it as the postgres user)"
        )
    bindir = Path(bins[-1]).parent
    tmp = Path(tempfile.mkdtemp(prefix="rw-bench-pg-"))
    os.chmod(tmp, 0o755)
    data = tmp / "data"
    port = free_port()
    subprocess.run(["chown", "postgres:postgres", str(tmp)], check=True)
    as_pg = ["runuser", "-u", "postgres", "--"]
    log(f"starting a private PostgreSQL ({bindir.parent.name}) on 127.0.0.1:{port}")
    subprocess.run(
        [
            *as_pg,
            str(bindir / "initdb"),
            "-D",
            str(data),
            "-U",
            "postgres",
            "--auth=trust",
            "--no-sync",
        ],
        check=True,
        capture_output=True,
    )
    subprocess.run(
        [
            *as_pg,
            str(bindir / "pg_ctl"),
            "-D",
            str(data),
            "-l",
            str(tmp / "log"),
            "-w",
            "-o",
            f"-p {port} -c listen_addresses=127.0.0.1 -c unix_socket_directories={tmp}",
            "start",
        ],
        check=True,
        capture_output=True,
    )
    try:
        yield f"postgresql+psycopg://postgres@127.0.0.1:{port}/postgres"
    finally:
        subprocess.run(
            [*as_pg, str(bindir / "pg_ctl"), "-D", str(data), "-m", "fast", "-w", "stop"],
            capture_output=True,
        )
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--series", type=int, default=5000, help="series (rows) per bucket")
    ap.add_argument("--seconds", type=float, default=8.0, help="wall seconds per backend")
    args = ap.parse_args()
    series = series_frame(args.series)
    out: dict[str, object] = {
        "series_per_batch": series.height,
        "seconds_per_backend": args.seconds,
    }
    with tempfile.TemporaryDirectory() as d:
        log("SQLite")
        r = run(f"sqlite:///{Path(d) / 'bench.db'}", series, args.seconds)
        out["sqlite_rows_per_s"] = round(r["rows_per_s"])
        out["sqlite_rows"] = r["rows"]
    with postgres() as (url, origin):
        log(f"PostgreSQL ({origin})")
        from sqlalchemy import create_engine, text

        eng = create_engine(url.replace("postgresql+psycopg", "postgresql+psycopg", 1))
        with eng.connect() as c:
            out["postgres_version"] = c.execute(text("SHOW server_version")).scalar()
            out["postgres_fsync"] = c.execute(text("SHOW fsync")).scalar()
            out["postgres_synchronous_commit"] = c.execute(text("SHOW synchronous_commit")).scalar()
        eng.dispose()
        r = run(url, series, args.seconds)
        out["postgres_rows_per_s"] = round(r["rows_per_s"])
        out["postgres_rows"] = r["rows"]
        out["postgres_server"] = origin
    if args.json:
        print(json.dumps(out))
    else:
        for k, v in out.items():
            print(f"{k}: {v}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
