"""NCCL RAS (``ncclras -f json``) -> the ranks a communicator is missing.

The RAS client prints one JSON document: ``nccl_version``, ``timestamp`` (local time,
``%Y-%m-%d %H:%M:%S``), ``communicators`` (each with ``hash``, ``size``, ``ranks_count``,
``missing_ranks_count``, ``ranks`` and ``missing_ranks``; a missing rank has ``rank``,
``host`` (an IP address as RAS knows its peers), ``pid``, ``cuda_dev``, ``nvml_dev`` and
``status`` ``{"unresponsive": bool, "considered_dead": bool}``) and ``ras``
(``collection_time_sec``, ``timeouts_count``).

Each missing rank becomes one ``nccl_rank_missing`` sample: device its host, port
``rank<r>``, qual the communicator hash, value 1 when RAS considers it dead, 0.5 when it only
does not answer. A document that is not JSON or not of this shape is counted
(``nccl_ras_malformed``); so is a communicator or rank entry of the wrong shape.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson
import polars as pl

from rocewatch.core.model import SAMPLE_SCHEMA, empty_samples
from rocewatch.core.stats import Stats


@dataclass(frozen=True)
class MissingRank:
    comm: str
    size: int
    rank: int
    host: str
    pid: int
    cuda_dev: int
    dead: bool
    unresponsive: bool


def parse_ras(doc: bytes, stats: Stats | None = None) -> list[MissingRank]:
    stats = stats or Stats()
    try:
        d = orjson.loads(doc)
    except orjson.JSONDecodeError:
        stats.inc("nccl_ras_malformed", detail="not JSON")
        return []
    if not isinstance(d, dict) or not isinstance(d.get("communicators"), list):
        stats.inc("nccl_ras_malformed", detail="no communicators")
        return []
    out: list[MissingRank] = []
    for c in d["communicators"]:
        if not isinstance(c, dict) or not isinstance(c.get("hash"), str):
            stats.inc("nccl_ras_malformed", detail="communicator")
            continue
        for m in c.get("missing_ranks") or []:
            r = _missing(c, m)
            if r is None:
                stats.inc("nccl_ras_malformed", detail="missing rank")
                continue
            out.append(r)
    return out


def _missing(c: dict[str, Any], m: Any) -> MissingRank | None:
    if not isinstance(m, dict) or type(m.get("rank")) is not int:
        return None
    raw = m.get("status")
    st: dict[str, Any] = raw if isinstance(raw, dict) else {}
    return MissingRank(
        comm=c["hash"],
        size=int(c["size"]) if type(c.get("size")) is int else 0,
        rank=m["rank"],
        host=str(m.get("host", "unknown")),
        pid=int(m["pid"]) if type(m.get("pid")) is int else -1,
        cuda_dev=int(m["cuda_dev"]) if type(m.get("cuda_dev")) is int else -1,
        dead=st.get("considered_dead") is True,
        unresponsive=st.get("unresponsive") is True,
    )


def ras_samples(missing: list[MissingRank], ts: int) -> pl.DataFrame:
    if not missing:
        return empty_samples()
    return pl.DataFrame(
        {
            "ts": [ts] * len(missing),
            "device": [m.host for m in missing],
            "port": [f"rank{m.rank}" for m in missing],
            "qual": [m.comm for m in missing],
            "metric": ["nccl_rank_missing"] * len(missing),
            "value": [1.0 if m.dead else 0.5 for m in missing],
            "raw": [None] * len(missing),
        },
        schema=SAMPLE_SCHEMA,
    )
