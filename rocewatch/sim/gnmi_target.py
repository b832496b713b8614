"""A gNMI target for the simulated fabric: a grpcio server implementing gNMI Subscribe, Get and
Capabilities.

It serves every switch of a ``Simulator`` on the OpenConfig paths of the mapping table
(interface counters, PFC per priority, egress queues) plus LLDP neighbours under
``/lldp/interfaces/interface/neighbors``. One server can serve many switches: a client names
the switch in the SubscribeRequest's ``prefix.target`` (as gNMI gateways expect); a server that
serves one switch also answers requests without a target.

Modes: STREAM (per subscription SAMPLE with ``sample_interval``, ON_CHANGE, TARGET_DEFINED =
SAMPLE for counters and ON_CHANGE for LLDP; ``suppress_redundant`` with ``heartbeat_interval``;
``updates_only``), ONCE and POLL. Get answers the current tick's values of the paths asked (the
fabric's clock starts with the first Subscribe stream; tick 0 before) as scalars for PROTO and as
``json_val`` for JSON / JSON_IETF, NOT_FOUND for a path or target it does not serve; CONFIG
data is empty (every leaf is state). TLS (optionally requiring client certificates) and
username/password metadata are optional.

Responses are wire-encoded once per switch and tick from precompiled path bytes and sent as
bytes (the generic handler's serializer is the identity), so the target costs little per update;
``PreEncodedFeed`` loops a few encoded ticks for benchmarks.

Pacing: ``pace=0`` streams the simulated ticks as fast as the client reads them; ``pace=x``
sends tick k at start + k x interval / x (1: real time; tests run faster than real time so that
every switch's stream stays within a tick of the others); ``wall_clock=True`` moves timestamps
to the wall clock (demo stack). A paced stream that subscribes late joins at the fabric's
current tick (``join_now``), as a switch serves its current counters; with ``join_now=False``
it starts from the first tick and catches up (tests that compare whole recordings).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import orjson
from pygnmi.spec.v080 import gnmi_pb2 as pb

from collector.gnmi.paths import flatten, parse_xpath
from collector.mapping import OPENCONFIG_PATH
from rocewatch.sim.simulator import SW_COUNTERS, SW_GAUGES, Simulator, Tick

log = logging.getLogger(__name__)

SYNC = b"\x18\x01"  # SubscribeResponse{sync_response: true}
_MAX_MSG = 64 << 20


def _varint(n: int) -> bytes:
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _ld(tag: int, body: bytes) -> bytes:
    """A length-delimited protobuf field."""
    return bytes((tag,)) + _varint(len(body)) + body


@dataclass
class Group:
    """One notification's worth of leaves under a keyed prefix (e.g. one port's counters)."""

    keyless: str  # "/interfaces/interface/state/counters"
    tags: dict[str, str]  # gnmic-style tags of the prefix keys
    prefix: bytes  # serialised gnmi.Path, the notification's prefix
    leaves: list[str]  # leaf paths relative to the prefix ("in-octets", "counters/in-pause-pkts")
    leaf_pre: list[bytes] = field(default_factory=list)  # encoded "path + val tag" per leaf
    strings: bool = False  # LLDP: string values

    def __post_init__(self) -> None:
        self.leaf_pre = [
            _ld(
                0x0A,
                pb.Path(elem=[pb.PathElem(name=n) for n in leaf.split("/")]).SerializeToString(),
            )
            + b"\x1a"
            for leaf in self.leaves
        ]

    def encode(
        self,
        ts: int,
        values: Sequence[Any],
        select: Sequence[int] | None = None,
        json_values: bool = False,
    ) -> bytes:
        """The SubscribeResponse bytes carrying ``values`` (all leaves, or ``select``); the same
        bytes are a GetResponse with this one notification (both messages' field 1).
        ``json_values``: TypedValue ``json_val`` instead of ``uint_val`` / ``string_val``."""
        parts = [b"\x08", _varint(ts), b"\x12", _varint(len(self.prefix)), self.prefix]
        idx = range(len(self.leaves)) if select is None else select
        pre = self.leaf_pre
        for i in idx:
            v = values[i]
            if json_values:
                j = orjson.dumps(str(v) if self.strings else int(v))
                tv = b"\x52" + _varint(len(j)) + j
            elif self.strings:
                s = str(v).encode()
                tv = b"\x0a" + _varint(len(s)) + s
            else:
                tv = b"\x18" + _varint(int(v))
            body = pre[i] + _varint(len(tv)) + tv
            parts += (b"\x22", _varint(len(body)), body)
        notif = b"".join(parts)
        return b"\x0a" + _varint(len(notif)) + notif


def _prefix(xpath: str, keys: dict[str, dict[str, str]]) -> tuple[bytes, str, dict[str, str]]:
    elems = []
    names = []
    for name, _ in parse_xpath(xpath):
        elems.append(pb.PathElem(name=name, key=keys.get(name, {})))
        names.append(name)
    path = pb.Path(elem=elems)
    keyless, tags = flatten(path, None)
    return path.SerializeToString(), keyless, tags


class FabricFeed:
    """Encoded responses of every switch of a simulated fabric, tick by tick.

    ``swaps`` lists pairs of "switch/port" whose LLDP neighbours are exchanged: a miscabling the
    topology does not know about.
    """

    KEEP_TICKS = 600

    def __init__(self, sim: Simulator, swaps: Sequence[tuple[str, str]] = ()) -> None:
        self.sim = sim
        fab = sim.fabric
        self.switches = list(fab.switches)
        self.n_ticks = sim.n_ticks
        self.interval_ns = sim.interval_ns
        self.start_ns = sim.cfg.start_ns
        prio = str(fab.priority)
        cols = [("c", i, m) for i, m in enumerate(SW_COUNTERS)]
        cols += [("g", i, m) for i, m in enumerate(SW_GAUGES)]
        # group the metrics by their prefix (the path up to and including "state")
        by_parent: dict[str, list[tuple[str, int, str]]] = {}
        for kind, i, m in cols:
            path = OPENCONFIG_PATH[m]
            head, _, tail = path.partition("/state/")
            by_parent.setdefault(head + "/state", []).append((kind, i, tail))
        self._layout = list(by_parent.items())
        self.groups: list[list[Group]] = [[] for _ in self.switches]
        self._cols: list[list[tuple[int, np.ndarray, np.ndarray]]] = [[] for _ in self.switches]
        self.lldp: list[list[tuple[Group, list[str]]]] = [[] for _ in self.switches]
        neighbours = self._neighbours(swaps)
        for p in range(fab.n_ports):
            s = int(fab.port_switch[p])
            port = fab.port_name[p]
            for parent, leaves in self._layout:
                keys: dict[str, dict[str, str]] = {"switch-priority": {"priority": prio}}
                keys["interface"] = (
                    {"name": port} if parent.startswith("/interfaces") else {"interface-id": port}
                )
                keys["queue"] = {"name": prio}
                pre, keyless, tags = _prefix(parent, keys)
                g = Group(keyless, tags, pre, [t for _, _, t in leaves])
                self.groups[s].append(g)
                ci = np.array([i for k, i, _ in leaves if k == "c"], dtype=int)
                gi = np.array([i for k, i, _ in leaves if k == "g"], dtype=int)
                self._cols[s].append((p, ci, gi))
            sys_name, port_id, descr, chassis = neighbours[p]
            pre, keyless, tags = _prefix(
                "/lldp/interfaces/interface/neighbors/neighbor/state",
                {"interface": {"name": port}, "neighbor": {"id": "1"}},
            )
            g = Group(
                keyless,
                tags,
                pre,
                ["system-name", "port-id", "port-description", "chassis-id"],
                strings=True,
            )
            self.lldp[s].append((g, [sys_name, port_id, descr, chassis]))
        self._ticks: dict[int, Tick] = {}
        self._next = 0
        self._steps: Iterator[Tick] | None = None
        self._lock = threading.Lock()

    def _neighbours(self, swaps: Sequence[tuple[str, str]]) -> list[tuple[str, str, str, str]]:
        fab = self.sim.fabric
        out: list[tuple[str, str, str, str]] = []
        for p in range(fab.n_ports):
            if p < fab.n_nics:  # leaf downlink: the NIC (lldpd on the host: ifname as port id)
                node = fab.nodes[int(fab.nic_node[p])]
                r = int(fab.nic_rail[p])
                mac = f"02:00:{(p >> 16) & 255:02x}:{(p >> 8) & 255:02x}:{p & 255:02x}:01"
                out.append((node, fab.rail_netdevs[r], fab.rail_nics[r], mac))
            else:  # the other end of the cable
                q = p + fab.n_uplinks if p < fab.n_nics + fab.n_uplinks else p - fab.n_uplinks
                sw = fab.switches[int(fab.port_switch[q])]
                s = int(fab.port_switch[q])
                mac = f"02:01:{(s >> 8) & 255:02x}:{s & 255:02x}:00:00"
                out.append((sw, fab.port_name[q], fab.port_name[q], mac))
        for a, b in swaps:
            ia = fab.port_index[tuple(a.split("/", 1))]  # type: ignore[index]
            ib = fab.port_index[tuple(b.split("/", 1))]  # type: ignore[index]
            out[ia], out[ib] = out[ib], out[ia]
        return out

    def tick(self, k: int) -> Tick:
        """The simulator's tick ``k`` (computed once, shared by every stream).

        Only the last ``KEEP_TICKS`` are kept: a stream further behind gets the oldest kept.
        """
        with self._lock:
            if self._steps is None:
                self._steps = self.sim.steps()
            while self._next <= k:
                self._ticks[self._next] = next(self._steps)
                self._ticks.pop(self._next - self.KEEP_TICKS, None)
                self._next += 1
            return self._ticks.get(k) or self._ticks[max(0, self._next - self.KEEP_TICKS)]

    def switch_index(self, name: str) -> int | None:
        try:
            return self.switches.index(name)
        except ValueError:
            return None

    def values(self, s: int, k: int) -> tuple[int, list[list[int]]]:
        """(timestamp, values per group) of switch ``s`` at tick ``k``."""
        t = self.tick(k)
        out = []
        for p, ci, gi in self._cols[s]:
            v = t.sw_c[ci, p].tolist() + t.sw_g[gi, p].astype(np.uint64).tolist()
            out.append(v)
        return int(t.sw_ts[s]), out


class PreEncodedFeed:
    """A few ticks of a FabricFeed encoded once and served in a loop (benchmarks)."""

    def __init__(self, feed: FabricFeed, ticks: int, repeat: int) -> None:
        self.switches = feed.switches
        self._index = {n: i for i, n in enumerate(self.switches)}
        self.n_ticks = ticks * repeat
        self.interval_ns = feed.interval_ns
        self.encoded: list[list[bytes]] = []
        for s in range(len(feed.switches)):
            per_tick = []
            for k in range(ticks):
                ts, vals = feed.values(s, k)
                per_tick.append(
                    b"".join(
                        _frame(g.encode(ts, v)) for g, v in zip(feed.groups[s], vals, strict=True)
                    )
                )
            self.encoded.append(per_tick)
        self.updates_per_tick = sum(len(g.leaves) for gs in feed.groups for g in gs)

    def switch_index(self, name: str) -> int | None:
        try:
            return self._index.get(name)
        except AttributeError:
            return None

    @classmethod
    def synthetic(
        cls, switches: int, ports: int, ticks: int = 2, repeat: int = 10, seed: int = 1
    ) -> PreEncodedFeed:
        """``switches`` x ``ports`` with the fabric feed's layout (17 values per port in three
        notifications) and random counters: the benchmark's load, no simulation needed."""
        rng = np.random.default_rng(seed)
        self = cls.__new__(cls)
        self.switches = [f"sw-{i:03d}" for i in range(switches)]
        self._index = {n: i for i, n in enumerate(self.switches)}
        self.n_ticks = ticks * repeat
        self.interval_ns = 1_000_000_000
        layout: dict[str, list[str]] = {}
        for m in (*SW_COUNTERS, *SW_GAUGES):
            head, _, tail = OPENCONFIG_PATH[m].partition("/state/")
            layout.setdefault(head + "/state", []).append(tail)
        groups = []
        for p in range(ports):
            port = f"Ethernet{p + 1}"
            for parent, leaves in layout.items():
                keys = {
                    "interface": {"name": port}
                    if parent.startswith("/interfaces")
                    else {"interface-id": port},
                    "switch-priority": {"priority": "3"},
                    "queue": {"name": "3"},
                }
                pre, keyless, tags = _prefix(parent, keys)
                groups.append(Group(keyless, tags, pre, leaves))
        base = rng.integers(0, 1 << 50, size=(switches, len(groups), 8), dtype=np.uint64)
        t0 = 1795946400000000000
        self.encoded = []
        for s in range(switches):
            per_tick = []
            for k in range(ticks):
                vals = (base[s] + np.uint64(k * 1000)).tolist()
                ts = t0 + k * self.interval_ns + s * 1000
                per_tick.append(
                    b"".join(
                        _frame(g.encode(ts, v[: len(g.leaves)]))
                        for g, v in zip(groups, vals, strict=True)
                    )
                )
            self.encoded.append(per_tick)
        self.updates_per_tick = switches * sum(len(g.leaves) for g in groups)
        return self


def _frame(msg: bytes) -> bytes:
    """Length-prefix one message so a tick's messages can be stored as one blob."""
    return len(msg).to_bytes(4, "little") + msg


def _unframe(blob: bytes) -> Iterator[bytes]:
    i, n = 0, len(blob)
    mv = memoryview(blob)
    while i < n:
        ln = int.from_bytes(mv[i : i + 4], "little")
        yield bytes(mv[i + 4 : i + 4 + ln])
        i += 4 + ln


@dataclass(frozen=True)
class _Sub:
    keyless: str
    keys: list[tuple[str, dict[str, str]]]
    mode: int
    sample_ns: int
    suppress: bool
    heartbeat_ns: int


def _selects(sub: _Sub, g: Group) -> list[int] | None:
    """Which leaves of ``g`` the subscription covers: None = none, [] = all."""
    sk = sub.keyless.rstrip("/") or ""
    gk = g.keyless
    if sk and not (gk == sk or gk.startswith(sk + "/") or sk.startswith(gk + "/")):
        return None
    for name, keys in sub.keys:
        for k, v in keys.items():
            tv = g.tags.get(f"{name}_{k}")
            if tv is not None and v != "*" and tv != v:
                return None
    if sk.startswith(gk + "/"):
        rest = sk[len(gk) + 1 :]
        sel = [i for i, leaf in enumerate(g.leaves) if leaf == rest or leaf.startswith(rest + "/")]
        return sel or None
    return []


class GnmiTarget:
    """The gRPC server. ``start()`` returns the bound port; ``stop()`` ends every stream."""

    def __init__(
        self,
        feed: FabricFeed | PreEncodedFeed,
        address: str = "127.0.0.1:0",
        *,
        pace: float = 0.0,
        wall_clock: bool = False,
        join_now: bool = True,
        eof: bool = False,
        tls_cert: bytes | None = None,
        tls_key: bytes | None = None,
        client_ca: bytes | None = None,
        username: str | None = None,
        password: str | None = None,
        max_workers: int | None = None,
        on_sent: Callable[[int], None] | None = None,
    ) -> None:
        self.feed = feed
        self.address = address
        self.pace = pace
        self.wall_clock = wall_clock
        self.join_now = join_now
        self.eof = eof
        self.tls = (tls_cert, tls_key, client_ca) if tls_cert and tls_key else None
        self.auth = (username, password) if username is not None else None
        self.max_workers = max_workers or len(feed.switches) + 8
        self.on_sent = on_sent
        self.port = 0
        self.subscribes = 0  # Subscribe RPCs accepted
        self._server: grpc.Server | None = None
        self._stop = threading.Event()
        self._clock_lock = threading.Lock()
        self._t0: float | None = None
        self._wall0 = 0

    # --- lifecycle -----------------------------------------------------------------------------
    def start(self) -> int:
        self._stop.clear()
        server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=self.max_workers),
            options=[("grpc.max_send_message_length", _MAX_MSG), ("grpc.so_reuseport", 0)],
        )
        handler = grpc.method_handlers_generic_handler(
            "gnmi.gNMI",
            {
                "Subscribe": grpc.stream_stream_rpc_method_handler(
                    self._subscribe,
                    request_deserializer=pb.SubscribeRequest.FromString,
                    response_serializer=lambda b: b,
                ),
                "Get": grpc.unary_unary_rpc_method_handler(
                    self._get,
                    request_deserializer=pb.GetRequest.FromString,
                    response_serializer=lambda b: b,
                ),
                "Capabilities": grpc.unary_unary_rpc_method_handler(
                    self._capabilities,
                    request_deserializer=pb.CapabilityRequest.FromString,
                    response_serializer=pb.CapabilityResponse.SerializeToString,
                ),
            },
        )
        server.add_generic_rpc_handlers((handler,))
        if self.tls is not None:
            cert, key, ca = self.tls
            creds = grpc.ssl_server_credentials(
                [(key, cert)], root_certificates=ca, require_client_auth=ca is not None
            )
            self.port = server.add_secure_port(self.address, creds)
        else:
            self.port = server.add_insecure_port(self.address)
        if not self.port:
            raise OSError(f"gNMI target cannot bind {self.address}")
        server.start()
        self._server = server
        log.info("gNMI target serving %d switches on port %d", len(self.feed.switches), self.port)
        return self.port

    def stop(self, grace: float | None = 0) -> None:
        self._stop.set()
        if self._server is not None:
            self._server.stop(grace).wait()
            self._server = None

    def __enter__(self) -> GnmiTarget:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- RPCs ----------------------------------------------------------------------------------
    def _capabilities(self, req: Any, ctx: grpc.ServicerContext) -> Any:
        self._check_auth(ctx)
        return pb.CapabilityResponse(
            supported_models=[
                pb.ModelData(name="openconfig-interfaces", organization="OpenConfig")
            ],
            supported_encodings=[pb.PROTO, pb.JSON],
            gNMI_version="0.8.0",
        )

    def _get(self, req: Any, ctx: grpc.ServicerContext) -> bytes:
        self._check_auth(ctx)
        feed = self.feed
        if not isinstance(feed, FabricFeed):
            ctx.abort(grpc.StatusCode.UNIMPLEMENTED, "Get: this target serves a benchmark load")
        assert isinstance(feed, FabricFeed)
        if req.encoding not in (pb.PROTO, pb.JSON, pb.JSON_IETF):
            ctx.abort(
                grpc.StatusCode.UNIMPLEMENTED,
                f"encoding {pb.Encoding.Name(req.encoding)} not supported (PROTO, JSON, JSON_IETF)",
            )
        s = self._switch(req.prefix.target, ctx)
        if req.type == pb.GetRequest.CONFIG:
            return b""  # every leaf served is state: no configuration data
        prefix = req.prefix if req.HasField("prefix") else None
        subs = [self._sub(prefix, path) for path in req.path or [pb.Path()]]
        groups = feed.groups[s] + [g for g, _ in feed.lldp[s]]
        for sub, path in zip(subs, req.path or [pb.Path()], strict=True):
            if not any(_selects(sub, g) is not None for g in groups):
                ctx.abort(grpc.StatusCode.NOT_FOUND, f"no data at {flatten(prefix, path)[0]}")
        json_values = req.encoding != pb.PROTO
        return b"".join(self._full(s, self._now_tick(), subs, lldp=True, json_values=json_values))

    def _switch(self, target: str, ctx: grpc.ServicerContext) -> int:
        """The index of the switch a request names (the only one, when it names none)."""
        if not target and len(self.feed.switches) == 1:
            target = self.feed.switches[0]
        s = self.feed.switch_index(target)
        if s is None:
            ctx.abort(
                grpc.StatusCode.NOT_FOUND,
                f"unknown target {target!r}: set prefix.target to a switch this server serves",
            )
        assert s is not None
        return s

    def _check_auth(self, ctx: grpc.ServicerContext) -> None:
        if self.auth is None:
            return
        md = dict(ctx.invocation_metadata())
        if md.get("username") != self.auth[0] or md.get("password") != self.auth[1]:
            ctx.abort(grpc.StatusCode.UNAUTHENTICATED, "bad username or password")

    def _subscribe(self, requests: Iterator[Any], ctx: grpc.ServicerContext) -> Iterator[bytes]:
        # the client's SubscriptionList is read before a refusal: aborting a stream the client
        # is still opening sometimes reached it as INTERNAL ("Internal error from Core")
        # instead of UNAUTHENTICATED
        first = next(requests, None)
        self._check_auth(ctx)
        if first is None or first.WhichOneof("request") != "subscribe":
            ctx.abort(grpc.StatusCode.INVALID_ARGUMENT, "first message must be a SubscriptionList")
        assert first is not None
        sl = first.subscribe
        s = self._switch(sl.prefix.target, ctx)
        self.subscribes += 1
        if isinstance(self.feed, PreEncodedFeed):
            yield from self._pre_encoded(s, ctx)
            return
        subs = self._subs(sl)
        mode = sl.mode
        if mode == pb.SubscriptionList.ONCE:
            yield from self._full(s, self._now_tick(), subs, lldp=True)
            yield SYNC
            return
        if mode == pb.SubscriptionList.POLL:
            k = self._now_tick()
            yield from self._full(s, k, subs, lldp=True)
            yield SYNC
            for req in requests:
                if self._stop.is_set():
                    return
                if req.WhichOneof("request") != "poll":
                    continue
                k = max(k + 1, self._now_tick()) if self.pace else k + 1
                k = min(k, self.feed.n_ticks - 1)
                yield from self._full(s, k, subs, lldp=True)
                yield SYNC
            return
        yield from self._stream(s, subs, sl.updates_only, ctx)

    def _sub(self, prefix: Any, path: Any, sub: Any = None) -> _Sub:
        """What one subscription (or Get path) under ``prefix`` selects; keys of the prefix's
        elements count as well as the path's."""
        pfx, _ = flatten(prefix, None) if prefix is not None else ("", {})
        pfx = "" if pfx == "/" else pfx
        rel, _ = flatten(None, path)
        elems = [*(prefix.elem if prefix is not None else ()), *path.elem]
        keys = [(e.name, dict(e.key)) for e in elems if e.key]
        interval = self.feed.interval_ns
        return _Sub(
            pfx + ("" if rel == "/" else rel),
            keys,
            sub.mode if sub is not None else pb.SAMPLE,
            max(int(sub.sample_interval) or interval, interval) if sub is not None else interval,
            bool(sub.suppress_redundant) if sub is not None else False,
            int(sub.heartbeat_interval) if sub is not None else 0,
        )

    def _subs(self, sl: Any) -> list[_Sub]:
        prefix = sl.prefix if sl.HasField("prefix") else None
        return [self._sub(prefix, sub.path, sub) for sub in sl.subscription or [pb.Subscription()]]

    def _full(
        self, s: int, k: int, subs: list[_Sub], lldp: bool, json_values: bool = False
    ) -> Iterator[bytes]:
        feed = self.feed
        assert isinstance(feed, FabricFeed)
        ts, vals = feed.values(s, k)
        ts += self._shift(k)
        for g, v in zip(feed.groups[s], vals, strict=True):
            sel = self._union(subs, g)
            if sel is not None:
                yield g.encode(ts, v, sel or None, json_values)
        if lldp:
            for lg, lv in feed.lldp[s]:
                lsel = self._union(subs, lg)
                if lsel is not None:
                    yield lg.encode(ts, lv, lsel or None, json_values)

    @staticmethod
    def _union(subs: list[_Sub], g: Group) -> list[int] | None:
        out: set[int] | None = None
        for sub in subs:
            sel = _selects(sub, g)
            if sel is None:
                continue
            if not sel:
                return []
            out = (out or set()) | set(sel)
        return None if out is None else sorted(out)

    def _now_tick(self) -> int:
        if not self.pace or self._t0 is None:
            return 0
        k = int((time.monotonic() - self._t0) * self.pace * 1e9 / self.feed.interval_ns)
        return min(k, self.feed.n_ticks - 1)

    def _shift(self, k: int) -> int:
        if not self.wall_clock:
            return 0
        start = getattr(self.feed, "start_ns", 0)
        return self._wall0 - start

    def _wait(self, k: int, t0: float, ctx: grpc.ServicerContext) -> bool:
        """Sleep until tick ``k`` is due (realtime); False when the stream should end."""
        if self._stop.is_set() or not ctx.is_active():
            return False
        if self.pace > 0:
            due = t0 + k * self.feed.interval_ns / 1e9 / self.pace
            delay = due - time.monotonic()
            if delay > 0 and self._stop.wait(delay):
                return False
        return True

    def _stream(
        self, s: int, subs: list[_Sub], updates_only: bool, ctx: grpc.ServicerContext
    ) -> Iterator[bytes]:
        feed = self.feed
        assert isinstance(feed, FabricFeed)
        with self._clock_lock:
            if self._t0 is None:  # the fabric's clock starts with the first stream
                self._t0 = time.monotonic()
                self._wall0 = time.time_ns()
        t0 = self._t0
        # a paced stream joins at the fabric's current tick (a re-subscribe sees current values)
        k0 = self._now_tick() if self.join_now else 0
        groups = feed.groups[s]
        # per group: which subscriptions cover it and how
        plan: list[list[tuple[_Sub, list[int] | None]]] = []
        for g in groups:
            plan.append([(sub, _selects(sub, g)) for sub in subs if _selects(sub, g) is not None])
        lldp_subs = [(g, v, self._union(subs, g)) for g, v in feed.lldp[s]]
        last: list[list[Any] | None] = [None] * len(groups)
        next_due = [[0] * len(p) for p in plan]
        leaf_sent = [[0] * len(g.leaves) for g in groups]
        interval = feed.interval_ns
        k0 = min(k0, feed.n_ticks - 1)
        for k in range(k0, feed.n_ticks):
            first = k == k0
            if not self._wait(k, t0, ctx):
                return
            ts, vals = feed.values(s, k)
            ts += self._shift(k)
            now = k * interval
            sent = 0
            for gi, g in enumerate(groups):
                v = vals[gi]
                prev = last[gi]
                idx: set[int] = set()
                for j, (sub, sel) in enumerate(plan[gi]):
                    leaves = sel if sel else range(len(g.leaves))
                    on_change = sub.mode == pb.ON_CHANGE or sub.suppress
                    if sub.mode == pb.ON_CHANGE or (
                        sub.mode != pb.ON_CHANGE and now >= next_due[gi][j]
                    ):
                        if sub.mode != pb.ON_CHANGE:
                            next_due[gi][j] = now + sub.sample_ns
                        hb = sub.heartbeat_ns
                        sent_at = leaf_sent[gi]
                        if on_change and prev is not None:
                            # unchanged values only when their heartbeat is due (per leaf)
                            chosen = [
                                i
                                for i in leaves
                                if v[i] != prev[i] or (hb and now - sent_at[i] >= hb)
                            ]
                        else:
                            chosen = list(leaves)
                        for i in chosen:
                            sent_at[i] = now
                        idx.update(chosen)
                last[gi] = v
                if first and updates_only:
                    continue
                if idx:
                    sel_idx = sorted(idx)
                    yield g.encode(ts, v, None if len(sel_idx) == len(g.leaves) else sel_idx)
                    sent += len(sel_idx)
            if first:
                if not updates_only:
                    for lg, lv, lsel in lldp_subs:
                        if lsel is not None:
                            yield lg.encode(ts, lv, lsel or None)
                yield SYNC
            if self.on_sent is not None:
                self.on_sent(sent)
        if not self.eof:
            while not self._stop.wait(0.2) and ctx.is_active():
                pass

    def _pre_encoded(self, s: int, ctx: grpc.ServicerContext) -> Iterator[bytes]:
        feed = self.feed
        assert isinstance(feed, PreEncodedFeed)
        blobs = feed.encoded[s]
        for k in range(feed.n_ticks):
            if self._stop.is_set():
                return
            yield from _unframe(blobs[k % len(blobs)])
            if k == 0:
                yield SYNC
        if not self.eof:
            while not self._stop.wait(0.2) and ctx.is_active():
                pass


def main(argv: list[str] | None = None) -> int:
    """``python -m rocewatch.sim.gnmi_target``: serve a simulated fabric (or a synthetic load)."""
    import argparse

    from rocewatch.sim import scenarios as sc

    ap = argparse.ArgumentParser(prog="python -m rocewatch.sim.gnmi_target")
    ap.add_argument("--address", default="127.0.0.1:9339")
    ap.add_argument("--scenario", default="default", choices=sorted(sc.SCENARIOS))
    ap.add_argument("--nodes", type=int, default=16)
    ap.add_argument("--duration", type=float, default=3600.0, help="telemetry seconds")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--pace", type=float, default=1.0, help="1 = real time, 0 = flat out")
    ap.add_argument("--synthetic", help="SWITCHESxPORTS of pre-encoded responses, e.g. 64x64")
    ap.add_argument("--ticks", type=int, default=20, help="--synthetic: ticks per stream")
    ap.add_argument("--eof", action="store_true", help="end each stream after its last tick")
    ap.add_argument("--tls-cert")
    ap.add_argument("--tls-key")
    ap.add_argument("--client-ca", help="require client certificates signed by this CA")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    feed: FabricFeed | PreEncodedFeed
    if args.synthetic:
        n_sw, n_ports = (int(x) for x in args.synthetic.lower().split("x"))
        feed = PreEncodedFeed.synthetic(n_sw, n_ports, ticks=2, repeat=max(1, args.ticks // 2))
    else:
        cfg = sc.SCENARIOS[args.scenario](
            nodes=args.nodes, duration_s=args.duration, seed=args.seed
        )
        feed = FabricFeed(Simulator(cfg))

    def read(p: str | None) -> bytes | None:
        return Path(p).read_bytes() if p else None

    target = GnmiTarget(
        feed,
        args.address,
        pace=args.pace,
        wall_clock=args.pace == 1.0,
        eof=args.eof,
        tls_cert=read(args.tls_cert),
        tls_key=read(args.tls_key),
        client_ca=read(args.client_ca),
    )
    port = target.start()
    print(f"serving {len(feed.switches)} switches on port {port}", flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        target.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
