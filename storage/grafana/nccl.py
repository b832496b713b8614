"""The NCCL jobs dashboard: a job's bus bandwidth and collective time, its late ranks, and the
fabric alerts on its path, as panels and as annotations on the time series.

A job's series are found through ``nccl_ranks`` (the rank join, stored by the pipeline): the
communicators of ``$job`` are the first part of the series' qual (``<comm>/<coll>/<size>``
for bus bandwidth and collective time, ``<comm>`` for the kernel start lag). The fabric alerts
on a job's path are those the join annotated with the job (``annotations.jobs``: an alert
about a NIC or port its ranks use, rocewatch/alerting/job_paths.py), and the job's own NCCL
alerts (``job`` label).
"""

from __future__ import annotations

from typing import Any

COMMS = "SELECT DISTINCT comm FROM nccl_ranks WHERE job = '$job'"
JOB_ALERTS = "('SlowRank', 'SlowEdge', 'BusBandwidthDrop')"
ON_PATH = (
    f"((',' || replace(annotations->>'jobs', ' ', '') || ',') LIKE '%,$job,%' "
    f"OR (labels->>'job' = '$job' AND alertname IN {JOB_ALERTS}))"
)
ENTITY = "coalesce(switch || '/' || port, node || '/' || nic, labels->>'comm', '')"


def per_comm(metric: str, agg: str, finest: str) -> str:
    """One series per collective and message size of the job's communicators."""
    return f"""SELECT r.bucket_start AS time,
       split_part(r.qual, '/', 2) || ' ' || split_part(r.qual, '/', 3) || ' B ('
         || left(split_part(r.qual, '/', 1), 10) || ')' AS metric,
       {agg} AS value
FROM metric_rollups r
WHERE r.metric = '{metric}' AND $__timeFilter(r.bucket_start) AND r.{finest}
  AND split_part(r.qual, '/', 1) IN ({COMMS})
GROUP BY 1, 2
ORDER BY 1, 2"""


def late_ranks(finest: str) -> str:
    """The kernel start lag of the job's ten latest ranks."""
    return f"""WITH top AS (
  SELECT device, port FROM metric_rollups
  WHERE metric = 'nccl_kernel_start_lag_us' AND $__timeFilter(bucket_start) AND {finest}
    AND qual IN ({COMMS})
  GROUP BY device, port ORDER BY max(max) DESC LIMIT 10
)
SELECT r.bucket_start AS time, r.device || ' ' || r.port AS metric, max(r.max) AS value
FROM metric_rollups r JOIN top USING (device, port)
WHERE r.metric = 'nccl_kernel_start_lag_us' AND $__timeFilter(r.bucket_start) AND r.{finest}
  AND r.qual IN ({COMMS})
GROUP BY 1, 2
ORDER BY 1, 2"""


ALERTS_ON_PATH = f"""SELECT starts_at AS "started", ends_at AS "ended", alertname, severity,
       status, {ENTITY} AS entity, annotations->>'cause' AS cause,
       coalesce(annotations->>'ranks', annotations->>'path_alerts', '') AS "ranks or path",
       annotations->>'summary' AS summary
FROM alerts
WHERE {ON_PATH}
  AND starts_at <= $__timeTo() AND (ends_at IS NULL OR ends_at >= $__timeFrom())
ORDER BY starts_at DESC"""

RANKS_TABLE = """SELECT rank, host, gpu, nic, comm, first_seen, last_seen
FROM nccl_ranks
WHERE job = '$job' AND first_seen <= $__timeTo()
ORDER BY comm, rank"""

ANNOTATIONS = f"""SELECT starts_at AS time, coalesce(ends_at, now()) AS timeend,
       alertname || ' ' || {ENTITY} AS text, alertname AS tags
FROM alerts
WHERE {ON_PATH} AND alertname NOT IN {JOB_ALERTS}
  AND starts_at <= $__timeTo() AND (ends_at IS NULL OR ends_at >= $__timeFrom())
ORDER BY starts_at"""


def nccl_dashboard(ds: dict[str, Any], finest: str, panel: Any, dashboard: Any) -> dict[str, Any]:
    """The dashboard (the generator's ``panel`` and ``dashboard`` builders passed in)."""
    d: dict[str, Any] = dashboard(
        "rw-nccl",
        "rocewatch: NCCL jobs",
        [
            panel(
                "Bus bandwidth of $job (GB/s)",
                "timeseries",
                per_comm("nccl_coll_busbw_gbs", "avg(r.mean)", finest),
                0,
                0,
                12,
                8,
            ),
            panel(
                "Collective time of $job (us)",
                "timeseries",
                per_comm("nccl_coll_exec_us", "max(r.mean)", finest),
                12,
                0,
                12,
                8,
                unit="µs",
            ),
            panel(
                "Kernel start lag of $job's latest ranks (us)",
                "timeseries",
                late_ranks(finest),
                0,
                8,
                12,
                8,
                unit="µs",
            ),
            panel("Ranks of $job", "table", RANKS_TABLE, 12, 8, 12, 8, fmt="table"),
            panel(
                "Fabric and NCCL alerts on $job's path",
                "table",
                ALERTS_ON_PATH,
                0,
                16,
                24,
                8,
                fmt="table",
            ),
        ],
    )
    d["templating"] = {
        "list": [
            {
                "name": "job",
                "label": "Job",
                "type": "query",
                "datasource": ds,
                "query": "SELECT DISTINCT job FROM nccl_ranks ORDER BY 1",
                "definition": "SELECT DISTINCT job FROM nccl_ranks ORDER BY 1",
                "refresh": 2,
                "includeAll": False,
                "multi": False,
                "sort": 1,
            }
        ]
    }
    # the fabric alerts on the job's path, drawn over every time series
    d["annotations"] = {
        "list": [
            {
                "name": "Fabric alerts on the job's path",
                "datasource": ds,
                "enable": True,
                "iconColor": "red",
                "target": {
                    "refId": "Anno",
                    "datasource": ds,
                    "editorMode": "code",
                    "format": "table",
                    "rawQuery": True,
                    "rawSql": ANNOTATIONS,
                },
            }
        ]
    }
    return d
