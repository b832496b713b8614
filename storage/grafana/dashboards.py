"""Generates the provisioned Grafana dashboards (JSON) from the SQL below.

    python -m storage.grafana.dashboards      # rewrites provisioning/dashboards/rocewatch/*.json

Every panel reads the rocewatch PostgreSQL database (datasource uid ``rocewatch-pg``) with
Grafana's PostgreSQL macros ``$__timeFilter(col)``, ``$__timeFrom()``, ``$__timeTo()`` and
``$__timeGroupAlias(col, 'interval')``. Rollup values are per-second rates for counters (bytes,
packets, microseconds of pause per second) and plain values for gauges. tests/test_grafana.py
runs every query against a real PostgreSQL filled by a replay with faults.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rocewatch.core.model import ALERTNAMES, ROCE_CONFIG_MISMATCH
from storage.grafana.nccl import nccl_dashboard

OUT = Path(__file__).parent / "provisioning" / "dashboards" / "rocewatch"
DS = {"type": "grafana-postgresql-datasource", "uid": "rocewatch-pg"}
# rocewatch writes 10 s and 1 min rollups: ranges over 6 hours read the 1 min ones
FINEST = (
    "resolution_s = CASE WHEN $__timeTo()::timestamptz - $__timeFrom()::timestamptz "
    "> interval '6 hours' THEN 60 ELSE 10 END"
)


def series(metric: str, value: str = "r.mean", top: int = 10, where: str = "") -> str:
    """A time series per entity of one metric: the ``top`` entities by their peak."""
    extra = f" AND {where}" if where else ""
    return f"""WITH top AS (
  SELECT device, port, qual FROM metric_rollups
  WHERE metric = '{metric}' AND $__timeFilter(bucket_start) AND {FINEST}{extra}
  GROUP BY device, port, qual HAVING max(mean) > 0
  ORDER BY max(mean) DESC LIMIT {top}
)
SELECT r.bucket_start AS time,
       r.device || '/' || r.port || CASE WHEN r.qual <> '' THEN ' p' || r.qual ELSE '' END
         AS metric,
       {value} AS value
FROM metric_rollups r JOIN top USING (device, port, qual)
WHERE r.metric = '{metric}' AND $__timeFilter(r.bucket_start) AND r.{FINEST}
ORDER BY 1, 2"""


def heatmap(metric: str, where: str) -> str:
    """Pause time in % of each bucket per entity: one heatmap row per switch/port or NIC."""
    return f"""SELECT bucket_start AS time, device || '/' || port AS metric,
       max(mean) / 1e4 AS value
FROM metric_rollups
WHERE metric = '{metric}' AND $__timeFilter(bucket_start) AND {FINEST} AND {where}
  AND (device, port) IN (
    SELECT device, port FROM metric_rollups
    WHERE metric = '{metric}' AND $__timeFilter(bucket_start) AND mean > 0
    GROUP BY device, port ORDER BY max(mean) DESC LIMIT 40)
GROUP BY 1, 2
ORDER BY 1, 2"""


def alerts_table(names: list[str]) -> str:
    inlist = ", ".join(f"'{n}'" for n in names)
    return f"""SELECT starts_at AS "started", ends_at AS "ended", alertname, severity, status,
       coalesce(switch || '/' || port, node || '/' || nic, labels->>'scope', '') AS entity,
       role, annotations->>'summary' AS summary, annotations->>'evidence' AS evidence
FROM alerts
WHERE alertname IN ({inlist})
  AND starts_at <= $__timeTo() AND (ends_at IS NULL OR ends_at >= $__timeFrom())
ORDER BY starts_at DESC"""


ENTITY = "coalesce(switch || '/' || port, node || '/' || nic, labels->>'scope', '')"

# per victim tenant and the tenant that caused it: the PFC pause time its NICs suffered while
# congestion alerts named another tenant's job as the aggressor (rocewatch/alerting/interference)
TENANT_PAUSE = """SELECT victim_tenant AS "victim tenant", aggressor_tenant AS "caused by tenant",
       sum(pause_s) AS "pause suffered (s)", count(*) AS alerts,
       string_agg(DISTINCT victim_job, ', ') AS "victim jobs",
       string_agg(DISTINCT aggressor_job, ', ') AS "aggressor jobs"
FROM tenant_interference
WHERE starts_at <= $__timeTo() AND (ends_at IS NULL OR ends_at >= $__timeFrom())
GROUP BY 1, 2
ORDER BY 3 DESC"""


def panel(
    title: str,
    kind: str,
    sql: str,
    x: int,
    y: int,
    w: int = 12,
    h: int = 8,
    fmt: str = "time_series",
    unit: str | None = None,
    **options: Any,
) -> dict[str, Any]:
    p: dict[str, Any] = {
        "type": kind,
        "title": title,
        "datasource": DS,
        "gridPos": {"x": x, "y": y, "w": w, "h": h},
        "targets": [
            {
                "refId": "A",
                "datasource": DS,
                "editorMode": "code",
                "format": fmt,
                "rawQuery": True,
                "rawSql": sql,
            }
        ],
        "fieldConfig": {"defaults": {}, "overrides": []},
        "options": options,
    }
    if unit:
        p["fieldConfig"]["defaults"]["unit"] = unit
    return p


# RoCE configuration changes (rocewatch/roce/watch.py): one row per setting of one cable end
CONFIG_CHANGES_SQL = """SELECT time AS "time", kind, device || '/' || port AS entity, field,
       old_value AS "old", new_value AS "new", source
FROM config_changes
WHERE $__timeFilter(time)
ORDER BY time DESC, device, port, field
LIMIT 500"""

# the same as annotations on the fabric dashboards' graphs: one marker per device, setting and
# change (a leaf whose PFC changed on every port is one marker naming the number of ports)
CONFIG_ANNOTATION_SQL = """SELECT time AS "time",
       field || ' on ' || device
         || CASE WHEN count(*) > 1 THEN ' (' || count(*) || ' ports)' ELSE '/' || min(port) END
         || ' changed ' || old_value || ' -> ' || new_value AS text,
       'roce-config,' || field AS tags
FROM config_changes
WHERE $__timeFilter(time)
GROUP BY time, device, field, old_value, new_value
ORDER BY 1"""


def config_annotations() -> dict[str, Any]:
    """Grafana's built-in annotations plus the RoCE configuration changes from the store."""
    return {
        "list": [
            {
                "builtIn": 1,
                "datasource": {"type": "grafana", "uid": "-- Grafana --"},
                "enable": True,
                "hide": True,
                "iconColor": "rgba(0, 211, 255, 1)",
                "name": "Annotations & Alerts",
                "type": "dashboard",
            },
            {
                "datasource": DS,
                "enable": True,
                "hide": False,
                "iconColor": "orange",
                "name": "RoCE configuration changes",
                "target": {
                    "refId": "Anno",
                    "datasource": DS,
                    "editorMode": "code",
                    "format": "table",
                    "rawQuery": True,
                    "rawSql": CONFIG_ANNOTATION_SQL,
                },
            },
        ]
    }


def dashboard(
    uid: str,
    title: str,
    panels: list[dict[str, Any]],
    hours: int = 6,
    config_changes: bool = False,
) -> dict[str, Any]:
    """``config_changes``: RoCE configuration changes shown as annotations on its graphs."""
    for i, p in enumerate(panels, 1):
        p["id"] = i
    extra: dict[str, Any] = {"annotations": config_annotations()} if config_changes else {}
    return {
        "uid": uid,
        "title": title,
        "tags": ["rocewatch"],
        "timezone": "utc",
        "schemaVersion": 39,
        "version": 1,
        "editable": False,
        "refresh": "30s",
        "time": {"from": f"now-{hours}h", "to": "now"},
        "panels": panels,
        "links": [
            {"type": "dashboards", "tags": ["rocewatch"], "asDropdown": True, "title": "rocewatch"}
        ],
        **extra,
    }


def build() -> dict[str, dict[str, Any]]:
    d: dict[str, dict[str, Any]] = {}
    d["fabric-overview"] = dashboard(
        "rw-overview",
        "rocewatch: fabric overview",
        [
            panel(
                "Alerts firing now",
                "stat",
                "SELECT count(*) AS firing FROM alerts WHERE status = 'firing'",
                0,
                0,
                6,
                4,
                fmt="table",
            ),
            panel(
                "Alerts started in range",
                "stat",
                "SELECT count(*) AS alerts FROM alerts WHERE $__timeFilter(starts_at)",
                6,
                0,
                6,
                4,
                fmt="table",
            ),
            panel(
                "Drain decisions in range",
                "stat",
                "SELECT count(*) AS actions FROM actions WHERE $__timeFilter(time)",
                12,
                0,
                6,
                4,
                fmt="table",
            ),
            panel(
                "Ports paused > 50% of a step",
                "stat",
                "SELECT count(DISTINCT device || '/' || port) AS ports FROM metric_rollups "
                "WHERE metric IN ('pfc_rx_pause_us', 'nic_rx_pause_us') AND max > 5e5 "
                f"AND $__timeFilter(bucket_start) AND {FINEST}",
                18,
                0,
                6,
                4,
                fmt="table",
            ),
            panel(
                "Alerts started per minute, by kind",
                "timeseries",
                "SELECT $__timeGroupAlias(starts_at, '1m'), alertname AS metric, "
                "count(*) AS value FROM alerts WHERE $__timeFilter(starts_at) "
                "GROUP BY 1, 2 ORDER BY 1",
                0,
                4,
                12,
                8,
            ),
            panel(
                "Fabric throughput (switch ports, transmitted)",
                "timeseries",
                'SELECT bucket_start AS time, sum(mean) * 8 AS "tx" FROM metric_rollups '
                f"WHERE metric = 'port_out_octets' AND $__timeFilter(bucket_start) AND {FINEST} "
                "GROUP BY 1 ORDER BY 1",
                12,
                4,
                12,
                8,
                unit="bps",
            ),
            panel(
                "Most paused ports and NICs",
                "table",
                "SELECT device || '/' || port AS entity, qual AS priority, "
                'max(mean) / 1e4 AS "peak pause %", avg(mean) / 1e4 AS "mean pause %" '
                "FROM metric_rollups WHERE metric IN ('pfc_rx_pause_us', 'nic_tx_pause_us') "
                f"AND $__timeFilter(bucket_start) AND {FINEST} GROUP BY 1, 2 "
                "HAVING max(mean) > 0 ORDER BY 3 DESC LIMIT 15",
                0,
                12,
                24,
                8,
                fmt="table",
            ),
            panel(
                "RoCE configuration changes",
                "table",
                CONFIG_CHANGES_SQL,
                0,
                20,
                24,
                8,
                fmt="table",
            ),
            panel(
                "RoCE configuration mismatches",
                "table",
                alerts_table([ROCE_CONFIG_MISMATCH]),
                0,
                28,
                24,
                8,
                fmt="table",
            ),
        ],
        config_changes=True,
    )
    d["pfc"] = dashboard(
        "rw-pfc",
        "rocewatch: PFC pause",
        [
            panel(
                "Pause time received per switch port (% of time)",
                "heatmap",
                heatmap("pfc_rx_pause_us", "port <> ''"),
                0,
                0,
                24,
                10,
                calculate=False,
                yAxis={"axisPlacement": "left"},
                cellGap=1,
            ),
            panel(
                "Pause time requested per switch port (sent, % of time)",
                "heatmap",
                heatmap("pfc_tx_pause_us", "port <> ''"),
                0,
                10,
                24,
                10,
                calculate=False,
            ),
            panel(
                "Pause time requested per NIC (sent, % of time)",
                "heatmap",
                heatmap("nic_tx_pause_us", "port <> ''"),
                0,
                20,
                24,
                10,
                calculate=False,
            ),
            panel(
                "PFC storms: origin and victims",
                "table",
                alerts_table(["PFCStorm"]),
                0,
                30,
                24,
                8,
                fmt="table",
            ),
        ],
        config_changes=True,
    )
    d["congestion"] = dashboard(
        "rw-congestion",
        "rocewatch: ECN and CNP",
        [
            panel(
                "ECN-marked packets per queue (switch)",
                "timeseries",
                series("queue_ecn_marked_pkts"),
                0,
                0,
                12,
                8,
                unit="pps",
            ),
            panel(
                "ECN-marked RoCE packets per NIC",
                "timeseries",
                series("nic_ecn_marked_pkts"),
                12,
                0,
                12,
                8,
                unit="pps",
            ),
            panel(
                "CNPs sent per NIC (notification point)",
                "timeseries",
                series("nic_cnp_sent"),
                0,
                8,
                12,
                8,
                unit="pps",
            ),
            panel(
                "CNPs handled per NIC (reaction point)",
                "timeseries",
                series("nic_cnp_handled"),
                12,
                8,
                12,
                8,
                unit="pps",
            ),
            panel(
                "Queue peak occupancy",
                "timeseries",
                series("queue_peak_bytes", "r.max"),
                0,
                16,
                12,
                8,
                unit="decbytes",
            ),
            panel(
                "Congestion alerts",
                "table",
                alerts_table(["ECNCongestion", "QueueBuildup", "TransportErrors"]),
                12,
                16,
                12,
                8,
                fmt="table",
            ),
            panel(
                "Pause time suffered from other tenants",
                "table",
                TENANT_PAUSE,
                0,
                24,
                24,
                8,
                fmt="table",
            ),
        ],
        config_changes=True,
    )
    d["link-health"] = dashboard(
        "rw-links",
        "rocewatch: link errors and BER",
        [
            panel(
                "FCS/CRC errors per switch port",
                "timeseries",
                series("port_in_fcs_errors"),
                0,
                0,
                12,
                8,
                unit="short",
            ),
            panel(
                "NIC PHY errors (CRC, symbol, FEC-uncorrectable)",
                "timeseries",
                """SELECT r.bucket_start AS time, r.device || '/' || r.port || ' '
       || replace(r.metric, 'nic_rx_', '') AS metric, r.mean AS value
FROM metric_rollups r
WHERE r.metric IN ('nic_rx_crc_errors', 'nic_rx_symbol_errors', 'nic_rx_uncorrectable')
  AND $__timeFilter(r.bucket_start) AND r."""
                + FINEST
                + """
  AND (r.device, r.port) IN (
    SELECT device, port FROM metric_rollups
    WHERE metric IN ('nic_rx_crc_errors', 'nic_rx_symbol_errors', 'nic_rx_uncorrectable')
      AND $__timeFilter(bucket_start) AND mean > 0
    GROUP BY device, port ORDER BY max(mean) DESC LIMIT 10)
ORDER BY 1, 2""",
                12,
                0,
                12,
                8,
            ),
            panel(
                "Pre-FEC bit error rate per NIC (corrected bits / (speed x time))",
                "timeseries",
                """SELECT c.bucket_start AS time, c.device || '/' || c.port AS metric,
       c.mean / (s.last * 1e6) AS value
FROM metric_rollups c
JOIN metric_rollups s ON s.bucket_start = c.bucket_start AND s.resolution_s = c.resolution_s
  AND s.device = c.device AND s.port = c.port AND s.metric = 'nic_link_speed_mbps'
  AND s.last > 0
WHERE c.metric = 'nic_rx_corrected_bits' AND $__timeFilter(c.bucket_start) AND c."""
                + FINEST
                + """
  AND (c.device, c.port) IN (
    SELECT device, port FROM metric_rollups
    WHERE metric = 'nic_rx_corrected_bits' AND $__timeFilter(bucket_start)
    GROUP BY device, port ORDER BY max(mean) DESC LIMIT 10)
ORDER BY 1, 2""",
                0,
                8,
                12,
                8,
                unit="sci",
            ),
            panel(
                "Link flaps (carrier transitions, PHY link-down events)",
                "timeseries",
                """SELECT bucket_start AS time, device || '/' || port AS metric, mean AS value
FROM metric_rollups
WHERE metric IN ('port_carrier_transitions', 'nic_link_down_events')
  AND $__timeFilter(bucket_start) AND """
                + FINEST
                + """
  AND (device, port) IN (
    SELECT device, port FROM metric_rollups
    WHERE metric IN ('port_carrier_transitions', 'nic_link_down_events')
      AND $__timeFilter(bucket_start) AND mean > 0 GROUP BY device, port)
ORDER BY 1, 2""",
                12,
                8,
                12,
                8,
            ),
            panel("Flaky links", "table", alerts_table(["FlakyLink"]), 0, 16, 24, 8, fmt="table"),
        ],
        config_changes=True,
    )
    d["stragglers"] = dashboard(
        "rw-stragglers",
        "rocewatch: stragglers",
        [
            panel(
                "RDMA throughput relative to the fabric median (slowest NICs)",
                "timeseries",
                """WITH tx AS (
  SELECT bucket_start, device, port, mean FROM metric_rollups
  WHERE metric = 'nic_tx_rdma_bytes' AND $__timeFilter(bucket_start) AND """
                + FINEST
                + """
), med AS (
  SELECT bucket_start, percentile_cont(0.5) WITHIN GROUP (ORDER BY mean) AS m
  FROM tx GROUP BY bucket_start
), slow AS (
  SELECT tx.device, tx.port FROM tx JOIN med USING (bucket_start) WHERE med.m > 0
  GROUP BY tx.device, tx.port ORDER BY avg(tx.mean / med.m) LIMIT 8
)
SELECT tx.bucket_start AS time, tx.device || '/' || tx.port AS metric, tx.mean / med.m AS value
FROM tx JOIN med USING (bucket_start) JOIN slow USING (device, port)
WHERE med.m > 0
ORDER BY 1, 2""",
                0,
                0,
                24,
                9,
                unit="percentunit",
            ),
            panel(
                "NICs whose PCIe link is below its maximum",
                "table",
                """SELECT cur.device AS node, cur.port AS nic,
       min(cur.last) AS "speed GT/s", max(mx.last) AS "max GT/s",
       min(w.last) AS "width", max(mw.last) AS "max width",
       min(cur.bucket_start) AS "first seen", max(cur.bucket_start) AS "last seen"
FROM metric_rollups cur
JOIN metric_rollups mx ON mx.bucket_start = cur.bucket_start
  AND mx.resolution_s = cur.resolution_s AND mx.device = cur.device AND mx.port = cur.port
  AND mx.metric = 'nic_pcie_max_speed_gts'
LEFT JOIN metric_rollups w ON w.bucket_start = cur.bucket_start
  AND w.resolution_s = cur.resolution_s AND w.device = cur.device AND w.port = cur.port
  AND w.metric = 'nic_pcie_width'
LEFT JOIN metric_rollups mw ON mw.bucket_start = cur.bucket_start
  AND mw.resolution_s = cur.resolution_s AND mw.device = cur.device AND mw.port = cur.port
  AND mw.metric = 'nic_pcie_max_width'
WHERE cur.metric = 'nic_pcie_speed_gts' AND $__timeFilter(cur.bucket_start)
  AND (cur.min < mx.last OR w.min < mw.last)
GROUP BY 1, 2
ORDER BY 1, 2""",
                0,
                9,
                12,
                8,
                fmt="table",
            ),
            panel(
                "Straggler and PCIe alerts",
                "table",
                alerts_table(["Straggler", "PCIeDowngrade"]),
                12,
                9,
                12,
                8,
                fmt="table",
            ),
        ],
    )
    d["alerts-actions"] = dashboard(
        "rw-alerts",
        "rocewatch: alerts and actions",
        [
            panel(
                "Alerts timeline",
                "state-timeline",
                f"""SELECT t AS time, alertname || ' ' || entity AS metric, v AS value FROM (
  SELECT starts_at AS t, alertname, {ENTITY} AS entity, 1 AS v FROM alerts
  UNION ALL
  SELECT ends_at, alertname, {ENTITY}, 0 FROM alerts WHERE ends_at IS NOT NULL
) x
WHERE t <= $__timeTo() AND t >= $__timeFrom()
ORDER BY 1, 2""",
                0,
                0,
                24,
                12,
                mergeValues=True,
                showValue="never",
            ),
            panel(
                "Alerts",
                "table",
                alerts_table(list(ALERTNAMES)),
                0,
                12,
                24,
                10,
                fmt="table",
            ),
            panel(
                "Drain and resume decisions",
                "table",
                """SELECT time, action, node, scheduler, executed, outcome, reason,
       alert_fingerprint
FROM actions WHERE $__timeFilter(time) ORDER BY time DESC""",
                0,
                22,
                24,
                8,
                fmt="table",
            ),
            panel(
                "Decisions per minute, by outcome",
                "timeseries",
                "SELECT $__timeGroupAlias(time, '1m'), action || ': ' || outcome AS metric, "
                "count(*) AS value FROM actions WHERE $__timeFilter(time) "
                "GROUP BY 1, 2 ORDER BY 1",
                0,
                30,
                24,
                8,
            ),
        ],
    )
    d["incident"] = incident_dashboard()
    d["nccl-jobs"] = nccl_dashboard(DS, FINEST, panel, dashboard)
    return d


# --- the incident dashboard: the pause graph of one incident (storage/incidents.py) ----------
# An incident shows while the dashboard's range overlaps it (so a range without it is empty).
IN_RANGE = (
    "i.id = $incident AND i.started_at <= $__timeTo() "
    "AND coalesce(i.ended_at, $__timeTo()) >= $__timeFrom()"
)
NODE_COLOR = """CASE n.kind WHEN 'origin' THEN '#d62728' WHEN 'end' THEN '#d62728'
         WHEN 'victim' THEN '#ff7f0e' WHEN 'entity' THEN '#ff7f0e' WHEN 'job' THEN '#1f77b4'
         WHEN 'host' THEN '#9467bd' ELSE '#7f7f7f' END"""
# Grafana's Node graph reads a "nodes" and an "edges" frame by these field names (its data API):
# nodes id, title, subtitle, mainstat, secondarystat, arc__* (fractions summing to 1),
# detail__*, color; edges id, source, target, mainstat, thickness, color
NODES_SQL = f"""SELECT n.node_id AS id,
       n.title AS title,
       n.kind || CASE WHEN n.subtitle <> '' THEN ': ' || n.subtitle ELSE '' END AS subtitle,
       round((n.share * 100)::numeric, 1) AS mainstat,
       coalesce(to_char(n.first_paused AT TIME ZONE 'UTC', 'HH24:MI:SS.MS'), '') AS secondarystat,
       coalesce(n.share, 0) AS arc__paused,
       1 - coalesce(n.share, 0) AS arc__unpaused,
       n.kind AS detail__kind,
       coalesce(to_char(n.first_paused AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"'), '')
         AS detail__first_paused,
       coalesce(array_to_string(ARRAY(
         SELECT jsonb_array_elements_text(CASE WHEN jsonb_typeof(n.detail->'ports') = 'array'
                                          THEN n.detail->'ports' ELSE '[]'::jsonb END)), ', '), '')
         AS detail__ports,
       {NODE_COLOR} AS color
FROM incident_nodes n JOIN incidents i ON i.id = n.incident_id
WHERE {IN_RANGE}
ORDER BY n.id"""
EDGES_SQL = f"""SELECT e.edge_id AS id, e.source AS source, e.target AS target,
       e.kind || coalesce(' ' || round((e.share * 100)::numeric, 1) || '%', '') AS mainstat,
       1 + 4 * coalesce(e.share, 0.2) AS thickness,
       CASE e.kind WHEN 'pauses' THEN '#d62728' WHEN 'cable' THEN '#d62728'
         WHEN 'runs' THEN '#1f77b4' ELSE '#9467bd' END AS color
FROM incident_edges e JOIN incidents i ON i.id = e.incident_id
WHERE {IN_RANGE}
ORDER BY e.id"""
TIMELINE_SQL = f"""SELECT ev.time AS "time", ev.kind AS what, ev.summary,
       coalesce(ev.detail->'alert'->'annotations'->>'evidence', '') AS evidence
FROM incident_events ev JOIN incidents i ON i.id = ev.incident_id
WHERE {IN_RANGE}
ORDER BY ev.time, ev.id"""
# a node's own series: pause (received and sent) and ECN marking of the entity a node of the
# graph stands for (a NIC "node/nic", a switch port, or every port of a switch), $entity being
# set by the node's data link
ENTITY_SERIES_SQL = f"""SELECT bucket_start AS time,
       device || '/' || port || CASE WHEN qual <> '' THEN ' p' || qual ELSE '' END || ' '
         || metric AS metric,
       mean AS value
FROM metric_rollups
WHERE metric IN ('pfc_rx_pause_us', 'pfc_tx_pause_us', 'nic_rx_pause_us', 'nic_tx_pause_us',
                 'queue_ecn_marked_pkts', 'nic_ecn_marked_pkts')
  AND $__timeFilter(bucket_start) AND {FINEST}
  AND (device || '/' || port = '$entity' OR device = '$entity')
  AND (device, port, qual, metric) IN (
    SELECT device, port, qual, metric FROM metric_rollups
    WHERE $__timeFilter(bucket_start) AND (device || '/' || port = '$entity' OR device = '$entity')
    GROUP BY 1, 2, 3, 4 ORDER BY max(mean) DESC LIMIT 20)
ORDER BY 1, 2"""
INCIDENT_VAR_SQL = """SELECT id AS __value,
       '#' || id || ' ' || status || ': ' || title AS __text
FROM incidents
WHERE started_at <= $__timeTo() AND (ended_at IS NULL OR ended_at >= $__timeFrom())
ORDER BY (status = 'open') DESC, started_at DESC"""


def incident_dashboard() -> dict[str, Any]:
    graph = panel("Pause graph", "nodeGraph", NODES_SQL, 0, 0, 24, 16, fmt="table")
    graph["targets"][0]["refId"] = "nodes"
    graph["targets"].append({**graph["targets"][0], "refId": "edges", "rawSql": EDGES_SQL})
    links = [  # from a node to the series that show it
        {"title": "Pause and ECN of this node",
         "url": "/d/rw-incident?var-incident=${incident}&var-entity=${__data.fields.title}"
                "&${__url_time_range}"},
        {"title": "Pause time (PFC dashboard)", "url": "/d/rw-pfc?${__url_time_range}"},
        {"title": "ECN and CNP (congestion dashboard)",
         "url": "/d/rw-congestion?${__url_time_range}"},
    ]  # fmt: skip
    graph["fieldConfig"]["overrides"] = [
        {"matcher": {"id": "byName", "options": "arc__paused"},
         "properties": [{"id": "color", "value": {"mode": "fixed", "fixedColor": "red"}},
                        {"id": "displayName", "value": "paused"}]},
        {"matcher": {"id": "byName", "options": "arc__unpaused"},
         "properties": [{"id": "color", "value": {"mode": "fixed", "fixedColor": "green"}},
                        {"id": "displayName", "value": "not paused"}]},
        {"matcher": {"id": "byName", "options": "mainstat"},
         "properties": [{"id": "unit", "value": "percent"},
                        {"id": "displayName", "value": "pause share"}]},
        {"matcher": {"id": "byName", "options": "id"},
         "properties": [{"id": "links", "value": links}]},
    ]  # fmt: skip
    series_panel = panel(
        "Pause and ECN of $entity (click a node of the graph)", "timeseries",
        ENTITY_SERIES_SQL, 0, 16, 24, 8,
    )  # fmt: skip
    timeline = panel("Timeline", "table", TIMELINE_SQL, 0, 24, 24, 10, fmt="table")
    d = dashboard("rw-incident", "rocewatch: incident", [graph, series_panel, timeline], hours=24)
    d["templating"] = {
        "list": [
            {
                "name": "incident",
                "label": "Incident",
                "type": "query",
                "datasource": DS,
                "query": INCIDENT_VAR_SQL,
                "definition": INCIDENT_VAR_SQL,
                "refresh": 2,  # on a time range change
                "includeAll": False,
                "multi": False,
                "sort": 0,
            },
            {
                "name": "entity",
                "label": "Entity",
                "type": "textbox",
                "query": "",
                "current": {"text": "", "value": ""},
            },
        ]
    }
    return d


def write(out: Path = OUT) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, dash in build().items():
        p = out / f"{name}.json"
        p.write_text(json.dumps(dash, indent=2) + "\n")
        paths.append(p)
    return paths


if __name__ == "__main__":
    for p in write():
        print(p)
