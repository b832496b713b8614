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

What a checkpoint holds is each part's ``state()``: data, never the parts themselves (their
configuration and topology come from the current configuration file at every start). A part
may keep small records (an alert, a detector's per-entity episode): it declares their classes,
and the writer and reader pass them as ``StateTypes``. A record is written as its type's name
and its fields (``__getstate__`` where the class defines one, ``__setstate__`` takes it back);
reading looks the name up in the types the reader gave, so no name in a record imports or calls
anything else, and no ``__reduce__`` is ever honoured. The codec itself knows no product class.

Compatibility: a build reads every record of its own major version; a record of another major
version is refused with ``checkpoint format vN not supported by this build (reads v2)``. Minor
versions add only what an older reader of the same major can ignore. Version 1 held the
pipeline's object graph (its configuration included) and is refused: the stage rebuilds from
its committed offsets.

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
import io
import math
import re
import struct
import zlib
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np
import orjson
import polars as pl

from rocewatch.core.errors import BadInput

MAGIC = b"RWCKPT"
FORMAT_MAJOR = 2
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


# --- the record types ------------------------------------------------------------------------


class StateTypes:
    """The record types a state may hold besides plain data, by name.

    A part that keeps small records (a detector's per-entity episode, an alert) declares their
    classes (``STATE_TYPES``); whoever writes or reads that part's state passes them here. The
    codec itself knows no product class: a record names a type by ``STATE_NAME`` (or the last
    part of its module and its qualified name), and reading looks the name up in the table the
    reader gave, so no name in a record imports or calls anything else. Configuration,
    topology and the parts themselves are never record types: they are built from the current
    configuration file at every start (``is_config`` refuses them here).

    >>> from collections import namedtuple
    >>> P = namedtuple("P", "x y")
    >>> StateTypes([P]).name(P)
    'checkpoint.P'
    """

    def __init__(self, classes: Iterable[type] = ()) -> None:
        self.by_name: dict[str, type] = {}
        self.names: dict[type, str] = {}
        for c in classes:
            self.add(c)

    @staticmethod
    def name(c: type) -> str:
        own = c.__dict__.get("STATE_NAME")
        if isinstance(own, str):
            return own
        return f"{c.__module__.rsplit('.', 1)[-1]}.{c.__qualname__}"

    def add(self, c: type) -> None:
        if c in self.names:
            return
        if issubclass(c, BaseException) or is_config(c):
            raise TypeError(f"{c.__qualname__} is configuration or an error, not state")
        n = self.name(c)
        other = self.by_name.get(n)
        if other is not None and other is not c:
            raise TypeError(f"two state types named {n!r}: {other!r} and {c!r}")
        self.by_name[n] = c
        self.names[c] = n

    def __or__(self, other: StateTypes) -> StateTypes:
        return StateTypes([*self.names, *other.names])

    def __len__(self) -> int:
        return len(self.names)


def is_config(c: type) -> bool:
    """Whether ``c`` is configuration (a ``...Config`` class, or one a config module defines):
    what the configuration file gives at every start, never what a checkpoint carries."""
    return c.__name__.endswith("Config") or c.__module__.rsplit(".", 1)[-1] == "config"


NO_TYPES = StateTypes()


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

    def __init__(self, copy_frames: bool, types: StateTypes = NO_TYPES) -> None:
        self.copy_frames = copy_frames
        self.memo: dict[int, int] = {}
        self.held: list[Any] = []  # alive while encoding: their ids stay theirs
        self.blobs: list[tuple[str, Any]] = []  # ("ipc", frame) or ("raw", bytes)
        self.names = types.names
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
                raise CheckpointError(f"{cls.__qualname__} is not a declared state type")
            return ["$N", name, *[self.enc(x) for x in v]]
        i = self._seen(v)
        if i is not None:
            return ["$r", i]
        name = self.names.get(cls)
        if name is None:
            raise CheckpointError(
                f"{cls.__module__}.{cls.__qualname__} is not a declared state type"
            )
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

    def __init__(
        self, obj: Any, kind: str, copy_frames: bool = True, types: StateTypes = NO_TYPES
    ) -> None:
        e = _Encoder(copy_frames, types)
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


def dumps(obj: Any, kind: str, types: StateTypes = NO_TYPES) -> bytes:
    """``obj`` as a checkpoint of ``kind`` (a name the reader checks: "detect-state", ...):
    plain data, and records of the ``types`` its parts declare."""
    return Snapshot(obj, kind, copy_frames=False, types=types).record()


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


def loads(data: bytes, kind: str | None = None, types: StateTypes = NO_TYPES) -> Any:
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
        return _Decoder(blobs, types).dec(head["root"])
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
    def __init__(self, blobs: list[memoryview], types: StateTypes = NO_TYPES) -> None:
        self.blobs = blobs
        self.memo: dict[int, Any] = {}
        self.table = types.by_name
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

    def _named_tuple(self, v: list[Any]) -> Any:
        cls = self.table.get(v[1])
        if cls is None or not issubclass(cls, tuple):
            raise CheckpointError(f"checkpoint names a type not declared here: {v[1]!r}")
        return tuple.__new__(cls, [self.dec(x) for x in v[2:]])

    def _object(self, v: list[Any]) -> Any:
        _, i, name, state = v
        cls: Any = self.table.get(name)
        if cls is None:
            raise CheckpointError(f"checkpoint names a type not declared here: {name!r}")
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
