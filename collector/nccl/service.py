"""``rocewatch nccl-collect``: follow one job's Inspector directory and publish its telemetry.

Every ``interval_s`` the collector reads what the job's Inspector files gained
(``InspectorTail``), re-reads the job's ``NCCL_DEBUG=INFO`` logs (``debug/<host>.log`` under
the directory, or ``--debug-dir``), lays the ranks seen over the job's join (``RankJoin``:
a restart replaces the map) and hands the samples, with the join's ``nccl_rank_gpu`` samples
whenever the map changed, to its output (collector.output: Kafka's telemetry topic, a file or
stdout). When it stops it judges the collectives still waiting and sends them too. Beside
Inspector's NDJSON it follows the job's CoMMA exports (``comma/*.jsonl`` under the directory,
or ``comma_dir``), Inspector's Prometheus textfiles (``*.prom`` in the directory, or
``prom_dir``) and, when given, a file of ``ncclras -f json`` output (collector/nccl/follow.py);
their samples go to the same output.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path

import polars as pl

from collector.nccl.debug import DebugLog
from collector.nccl.follow import CommaTail, PromTextfiles, RasFile
from collector.nccl.join import RankJoin
from collector.nccl.tail import InspectorTail
from collector.output import Output
from rocewatch.core.stats import Stats
from rocewatch.core.topology import Topology

log = logging.getLogger(__name__)


class NcclCollector:
    def __init__(
        self,
        directory: Path,
        job: str,
        topology: Topology | None,
        sink: Output[pl.DataFrame],
        debug_dir: Path | None = None,
        stats: Stats | None = None,
        comma_dir: Path | None = None,
        prom_dir: Path | None = None,
        ras_file: Path | None = None,
    ) -> None:
        self.job = job
        self.sink = sink
        self.stats = stats or Stats()
        self.tail = InspectorTail(directory, topology, self.stats)
        self.debug_dir = debug_dir or directory / "debug"
        self.join = RankJoin(topology)
        self._placed: dict[object, object] = {}
        self.sent = 0
        self.debug = DebugLog(self.stats)
        self._debug_read: dict[str, int] = {}  # debug log -> bytes of whole lines read
        # the job's other outputs (collector/nccl/follow.py): CoMMA's exports where a recording
        # keeps them, Inspector's Prometheus textfiles beside its NDJSON, RAS when given
        self.comma = CommaTail(comma_dir or directory / "comma", topology, self.stats)
        self.prom = PromTextfiles(prom_dir or directory, topology, self.stats)
        self.ras = RasFile(ras_file, self.stats) if ras_file is not None else None

    def _debug(self) -> DebugLog:
        """The debug logs' new whole lines laid over what was read before."""
        for p in sorted(self.debug_dir.glob("*.log")) if self.debug_dir.is_dir() else []:
            at = self._debug_read.get(p.name, 0)
            with p.open("rb") as fh:
                if fh.seek(0, 2) < at:  # rewritten: read it again
                    at = 0
                fh.seek(at)
                data = fh.read()
            cut = data.rfind(b"\n") + 1
            self.debug.lines(data[:cut].splitlines())
            self._debug_read[p.name] = at + cut
        return self.debug

    def poll(self, final: bool = False) -> int:
        """One round: read, join, send. Returns the samples sent."""
        df = self.tail.poll()
        if final:
            df = pl.concat([df, self.tail.finish()])
        frames = []
        ranks = self.tail.decoder.ranks
        if ranks:
            self.join.update(self.job, dict(ranks), self._debug())
            now = dict(self.join.jobs.get(self.job, {}))
            if now != self._placed and df.height:
                self._placed = now  # type: ignore[assignment]
                frames.append(self.join.samples(int(df["ts"].min())))  # type: ignore[arg-type]
        frames.append(df)
        frames.append(self.comma.finish() if final else self.comma.poll())
        frames.append(self.prom.poll(final))
        if self.ras is not None:
            frames.append(self._ras_hosts(self.ras.poll()))
        out = pl.concat([f for f in frames if f.height]) if any(f.height for f in frames) else df
        if out.height:
            self.sink(out.sort("ts"))
            self.sent += out.height
        return int(out.height)

    def _ras_hosts(self, df: pl.DataFrame) -> pl.DataFrame:
        """RAS names a missing rank's host by its address: where the join places that rank of
        that communicator, the rank's host (the topology's node) replaces it."""
        if not df.height:
            return df
        hosts = []
        for dev, port, comm in df.select("device", "port", "qual").iter_rows():
            place = self.join.place(self.job, comm, int(port.removeprefix("rank")))
            hosts.append(place.host if place is not None else dev)
        return df.with_columns(pl.Series("device", hosts, dtype=df.schema["device"]))

    def run(
        self,
        interval_s: float,
        stop: threading.Event,
        duration_s: float = 0.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        end = clock() + duration_s if duration_s > 0 else None
        while not stop.is_set() and (end is None or clock() < end):
            self.poll()
            stop.wait(interval_s)
        self.poll(final=True)

    def close(self) -> None:
        self.tail.close()
        self.comma.close()
