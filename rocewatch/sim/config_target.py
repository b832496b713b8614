"""A gNMI target serving one simulated switch's CONFIG_DB RoCE tables as SONiC's gNMI server
does: target ``CONFIG_DB``, paths ``TABLE``, ``TABLE/KEY`` or ``TABLE/KEY/FIELD``, values as
JSON_IETF (an entry's fields as an object, a table as an object of entries). Get, and Subscribe
ONCE (the updates, then ``sync_response``) or STREAM (SAMPLE: all of it again every
sample_interval, as the tables are then). Enough for gnmic (or any gNMI client) to read the
configuration rocewatch's simulator writes to ``switch_config.jsonl``; loopback only.

>>> from rocewatch.sim.roce_config import config_db
>>> from rocewatch.sim import SimConfig
>>> from rocewatch.sim.fabric import Fabric
>>> db = config_db(Fabric(SimConfig(nodes=1, nics_per_node=1, spines=1)), [], 3)["spine-0"]
>>> with ConfigDbTarget(db) as t:
...     t.port > 0
True
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from typing import Any

import grpc
from pygnmi.spec.v080 import gnmi_pb2 as pb
from pygnmi.spec.v080 import gnmi_pb2_grpc as pb_grpc

from rocewatch.sim.roce_config import ConfigDb

TARGET = "CONFIG_DB"


class _Servicer(pb_grpc.gNMIServicer):  # type: ignore[misc]
    def __init__(self, db: ConfigDb, clock: Callable[[], int]) -> None:
        self.db = db
        self.clock = clock

    def _value(self, elems: list[str]) -> Any:
        if not elems or elems[0] not in self.db:
            return None
        table = self.db[elems[0]]
        if len(elems) == 1:
            return table
        key = elems[1]
        if key not in table:
            return None
        if len(elems) == 2:
            return table[key]
        return table[key].get(elems[2]) if len(elems) == 3 else None

    def _notification(self, prefix: Any, paths: list[Any], ctx: grpc.ServicerContext) -> Any:
        if prefix.target not in ("", TARGET):
            ctx.abort(grpc.StatusCode.NOT_FOUND, f"unknown target {prefix.target!r}")
        base = [e.name for e in prefix.elem]
        updates = []
        for p in paths:
            elems = base + [e.name for e in p.elem]
            val = self._value(elems)
            if val is None:
                ctx.abort(grpc.StatusCode.NOT_FOUND, f"no {'/'.join(elems)} in {TARGET}")
            updates.append(
                pb.Update(path=p, val=pb.TypedValue(json_ietf_val=json.dumps(val).encode()))
            )
        return pb.Notification(
            timestamp=self.clock(), prefix=pb.Path(target=TARGET, elem=prefix.elem), update=updates
        )

    def Capabilities(self, request: Any, context: grpc.ServicerContext) -> Any:
        return pb.CapabilityResponse(supported_encodings=[pb.JSON_IETF], gNMI_version="0.8.0")

    def Get(self, request: Any, context: grpc.ServicerContext) -> Any:
        n = self._notification(request.prefix, list(request.path), context)
        return pb.GetResponse(notification=[n])

    def Subscribe(
        self, request_iterator: Iterator[Any], context: grpc.ServicerContext
    ) -> Iterator[Any]:
        req = next(request_iterator)
        sl = req.subscribe
        if sl.mode == pb.SubscriptionList.POLL:
            context.abort(grpc.StatusCode.UNIMPLEMENTED, "this target serves ONCE and STREAM")
        paths = [s.path for s in sl.subscription]
        yield pb.SubscribeResponse(update=self._notification(sl.prefix, paths, context))
        yield pb.SubscribeResponse(sync_response=True)
        if sl.mode == pb.SubscriptionList.ONCE:
            return
        # STREAM: SAMPLE sends everything again every sample_interval (the shortest asked;
        # the tables as they are then: a test may change them); ON_CHANGE holds the stream
        # open (nothing here changes by itself)
        every = [s.sample_interval for s in sl.subscription if s.mode == pb.SAMPLE]
        interval_s = max(0.05, min(every) / 1e9) if every and min(every) > 0 else None
        while context.is_active():
            if interval_s is None:
                time.sleep(0.1)
                continue
            time.sleep(interval_s)
            if context.is_active():
                yield pb.SubscribeResponse(update=self._notification(sl.prefix, paths, context))


class ConfigDbTarget:
    """The server; ``port`` is bound at start (0: any free port on 127.0.0.1)."""

    def __init__(
        self, db: ConfigDb, port: int = 0, clock: Callable[[], int] = time.time_ns
    ) -> None:
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        pb_grpc.add_gNMIServicer_to_server(_Servicer(db, clock), self.server)
        self.port = self.server.add_insecure_port(f"127.0.0.1:{port}")
        if not self.port:
            raise OSError(f"config target cannot bind 127.0.0.1:{port}")

    def __enter__(self) -> ConfigDbTarget:
        self.server.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.stop(0)
