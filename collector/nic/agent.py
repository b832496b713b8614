"""The node agent: samples every NIC of a GPU node and ships snapshots (docs/formats.md section 3).

Per RDMA device (``<sysfs>/class/infiniband/*``, or the ``nics`` configured) one snapshot holds
the netdev's ``ethtool -S`` counters (the ioctl by default), the device's ``hw_counters`` and
port ``counters`` (as ``port_counters``), PCIe current/max speed and width, the netdev's link
speed and, every ``mlxlink_interval_s`` when the tool exists, ``mlxlink`` BERs. ``netdevs`` adds
plain interfaces that have no RDMA device (their snapshot's ``nic`` is the netdev's name).

Sampling and sending are separate threads joined by a bounded on-disk ``Spool``: samples keep
their cadence (down to 100 ms) while the broker is away, and reach it in order when it returns.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from collector.nic.config import AgentConfig
from collector.nic.ethtool import EthtoolError, EthtoolReader, ethtool_s_command
from collector.nic.mlxlink import mlxlink_path, read_mlxlink
from collector.nic.roce_config import ConfigWatcher
from collector.nic.spool import Spool
from collector.nic.sysfs import AttrFiles, RdmaDevice, netdev_speed, rdma_devices
from rocewatch.core.errors import ConfigError, RetryableError
from rocewatch.core.stats import Stats

if TYPE_CHECKING:
    from rocewatch.core.metrics import Reading

log = logging.getLogger(__name__)
__all__ = ["AgentConfig", "NicAgent"]

SendLines = Callable[[list[bytes]], None]  # an output (collector.output) or a test's list


class _Nic:
    """What one snapshot is read from."""

    def __init__(self, nic: str, netdev: str | None, rdma: RdmaDevice | None) -> None:
        self.nic = nic
        self.netdev = netdev
        self.rdma = rdma
        self.ethtool: EthtoolReader | None = None
        self.ethtool_failed_at = -1e18


class NicAgent:
    """Samples the node's NICs into snapshot dicts; ``run`` ships them through a spool."""

    ETHTOOL_RETRY_S = 30.0

    def __init__(
        self,
        cfg: AgentConfig,
        stats: Stats | None = None,
        clock: Callable[[], int] = time.time_ns,
    ) -> None:
        cfg.validate()
        self.cfg = cfg
        self.node = cfg.node_name()
        self.stats = stats or Stats()
        self.clock = clock
        self.root = Path(cfg.sysfs_root)
        self.files = AttrFiles()
        self.mlxlink = mlxlink_path() if cfg.mlxlink == "auto" else None
        self._mlx_due = 0.0
        self.nics: list[_Nic] = []
        for name in cfg.nics or tuple(rdma_devices(self.root)):
            dev = RdmaDevice(self.root, name, self.files)
            if dev.port is None and not dev.base.exists():
                raise ConfigError(f"agent: no RDMA device {name} under {self.root}")
            self.nics.append(_Nic(name, dev.netdevs[0] if dev.netdevs else None, dev))
        for nd in cfg.netdevs:
            if not (self.root / "class" / "net" / nd).exists():
                raise ConfigError(f"agent: no netdev {nd} under {self.root}/class/net")
            self.nics.append(_Nic(nd, nd, None))
        if not self.nics:
            raise ConfigError(f"agent: no RDMA device under {self.root} and no netdevs configured")
        self.samples = 0
        # RoCE configuration snapshots (nic_config.jsonl lines), when an output is given
        self.config_watch: ConfigWatcher | None = None
        self.config_out: SendLines | None = None

    def watch_config(self, out: SendLines, interval_s: float = 60.0, check_s: float = 5.0) -> None:
        """Also send each NIC's RoCE configuration to ``out``: at start, every ``interval_s``,
        and at once when sysfs shows a change (collector/nic/roce_config.py)."""
        self.config_watch = ConfigWatcher(
            self.node,
            [(n.nic, n.netdev) for n in self.nics],
            self.root,
            interval_s=interval_s,
            check_s=check_s,
            clock=self.clock,
        )
        self.config_out = out

    def _config_loop(self, done: threading.Event) -> None:
        while True:
            try:
                self._config_tick()
            except OSError as e:  # a write that failed: counted, tried again next time
                self.stats.inc("agent_config_errors", detail=str(e))
            if done.wait(1.0):
                return

    def _config_tick(self) -> None:
        if self.config_watch is None or self.config_out is None:
            return
        lines = self.config_watch.lines()
        if lines:
            self.config_out(lines)
            self.stats.inc("agent_config_snapshots", len(lines))

    # --- sampling ------------------------------------------------------------------------------
    def _ethtool(self, n: _Nic) -> dict[str, int] | None:
        if n.netdev is None or self.cfg.ethtool == "off":
            return None
        if self.cfg.ethtool == "command":
            try:
                return ethtool_s_command(n.netdev)
            except EthtoolError as e:
                self.stats.inc("agent_ethtool_errors", detail=f"{n.netdev}: {e}")
                return None
        now = time.monotonic()
        try:
            if n.ethtool is None:
                if now - n.ethtool_failed_at < self.ETHTOOL_RETRY_S:
                    return None
                n.ethtool = EthtoolReader(n.netdev)
            return n.ethtool.read()
        except EthtoolError as e:
            self.stats.inc("agent_ethtool_errors", detail=f"{n.netdev}: {e.strerror or e}")
            if n.ethtool is not None:
                n.ethtool.close()
            n.ethtool, n.ethtool_failed_at = None, now
            return None

    def snapshot(self, n: _Nic, with_mlxlink: bool = False) -> dict[str, Any]:
        snap: dict[str, Any] = {"timestamp": self.clock(), "node": self.node, "nic": n.nic}
        if n.netdev:
            snap["netdev"] = n.netdev
            speed = netdev_speed(self.root, n.netdev, self.files)
            if speed is not None:
                snap["speed_mbps"] = speed
        eth = self._ethtool(n)
        if eth is not None:
            snap["ethtool"] = eth
        if n.rdma is not None:
            hw = n.rdma.hw_counters()
            if hw:
                snap["hw_counters"] = hw
            pc = n.rdma.port_counters()
            if pc:
                snap["port_counters"] = pc
            pcie = n.rdma.pcie()
            if pcie:
                snap["pcie"] = pcie
            if with_mlxlink and self.mlxlink:
                try:
                    ber = read_mlxlink(self.mlxlink, n.nic)
                except (OSError, ValueError) as e:
                    self.stats.inc("agent_mlxlink_errors", detail=str(e))
                    ber = {}
                if ber:
                    snap["mlxlink"] = ber
        return snap

    def sample(self) -> list[dict[str, Any]]:
        """One snapshot of every NIC."""
        now = time.monotonic()
        mlx = self.mlxlink is not None and now >= self._mlx_due
        if mlx:
            self._mlx_due = now + self.cfg.mlxlink_interval_s
        out = [self.snapshot(n, mlx) for n in self.nics]
        self.samples += 1
        return out

    def sample_lines(self) -> list[bytes]:
        return [orjson.dumps(s) + b"\n" for s in self.sample()]

    # --- shipping ------------------------------------------------------------------------------
    def run(
        self,
        sink: SendLines,
        stop: threading.Event,
        duration_s: float = 0.0,
        drain_timeout_s: float = 10.0,
    ) -> None:
        """Sample every ``interval_s`` into the spool while a thread sends it to ``sink``.

        Stops when ``stop`` is set or after ``duration_s`` (0: never); then sends what is left
        for up to ``drain_timeout_s`` (the rest stays spooled for the next start).
        """
        spool = Spool(self.cfg.spool_dir, self.cfg.spool_max_bytes, self.cfg.spool_segment_bytes)
        self.spool = spool
        sampling_done = threading.Event()
        sender = threading.Thread(
            target=self._send_loop,
            args=(spool, sink, sampling_done, drain_timeout_s),
            name="agent-sender",
        )
        sender.start()
        # configuration reads fork dcb and ethtool: a thread of their own keeps the cadence
        config = None
        if self.config_watch is not None:
            config = threading.Thread(
                target=self._config_loop, args=(sampling_done,), name="agent-config", daemon=True
            )
            config.start()
        interval = self.cfg.interval_s
        t0 = time.monotonic()
        k = 0
        try:
            while not stop.is_set():
                if duration_s and time.monotonic() - t0 >= duration_s:
                    break
                spool.append(self.sample_lines())
                k += 1
                late = time.monotonic() - (t0 + k * interval)
                if late > 0:  # fell behind: skip the missed ticks rather than burst
                    skipped = int(late // interval) + 1
                    self.stats.inc("agent_missed_intervals", skipped)
                    k += skipped
                stop.wait(max(0.0, t0 + k * interval - time.monotonic()))
        finally:
            sampling_done.set()
            spool.ready.set()
            sender.join()
            if config is not None:
                config.join()
            spool.close()
            if spool.dropped:
                self.stats.inc("agent_spool_dropped", spool.dropped)

    def _send_loop(
        self, spool: Spool, sink: SendLines, done: threading.Event, drain_timeout_s: float
    ) -> None:
        backoff = 0.2
        drain_until: float | None = None
        while True:
            if done.is_set() and drain_until is None:
                drain_until = time.monotonic() + drain_timeout_s
            if drain_until is not None and time.monotonic() >= drain_until:
                return
            got = spool.oldest()
            if got is None:
                if done.is_set():
                    return
                spool.ready.wait(self.cfg.interval_s)
                continue
            seg, lines = got
            try:
                sink(lines)
            except RetryableError as e:
                spool.release(seg)
                self.stats.inc("agent_send_failures", detail=type(e).__name__)
                log.debug("send failed, %d snapshots spooled: %s", spool.pending()[0], e)
                time.sleep(backoff)
                backoff = min(5.0, backoff * 2)
                continue
            spool.ack(seg)
            self.stats.inc("agent_snapshots_sent", len(lines))
            backoff = 0.2

    def readings(self) -> list[Reading]:
        """The agent's /metrics, read at scrape time."""
        # here, not at the top: the Prometheus client is only needed when /metrics is served
        from rocewatch.core.metrics import skipped_readings

        sent = self.stats.get("agent_snapshots_sent")
        spool = getattr(self, "spool", None)
        pending, size = spool.pending() if spool is not None else (0, 0)
        dropped = (spool.dropped if spool is not None else 0) + self.stats.get(
            "agent_spool_dropped"
        )
        node = {"node": self.node}
        return [
            (
                "rocewatch_agent_samples_total",
                "counter",
                "sampling rounds (a snapshot of every NIC each)",
                node,
                self.samples,
            ),
            ("rocewatch_agent_snapshots_sent_total", "counter", "snapshots delivered", node, sent),
            (
                "rocewatch_agent_send_failures_total",
                "counter",
                "failed sends (the snapshots stay spooled)",
                node,
                self.stats.get("agent_send_failures"),
            ),
            ("rocewatch_agent_spool_snapshots", "gauge", "snapshots waiting", node, pending),
            ("rocewatch_agent_spool_bytes", "gauge", "bytes waiting in the spool", node, size),
            (
                "rocewatch_agent_spool_dropped_total",
                "counter",
                "snapshots deleted unsent because the spool was full",
                node,
                dropped,
            ),
            ("rocewatch_agent_nics", "gauge", "NICs sampled", node, len(self.nics)),
            *skipped_readings(self.stats),
        ]

    def close(self) -> None:
        for n in self.nics:
            if n.ethtool is not None:
                n.ethtool.close()
        self.files.close()
