"""``NCCL_DEBUG=INFO`` output: which NIC each process (so each rank) sends through.

NCCL prefixes every line with ``<host>:<pid>:<tid> [<cudaDev>] NCCL INFO``. Three lines make
the map (others are ignored):

- ``NET/IB : Using [0]mlx5_0:1/RoCE [1]mlx5_1:1/RoCE [RO]; OOB eth0:10.0.0.1<0>``: the
  process's network devices by NCCL's index (``[i]<dev>:<port>/<IB|RoCE>``).
- ``Channel 00/0 : 0[0] -> 8[0] [send] via NET/IB/0`` (``[receive]`` too; newer NCCL appends
  ``/GDRDMA`` and the like): the rank on the left of ``->`` for a send (on the right for a
  receive) is this process's, and ``NET/IB/<i>`` is the device index it uses.
- ``comm 0x55d0c8a0 rank 3 nranks 16 cudaDev 3 nvmlDev 3 busId 1b000 commId 0x7f8c496ae9f661 -
  Init COMPLETE``: the process's rank and CUDA device in the communicator ``commId`` (the hash
  Inspector's ``header.id`` shows).

Lines that do not parse are counted (``nccl_debug_unparsed``) only when they look like one of
these three; everything else NCCL prints is left alone.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

from rocewatch.core.stats import Stats

_PREFIX = re.compile(rb"^(?P<host>[^\s:]+):(?P<pid>\d+):(?P<tid>\d+) \[(?P<dev>\d+)\] NCCL INFO ")
_USING = re.compile(rb"NET/(?P<net>\w+) ?: Using (?P<devs>(?:\[\d+\][^\s;]+\s*)+)")
_DEV = re.compile(rb"\[(?P<i>\d+)\](?P<name>[^:\s;]+)(?::(?P<port>\d+))?(?:/(?P<link>\w+))?")
_CHANNEL = re.compile(
    rb"Channel (?P<ch>\d+)/(?P<conn>\d+) : (?P<a>\d+)\[(?P<adev>[0-9a-fA-F]+)\] -> "
    rb"(?P<b>\d+)\[(?P<bdev>[0-9a-fA-F]+)\] \[(?P<dir>send|receive)\] via NET/(?P<net>\w+)/"
    rb"(?P<idx>\d+)"
)
_INIT = re.compile(
    rb"comm (?P<ptr>0x[0-9a-fA-F]+) rank (?P<rank>\d+) nranks (?P<n>\d+) cudaDev (?P<cuda>\d+)"
    rb".*?commId (?P<comm>0x[0-9a-fA-F]+) - Init COMPLETE"
)


@dataclass
class Process:
    """What NCCL_DEBUG says of one process (``host``, ``pid``)."""

    host: str
    pid: int
    cuda_dev: int | None = None
    net_devs: dict[int, str] = field(default_factory=dict)  # NCCL's index -> RDMA device
    link: dict[int, str] = field(default_factory=dict)  # index -> "RoCE" | "IB"
    used: Counter[int] = field(default_factory=Counter)  # device index -> channel connections
    ranks: dict[str, int] = field(default_factory=dict)  # commId -> rank

    def nic(self) -> str | None:
        """The device its channels use most (a rail-optimised rank uses one)."""
        if not self.used:
            return self.net_devs[0] if len(self.net_devs) == 1 else None
        idx = self.used.most_common(1)[0][0]
        return self.net_devs.get(idx)


class DebugLog:
    """NCCL_DEBUG=INFO lines -> ``processes[(host, pid)]``."""

    def __init__(self, stats: Stats | None = None) -> None:
        self.stats = stats or Stats()
        self.processes: dict[tuple[str, int], Process] = {}

    def lines(self, lines: Iterable[bytes]) -> None:
        for line in lines:
            m = _PREFIX.match(line)
            if m is None:
                continue
            host, pid = m["host"].decode(), int(m["pid"])
            p = self.processes.get((host, pid))
            if p is None:
                p = self.processes[(host, pid)] = Process(host, pid)
            p.cuda_dev = int(m["dev"])
            rest = line[m.end() :]
            if b"Using [" in rest:
                u = _USING.search(rest)
                if u is None:
                    self.stats.inc("nccl_debug_unparsed", detail="NET Using")
                    continue
                for d in _DEV.finditer(u["devs"]):
                    i = int(d["i"])
                    p.net_devs[i] = d["name"].decode()
                    if d["link"]:
                        p.link[i] = d["link"].decode()
            elif rest.startswith(b"Channel ") and b" via NET/" in rest:
                c = _CHANNEL.search(rest)
                if c is None:
                    self.stats.inc("nccl_debug_unparsed", detail="Channel via NET")
                    continue
                p.used[int(c["idx"])] += 1
            elif b"Init COMPLETE" in rest:
                ini = _INIT.search(rest)
                if ini is None:
                    self.stats.inc("nccl_debug_unparsed", detail="Init COMPLETE")
                    continue
                p.ranks[ini["comm"].decode()] = int(ini["rank"])
                p.cuda_dev = int(ini["cuda"])

    def read(self, path: str) -> None:
        with open(path, "rb") as fh:
            self.lines(fh)
