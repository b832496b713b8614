"""rocewatch's checkpoint format: state as data, never as code (docs/formats/checkpoint.md).

A checkpoint (a record of the detect service's state topic, the isolation forest's model
file) is::

    b"RWCKPT" | major u8 | minor u8 | sha256(body) 32 bytes | body
    body = u32 LE length of the JSON header | JSON header (UTF-8) | blobs, back to back

The header is ``{"kind": ..., "blobs": [[how, length], ...], "root": <value>}``: ``root`` is the
state as JSON with a few tagged forms (a JSON array whose first item is a ``"$..."`` string) for
what JSON lacks: tuples, sets, dicts with keys other than strings, bytes, non-finite floats,
shared references, and objects. Polars frames are Arrow IPC blobs; NumPy arrays are raw
little-endian blobs with their dtype and shape in the header (never an object dtype).

An object is written as its class's qualified name and its state: ``__getstate__`` where the
class defines one (``__setstate__`` takes it back), else its attributes; a few classes have an
adapter here (the drain policy: its own ``state()`` / ``restore()``). Only classes on the
allowlist (``_ALLOWED``) are written or read: reading looks a name up in that table, so no name
in a record imports or calls anything else, and no ``__reduce__`` is ever honoured.

Compatibility: a build reads every record of its own major version; a record of another major
version is refused with ``checkpoint format vN not supported by this build (reads v1)``. Minor
versions add only what an older reader of the same major can ignore.

>>> back = loads(dumps({(1, "a"): {1.5, float("inf")}, "b": b"\\x00"}, "example"), "example")
>>> back == {(1, "a"): {1.5, float("inf")}, "b": b"\\x00"}
True
"""

from __future__ import annotations

import base64
import collections
import dataclasses
import functools
import hashlib
import importlib
import io
import math
import re
import struct
import threading
import weakref
import zlib
from collections.abc import Callable
from typing import Any

import numpy as np
import orjson
import polars as pl

from rocewatch.errors import BadInput

MAGIC = b"RWCKPT"
FORMAT_MAJOR = 1
FORMAT_MINOR = 0
_HEAD = struct.Struct("<6sBB32s")
MAX_HEADER = 1 << 30  # a header inflating past this is refused (a zlib bomb)
_LEN = struct.Struct("<I")
# the dtypes an array may have: plain numbers and booleans (an object array would be pickled)
_DTYPE_KINDS = frozenset("biufc")
_I64_MIN, _U64_MAX = -(1 << 63), (1 << 64) - 1
# the item types of tuples written as they are: strings (series and entity keys)
_STR_TUPLE = {(str,) * n: True for n in range(1, 5)}


class CheckpointError(BadInput):
    """A checkpoint that cannot be restored (damaged, foreign, of another version, naming a
    class this build does not allow). Nothing in it has been executed: the caller counts it and
    starts from its committed offsets as if there were no checkpoint."""


# --- the allowlist --------------------------------------------------------------------------------


# the modules whose every class may be in a checkpoint (the pipeline and what it owns)
_STATE_MODULES = (
    "rocewatch.config",
    "rocewatch.model",
    "rocewatch.pipeline",
    "rocewatch.stats",
    "rocewatch.topology",
    "rocewatch.alerting.group",
    "rocewatch.alerting.inhibit",
    "detectors.base",
    "detectors.baseline",
    "detectors.clock_guard",
    "detectors.ecn_congestion",
    "detectors.fabric_incident",
    "detectors.flaky_link",
    "detectors.isolation_forest",
    "detectors.lifecycle",
    "detectors.pcie_downgrade",
    "detectors.pfc_storm",
    "detectors.queue_buildup",
    "detectors.rates",
    "detectors.state",
    "detectors.straggler",
    "detectors.transport_errors",
    "detectors.windows",
)


def _allowed_classes() -> list[type]:
    """Every class whose instances a checkpoint may hold: the pipeline and what it owns
    (detectors, their state, configs, topology, alerts), the scale-out stages' state.
    Imported here, at first use, so that importing this module imports no detector."""
    from actions.api import ApiConfig
    from actions.executors import SlurmConfig
    from actions.kubernetes import KubernetesConfig
    from actions.membership import MembershipConfig
    from actions.policy import PolicyConfig
    from actions.routing import ExecutorsConfig
    from actions.slurmrest import SlurmRestConfig
    from collector.gnmi import config as gnmi_config
    from collector.inband.udp import UdpListenerConfig
    from collector.nic.agent import AgentConfig
    from rocewatch.notify import base as notify_base

    classes: list[type] = [
        ApiConfig,
        SlurmConfig,
        MembershipConfig,
        PolicyConfig,
        ExecutorsConfig,
        AgentConfig,
        KubernetesConfig,
        SlurmRestConfig,
        UdpListenerConfig,
        gnmi_config.GnmiConfig,
        gnmi_config.TargetConfig,
        gnmi_config.SubscriptionConfig,
        gnmi_config.TlsConfig,
        notify_base.NotifyConfig,
        notify_base.RetryConfig,
        notify_base.WebhookConfig,
        notify_base.AlertmanagerConfig,
        notify_base.TlsConfig,
    ]
    # every class of the modules that hold the pipeline's state (detectors, their per-entity
    # state, configs, topology, alerts): data only, no clients, handles or executors (a test
    # holds the allowlist to that)
    for mod in map(importlib.import_module, _STATE_MODULES):
        classes += [
            c
            for c in vars(mod).values()
            if isinstance(c, type)
            and _within(c.__module__, mod.__name__)
            and not issubclass(c, BaseException)
        ]
    return classes


def _within(module: str, state_module: str) -> bool:
    """Whether a class of ``module`` belongs to ``state_module``: it is that module, or one of
    that package's modules (a package exports every class of its modules)."""
    return module == state_module or module.startswith(state_module + ".")


def _record_name(c: type) -> str:
    """The name a checkpoint gives a class: its state module's (the package that exports it,
    for a class of a package's module, so moving it between the package's modules changes no
    record), then its qualified name."""
    module = next((m for m in _STATE_MODULES if _within(c.__module__, m)), c.__module__)
    return f"{module}:{c.__qualname__}"


_LOCK = threading.Lock()
_TABLE: dict[str, type] | None = None
_NAMES: dict[type, str] = {}


def _table() -> dict[str, type]:
    global _TABLE
    t = _TABLE
    if t is None:
        with _LOCK:
            t = {}
            for c in _allowed_classes():
                t[_record_name(c)] = c
            _NAMES.clear()
            _NAMES.update({c: n for n, c in t.items()})
            _TABLE = t
    return t


def allowed() -> dict[str, type]:
    """The allowlist: qualified name -> class."""
    return dict(_table())


# --- adapters: classes that state their own state -------------------------------------------------


def _policy_state(p: Any) -> dict[str, Any]:
    # the executor is not state: the service that restores a policy gives it its own
    return {"config": p.config, "topology": p.topology, "domain": p.domain, "state": p.state()}


def _policy_restore(d: dict[str, Any]) -> Any:
    from actions.policy import DrainPolicy
    from rocewatch.errors import ConfigError

    try:
        p = DrainPolicy(d["config"], d["topology"])
        p.domain = d["domain"]
        p.restore(d["state"])
    except (ConfigError, KeyError, TypeError, ValueError) as e:
        raise CheckpointError(f"drain policy state unusable: {e}") from e
    return p


def _detector_classes() -> dict[type, type]:
    """The registry's detectors, each with its config class."""
    from detectors.registry import DETECTORS

    return {det: cfg for det, cfg in DETECTORS.values()}


def _adapters() -> dict[type, tuple[str, Callable[[Any], Any], Callable[[Any], Any]]]:
    from actions.policy import DrainPolicy

    return {DrainPolicy: ("actions.policy:DrainPolicy", _policy_state, _policy_restore)}


# --- encoding -------------------------------------------------------------------------------------


_CUSTOM: dict[type, bool] = {}
_SLOTS: dict[type, tuple[str, ...]] = {}


def _custom_getstate(cls: type) -> bool:
    c = _CUSTOM.get(cls)
    if c is None:
        c = _CUSTOM[cls] = getattr(cls, "__getstate__", None) is not object.__getstate__
    return c


def _slots(cls: type) -> tuple[str, ...]:
    s = _SLOTS.get(cls)
    if s is None:
        s = _SLOTS[cls] = _find_slots(cls)
    return s


def _find_slots(cls: type) -> tuple[str, ...]:
    out: list[str] = []
    for c in cls.__mro__:
        s = c.__dict__.get("__slots__", ())
        out += [s] if isinstance(s, str) else [n for n in s if n not in ("__dict__", "__weakref__")]
    return tuple(out)


class _Encoder:
    """Turns a state into JSON-able values and blobs, at once: arrays are copied now, frames
    are held (copied with ``copy``: a frame made from a NumPy array shares its memory) and
    written out by ``Snapshot.record``, which may run on another thread."""

    def __init__(self, copy_frames: bool) -> None:
        self.copy_frames = copy_frames
        self.memo: dict[int, int] = {}
        self.held: list[Any] = []  # alive while encoding: their ids stay theirs
        self.blobs: list[tuple[str, Any]] = []  # ("ipc", frame) or ("raw", bytes)
        self.table = _table()
        self.names = _NAMES
        self.adapters = _adapters()
        self.simple: dict[type, Callable[[Any], Any]] = {
            str: _same,
            int: self._int,
            bool: _same,
            type(None): _same,
            float: _float,
            list: self._list,
            dict: self._dict,
            tuple: self._tuple,
            set: self._set,
            frozenset: self._frozenset,
            bytes: _bytes,
            collections.deque: self._deque,
            collections.Counter: self._counter,
            np.ndarray: self._array,
            pl.DataFrame: self._frame,
            pl.Series: self._series,
            re.Pattern: _pattern,
        }

    def enc(self, v: Any) -> Any:
        f = self.simple.get(type(v))
        if f is not None:
            return f(v)
        return self._other(v)

    def _int(self, v: int) -> Any:
        return v if _I64_MIN <= v <= _U64_MAX else ["$i", str(v)]

    def _items(self, v: Any) -> list[Any]:
        """``v``'s items encoded, the plain ones (most of them) without a call each, nor the
        key tuples of strings detectors keep by the thousand."""
        enc = self.enc
        return [
            x
            if (t := type(x)) is str
            or x is None
            or t is bool
            or (t is int and _I64_MIN <= x <= _U64_MAX)
            or (t is float and x - x == 0.0)
            else ["$t", *x]
            if t is tuple and _STR_TUPLE.get(tuple(map(type, x)), False)  # type: ignore[arg-type]
            else enc(x)
            for x in v
        ]

    def _list(self, v: list[Any]) -> Any:
        out = self._items(v)
        if out and type(out[0]) is str and out[0][:1] == "$":
            return ["$l", *out]
        return out

    def _dict(self, v: dict[Any, Any]) -> Any:
        keys = list(v)
        if all(type(k) is str for k in keys):
            return dict(zip(keys, self._items(v.values()), strict=True))
        # pairwise, in the order the reader takes them: a value may refer to an object first
        # met in a later key, and the reader must have met it before
        return ["$d", *self._items(x for kv in v.items() for x in kv)]

    def _tuple(self, v: tuple[Any, ...]) -> Any:
        return ["$t", *self._items(v)]

    def _set(self, v: set[Any]) -> Any:
        return ["$s", *self._items(v)]

    def _frozenset(self, v: frozenset[Any]) -> Any:
        return ["$z", *self._items(v)]

    def _deque(self, v: collections.deque[Any]) -> Any:
        return ["$q", v.maxlen, *self._items(v)]

    def _counter(self, v: collections.Counter[Any]) -> Any:
        return ["$C", self._dict(dict(v))]

    def _seen(self, v: Any) -> int | None:
        i = self.memo.get(id(v))
        if i is None:
            self.memo[id(v)] = len(self.memo)
            self.held.append(v)
        return i

    def _array(self, v: np.ndarray) -> Any:
        i = self._seen(v)
        if i is not None:
            return ["$r", i]
        if v.dtype.kind not in _DTYPE_KINDS:
            raise CheckpointError(f"an array of dtype {v.dtype} cannot be checkpointed")
        le = v.astype(v.dtype.newbyteorder("<"), copy=False)
        self.blobs.append(("raw", np.ascontiguousarray(le).tobytes()))  # a copy, taken now
        return ["$A", self.memo[id(v)], len(self.blobs) - 1, le.dtype.str, list(v.shape)]

    def _frame(self, v: pl.DataFrame) -> Any:
        i = self._seen(v)
        if i is not None:
            return ["$r", i]
        # a gather copies the columns' buffers (strings keep theirs: nothing changes them)
        f = v[np.arange(v.height)] if self.copy_frames and v.height else v
        self.blobs.append(("ipc", f))
        return ["$F", self.memo[id(v)], len(self.blobs) - 1]

    def _series(self, v: pl.Series) -> Any:
        i = self._seen(v)
        if i is not None:
            return ["$r", i]
        f = v.to_frame()
        f = f[np.arange(f.height)] if self.copy_frames and f.height else f
        self.blobs.append(("ipc", f))
        return ["$S", self.memo[id(v)], len(self.blobs) - 1]

    def _other(self, v: Any) -> Any:
        cls = type(v)
        if isinstance(v, np.generic):
            if v.dtype.kind not in _DTYPE_KINDS:
                raise CheckpointError(f"a NumPy scalar of dtype {v.dtype} cannot be checkpointed")
            return ["$n", v.dtype.str, self.enc(v.item())]
        if isinstance(v, np.dtype):
            if v.kind not in _DTYPE_KINDS:
                raise CheckpointError(f"dtype {v} cannot be checkpointed")
            return ["$D", v.str]
        if isinstance(v, tuple):  # a named tuple: immutable, so never shared by reference
            name = self.names.get(cls)
            if name is None:
                raise CheckpointError(f"{cls.__qualname__} is not on the checkpoint allowlist")
            return ["$N", name, *[self.enc(x) for x in v]]
        i = self._seen(v)
        if i is not None:
            return ["$r", i]
        ad = self.adapters.get(cls)
        if ad is not None:
            return ["$o", self.memo[id(v)], ad[0], self.enc(ad[1](v))]
        name = self.names.get(cls)
        if name is None:
            raise CheckpointError(
                f"{cls.__module__}.{cls.__qualname__} is not on the checkpoint allowlist"
            )
        if name == _TOPOLOGY:
            return ["$T", self.memo[id(v)], self._topology(v)]
        return ["$o", self.memo[id(v)], name, self.enc(self._state(v))]

    def _state(self, v: Any) -> Any:
        cls = type(v)
        if _custom_getstate(cls):
            state = v.__getstate__()
        elif hasattr(v, "__dict__"):
            state = v.__dict__
            slots = _slots(cls)
            if slots:
                state = {**state, **{n: getattr(v, n) for n in slots if hasattr(v, n)}}
        else:
            state = {n: getattr(v, n) for n in _slots(cls) if hasattr(v, n)}
        return state

    def _topology(self, v: Any) -> Any:
        """A topology's state, encoded apart (its own reference numbers) and kept: it is the
        largest part of a pipeline's state in objects and changes only with its jobs
        (``set_jobs`` counts them in ``jobs_version``), so each checkpoint need not walk it."""
        with _LOCK:
            hit = _TOPOLOGIES.get(v)
        if hit is not None and hit[0] == v.jobs_version:
            return hit[1]
        sub = _Encoder(copy_frames=False)
        enc = sub.enc(self._state(v))
        if sub.blobs:  # (none today) arrays or frames would need this record's blobs
            raise CheckpointError("a topology with arrays or frames cannot be checkpointed")
        with _LOCK:
            _TOPOLOGIES[v] = (v.jobs_version, enc)
        return enc


def _same(v: Any) -> Any:
    return v


def _float(v: float) -> Any:
    if math.isfinite(v):
        return v
    return ["$f", "nan" if v != v else ("inf" if v > 0 else "-inf")]


def _bytes(v: bytes) -> Any:
    return ["$b", base64.b64encode(v).decode()]


def _pattern(v: re.Pattern[Any]) -> Any:
    if not isinstance(v.pattern, str):
        raise CheckpointError("a bytes pattern cannot be checkpointed")
    return ["$re", v.pattern, v.flags]


def _ipc(f: pl.DataFrame) -> bytes:
    buf = io.BytesIO()
    f.write_ipc(buf, compression="zstd")
    return buf.getvalue()


class Snapshot:
    """A state as a checkpoint, in two parts: ``Snapshot(obj, kind)`` encodes it at once (a
    consistent copy: later changes to it are not in the record), ``record()`` writes the frames
    and the JSON out, and may run on another thread."""

    def __init__(self, obj: Any, kind: str, copy_frames: bool = True) -> None:
        e = _Encoder(copy_frames)
        self.kind = kind
        self.root = e.enc(obj)
        self.blobs = e.blobs

    def record(self) -> bytes:
        hows = [how for how, _ in self.blobs]
        blobs = [_ipc(b) if how == "ipc" else b for how, b in self.blobs]
        self.blobs = []
        table = [[how, len(b)] for how, b in zip(hows, blobs, strict=True)]
        head = orjson.dumps({"kind": self.kind, "blobs": table, "root": self.root})
        # compressed: a large state's header is ~15 % of the record and shrinks 7-fold, in
        # ms at level 1 (a header that begins with "{" is plain JSON, one with 0x78 zlib)
        head = zlib.compress(head, 1)
        body = b"".join([_LEN.pack(len(head)), head, *blobs])
        return _HEAD.pack(MAGIC, FORMAT_MAJOR, FORMAT_MINOR, hashlib.sha256(body).digest()) + body


def dumps(obj: Any, kind: str) -> bytes:
    """``obj`` as a checkpoint of ``kind`` (a name the reader checks: "detect-state", ...)."""
    return Snapshot(obj, kind, copy_frames=False).record()


# --- decoding -------------------------------------------------------------------------------------


def check(data: bytes) -> memoryview:
    """The body of a checkpoint, after checking its magic, version and checksum."""
    if len(data) < _HEAD.size + _LEN.size:
        if data[: len(MAGIC)] == MAGIC[: len(data)]:
            raise CheckpointError(f"checkpoint truncated ({len(data)} bytes)")
        raise CheckpointError("not a rocewatch checkpoint")
    magic, major, _minor, digest = _HEAD.unpack_from(data)
    if magic != MAGIC:
        what = " (a pickle: never loaded)" if data[:1] == b"\x80" else ""
        raise CheckpointError(f"not a rocewatch checkpoint{what}")
    if major != FORMAT_MAJOR:
        raise CheckpointError(
            f"checkpoint format v{major} not supported by this build (reads v{FORMAT_MAJOR})"
        )
    body = memoryview(data)[_HEAD.size :]
    if hashlib.sha256(body).digest() != digest:
        raise CheckpointError("checkpoint checksum mismatch (damaged or truncated)")
    return body


def loads(data: bytes, kind: str | None = None) -> Any:
    """The state a checkpoint holds (``kind``: the kind it must be). ``CheckpointError`` for
    anything but a whole, valid record of this format's major version."""
    body = check(data)
    try:
        (n,) = _LEN.unpack_from(body)
        head = orjson.loads(_header(body[_LEN.size : _LEN.size + n]))
        if not isinstance(head, dict):
            raise CheckpointError("checkpoint header is not a JSON object")
        if kind is not None and head.get("kind") != kind:
            raise CheckpointError(f"a {head.get('kind')!r} checkpoint, expected {kind!r}")
        blobs: list[memoryview] = []
        at = _LEN.size + n
        for _how, size in head["blobs"]:
            if not isinstance(size, int) or size < 0 or at + size > len(body):
                raise CheckpointError("checkpoint blob table does not match its body")
            blobs.append(body[at : at + size])
            at += size
        return _Decoder(blobs).dec(head["root"])
    except CheckpointError:
        raise
    except RecursionError as e:
        raise CheckpointError("checkpoint nested too deeply") from e
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError, IndexError) as e:
        raise CheckpointError(f"checkpoint malformed: {type(e).__name__}: {e}") from e
    except (pl.exceptions.PolarsError, OSError) as e:
        raise CheckpointError(f"checkpoint frame unreadable: {e}") from e


def _header(raw: memoryview) -> bytes:
    """The JSON header: as it is, or zlib-compressed (at most ``MAX_HEADER`` once inflated)."""
    if raw[:1] == b"{":
        return bytes(raw)
    if raw[:1] != b"\x78":
        raise CheckpointError("checkpoint header is neither JSON nor zlib")
    z = zlib.decompressobj()
    try:
        out = z.decompress(raw, MAX_HEADER)
    except zlib.error as e:
        raise CheckpointError(f"checkpoint header does not inflate: {e}") from e
    if z.unconsumed_tail or not z.eof:
        raise CheckpointError("checkpoint header too large or cut short")
    return out


class _Decoder:
    def __init__(self, blobs: list[memoryview]) -> None:
        self.blobs = blobs
        self.memo: dict[int, Any] = {}
        self.table = _table()
        self.adapters = {name: back for name, _, back in _adapters().values()}
        self.fresh = _detector_classes()
        self.tags: dict[str, Callable[[list[Any]], Any]] = {
            "$l": lambda v: [self.dec(x) for x in v[1:]],
            "$t": lambda v: tuple(self.dec(x) for x in v[1:]),
            "$s": lambda v: {self.dec(x) for x in v[1:]},
            "$z": lambda v: frozenset(self.dec(x) for x in v[1:]),
            "$d": self._dict,
            "$q": lambda v: collections.deque((self.dec(x) for x in v[2:]), _maxlen(v[1])),
            "$C": lambda v: collections.Counter(self._mapping(v[1])),
            "$f": _nonfinite,
            "$i": lambda v: int(_str(v[1])),
            "$b": lambda v: base64.b64decode(_str(v[1]), validate=True),
            "$re": lambda v: re.compile(_str(v[1]), int(v[2])),
            "$n": lambda v: _dtype(v[1]).type(self.dec(v[2])),
            "$D": lambda v: _dtype(v[1]),
            "$r": self._ref,
            "$A": self._array,
            "$F": self._frame,
            "$S": lambda v: self._frame(v).to_series(0),
            "$o": self._object,
            "$T": self._topology,
            "$N": self._named_tuple,
        }

    def dec(self, v: Any) -> Any:
        t = type(v)
        if t is list:
            if v and type(v[0]) is str and v[0][:1] == "$":
                f = self.tags.get(v[0])
                if f is None:
                    raise CheckpointError(f"checkpoint holds an unknown tag {v[0]!r}")
                return f(v)
            return [self.dec(x) for x in v]
        if t is dict:
            return {k: self.dec(x) for k, x in v.items()}
        return v

    def _mapping(self, v: Any) -> dict[Any, Any]:
        d = self.dec(v)
        if not isinstance(d, dict):
            raise CheckpointError("checkpoint: a mapping expected")
        return d

    def _dict(self, v: list[Any]) -> dict[Any, Any]:
        if len(v) % 2 != 1:
            raise CheckpointError("checkpoint: a mapping with an odd item count")
        dec = self.dec
        return {dec(v[i]): dec(v[i + 1]) for i in range(1, len(v), 2)}

    def _ref(self, v: list[Any]) -> Any:
        try:
            return self.memo[v[1]]
        except (KeyError, TypeError):
            raise CheckpointError(f"checkpoint refers to an unknown object {v[1]!r}") from None

    def _array(self, v: list[Any]) -> Any:
        _, i, blob, dtype, shape = v
        dt = _dtype(dtype)
        if not all(isinstance(n, int) and n >= 0 for n in shape):
            raise CheckpointError("checkpoint: a bad array shape")
        raw = self.blobs[blob]
        if math.prod(shape) * dt.itemsize != len(raw):
            raise CheckpointError("checkpoint: an array's size does not match its blob")
        arr = np.frombuffer(raw, dtype=dt).astype(dt.newbyteorder("="), copy=True)
        self.memo[i] = arr = arr.reshape(shape)
        return arr

    def _frame(self, v: list[Any]) -> pl.DataFrame:
        _, i, blob = v
        f = pl.read_ipc(io.BytesIO(self.blobs[blob]))
        self.memo[i] = f
        return f

    def _detector(self, cls: Any, i: int, state: Any) -> Any:
        """A detector is made as the pipeline makes one, from its topology and config, and its
        state laid over that: what it gained since the record was written keeps the value a
        new detector starts with."""
        st = self.dec(state)
        if not isinstance(st, dict) or not all(type(k) is str for k in st):
            raise CheckpointError(f"checkpoint: the state of a {cls.__name__} is not a mapping")
        from rocewatch.topology import Topology

        topology, config = st.get("topology"), st.get("config")
        if not isinstance(topology, Topology) or type(config) is not self.fresh[cls]:
            raise CheckpointError(f"checkpoint: a {cls.__name__} without topology or config")
        obj = cls(topology, config)
        if _custom_getstate(cls) and hasattr(cls, "__setstate__"):
            obj.__setstate__(st)
        else:
            obj.__dict__.update(st)
        self.memo[i] = obj
        return obj

    def _topology(self, v: list[Any]) -> Any:
        # encoded apart, with its own reference numbers (``_Encoder._topology``)
        _, i, state = v
        obj = _Decoder(self.blobs)._object(["$o", 0, _TOPOLOGY, state])
        self.memo[i] = obj
        return obj

    def _named_tuple(self, v: list[Any]) -> Any:
        cls = self.table.get(v[1])
        if cls is None or not issubclass(cls, tuple):
            raise CheckpointError(f"checkpoint names a class not allowed here: {v[1]!r}")
        return tuple.__new__(cls, [self.dec(x) for x in v[2:]])

    def _object(self, v: list[Any]) -> Any:
        _, i, name, state = v
        back = self.adapters.get(name)
        if back is not None:
            obj = back(self.dec(state))
            self.memo[i] = obj
            return obj
        cls: Any = self.table.get(name)
        if cls is None:
            raise CheckpointError(f"checkpoint names a class not allowed here: {name!r}")
        if cls in self.fresh:
            return self._detector(cls, i, state)
        obj = cls.__new__(cls)
        self.memo[i] = obj  # before its state: the state may refer back to it
        st = self.dec(state)
        if _custom_getstate(cls) and hasattr(cls, "__setstate__"):
            obj.__setstate__(st)
            return obj
        if not isinstance(st, dict) or not all(type(k) is str for k in st):
            raise CheckpointError(f"checkpoint: the state of a {name} is not a mapping")
        slots = set(_slots(cls))
        if hasattr(obj, "__dict__"):
            obj.__dict__.update({k: x for k, x in st.items() if k not in slots})
        for k in slots & st.keys():
            object.__setattr__(obj, k, st[k])
        # a dataclass field added since the record was written takes its default
        for k, default in _defaults(cls):
            if k not in st:
                object.__setattr__(obj, k, default())
        return obj


_TOPOLOGY = "rocewatch.topology:Topology"
# each live topology's encoded state, with the jobs_version it was encoded at
_TOPOLOGIES: weakref.WeakKeyDictionary[Any, tuple[int, Any]] = weakref.WeakKeyDictionary()
_DEFAULTS: dict[type, list[tuple[str, Callable[[], Any]]]] = {}


def _defaults(cls: type) -> list[tuple[str, Callable[[], Any]]]:
    """A dataclass's fields that have a default, each with a maker of it."""
    d = _DEFAULTS.get(cls)
    if d is None:
        d = []
        for f in dataclasses.fields(cls) if dataclasses.is_dataclass(cls) else ():
            if f.default is not dataclasses.MISSING:
                d.append((f.name, functools.partial(_same, f.default)))
            elif f.default_factory is not dataclasses.MISSING:
                d.append((f.name, f.default_factory))
        _DEFAULTS[cls] = d
    return d


def _str(v: Any) -> str:
    if not isinstance(v, str):
        raise CheckpointError("checkpoint: a string expected")
    return v


def _maxlen(v: Any) -> int | None:
    if v is None or (isinstance(v, int) and v >= 0):
        return v
    raise CheckpointError("checkpoint: a bad deque length")


def _nonfinite(v: list[Any]) -> float:
    if v[1] not in ("nan", "inf", "-inf"):
        raise CheckpointError("checkpoint: a bad float")
    return float(v[1])


def _dtype(s: Any) -> np.dtype[Any]:
    dt = np.dtype(_str(s))
    if dt.kind not in _DTYPE_KINDS or dt.fields is not None or dt.subdtype is not None:
        raise CheckpointError(f"checkpoint: dtype {s!r} not allowed")
    return dt
