"""The hash-to-slot table: stable small integers for the keys of a frame's rows, assigned to
every row at once.

Detectors keep per-key state in numpy arrays indexed by slot, so a step's rows update every
key without a join or a Python loop per row; only a key seen for the first time costs a Python
step. A row's slot is found from a 64-bit hash of its key columns by a vectorised binary search
of the sorted hashes of the known keys. Where the window engine gave the rows' series positions,
each position's slot is remembered, so rows of known series are neither hashed nor looked up
again (a series belongs to one key). Its state is its key list: the hashes are rebuilt on
restore, so a checkpoint survives a Polars upgrade.

``state.EntitySlots`` (device, port), ``baseline.KeySlots`` (device, port, qual) and the
isolation forest's series table are this table over their key columns.

>>> class Pairs(SlotTable[tuple[str, str]]):
...     COLUMNS = ("device", "port")
>>> s = Pairs()
>>> f = pl.DataFrame({"device": ["a", "b", "a"], "port": ["x", "x", "x"]})
>>> s.frame_slots(f).tolist(), s.keys, s.index[("b", "x")]
([0, 1, 0], [('a', 'x'), ('b', 'x')], 1)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar, Generic, TypeVar, cast

import numpy as np
import polars as pl

from detectors.windows import sorted_lookup

K = TypeVar("K", bound=tuple[str, ...])


class SlotTable(Generic[K]):
    """Slots for keys ``K`` (strings) of ``COLUMNS``."""

    COLUMNS: ClassVar[tuple[str, ...]] = ()
    SEED: ClassVar[int] = 0x5EED

    def __init__(self) -> None:
        self.keys: list[K] = []
        self.index: dict[K, int] = {}
        self._sorted = np.empty(0, dtype=np.uint64)
        self._order = np.empty(0, dtype=np.int64)
        self._forget_positions()

    def __len__(self) -> int:
        return len(self.keys)

    def __getstate__(self) -> list[K]:
        return self.keys

    def __setstate__(self, keys: list[K]) -> None:
        self.keys = [cast(K, tuple(k)) for k in keys]
        self._forget_positions()
        self._rebuild()

    @classmethod
    def hash_expr(cls) -> pl.Expr:
        """The hash of a row's key columns."""
        return pl.struct(*cls.COLUMNS).hash(seed=cls.SEED)

    @classmethod
    def hashes(cls, frame: pl.DataFrame) -> np.ndarray:
        """The hash of every row of ``frame`` (its key columns)."""
        return frame.select(cls.hash_expr()).to_series().to_numpy()

    def _forget_positions(self, epoch: int | None = None) -> None:
        # the slot of each window-engine series position (-1: not looked up yet); a cache
        self._epoch = epoch
        self._by_pos = np.empty(0, dtype=np.int64)

    def _lookup(self, h: np.ndarray) -> np.ndarray:
        if len(self._sorted) == 0:
            return np.full(len(h), -1, dtype=np.int64)
        return sorted_lookup(self._sorted, self._order, h)

    def _rebuild(self) -> None:
        self.index = {k: i for i, k in enumerate(self.keys)}
        if not self.keys:
            self._sorted = np.empty(0, dtype=np.uint64)
            self._order = np.empty(0, dtype=np.int64)
            return
        cols = list(zip(*self.keys, strict=True))
        h = self.hashes(
            pl.DataFrame(
                {c: list(v) for c, v in zip(self.COLUMNS, cols, strict=True)},
                schema=dict.fromkeys(self.COLUMNS, pl.String()),
            )
        )
        self._order = np.argsort(h, kind="stable").astype(np.int64)
        self._sorted = h[self._order]

    def slot(self, key: K) -> int:
        """The slot of one key, assigned if new."""
        i = self.index.get(key)
        if i is None:
            self.keys.append(key)
            self._rebuild()
            i = self.index[key]
        return i

    def slots(
        self, h: np.ndarray, keys_of: Callable[[np.ndarray], list[K]]
    ) -> tuple[np.ndarray, list[K]]:
        """The slot of every row by its hash ``h`` (``hash_expr``), and the keys seen for the
        first time (``keys_of(row indices)`` names them; only new keys cost a Python step)."""
        slots = self._lookup(h)
        missing = np.flatnonzero(slots < 0)
        new: list[K] = []
        if len(missing):
            _, first = np.unique(h[missing], return_index=True)
            new = keys_of(missing[np.sort(first)])
            self.keys += new
            self._rebuild()
            slots = self._lookup(h)
        return slots, new

    def frame_slots(self, frame: pl.DataFrame) -> np.ndarray:
        """The slot of every row of ``frame`` (its ``COLUMNS``)."""
        if frame.height == 0:
            return np.empty(0, dtype=np.int64)
        keys = frame.select(self.COLUMNS)

        def keys_of(idx: np.ndarray) -> list[K]:
            return [cast(K, tuple(str(x) for x in r)) for r in keys[idx.tolist()].iter_rows()]

        return self.slots(self.hashes(keys), keys_of)[0]

    def at_positions(
        self, positions: tuple[int, np.ndarray], slots_of: Callable[[np.ndarray], np.ndarray]
    ) -> np.ndarray:
        """The slot of every row whose window-engine series positions are ``(epoch,
        positions)``: remembered per position; ``slots_of(row indices)`` finds the others."""
        epoch, pos = positions
        if epoch != self._epoch:
            self._forget_positions(epoch)
        if len(pos) and int(pos.max()) >= len(self._by_pos):
            grow = np.full(int(pos.max()) + 1 - len(self._by_pos), -1, dtype=np.int64)
            self._by_pos = np.concatenate([self._by_pos, grow])
        slots = self._by_pos[pos]
        miss = np.flatnonzero(slots < 0)
        if len(miss):
            found = slots_of(miss)
            slots[miss] = found
            self._by_pos[pos[miss]] = found
        return slots
