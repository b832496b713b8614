"""Series keys as integers inside one process: the key strings once, each row as codes.

A telemetry message carries its key strings once (its dictionary) and each row as indices into
it. Gathering four strings per sample to rebuild the key, then hashing them back into a series
id, was the largest cost of reading telemetry at fabric scale. Here every key string a process
decodes gets one code and its hash, once; a sample frame can then carry its key as four UInt32
code columns and its series id (``sid``) as the same hash mix ``detectors.rates.series_ids``
computes from the strings. The strings come back only for what needs them: a series seen for
the first time, or a checkpoint (codes are valid only in the process that made them).

The table grows with the distinct key strings (devices, ports, queues, metrics): thousands on
a large fabric, bounded by the same inventory the series table holds. Telemetry naming ever
new strings cannot grow it without end: past ``limit`` strings a dictionary with new ones gets
no codes (``codes`` returns None) and its message is read as strings, where the window
engine's series limit (``window.max_series``) drops what is new.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence

import numpy as np
import polars as pl

from rocewatch.core.model import SERIES_KEY

_MIX = np.uint64(0x9E3779B97F4A7C15)  # odd: multiplying by it permutes 64-bit words
_FMIX1 = np.uint64(0xFF51AFD7ED558CCD)
_FMIX2 = np.uint64(0xC4CEB9FE1A85EC53)
_S33 = np.uint64(33)
_DICT_CACHE = 4096  # message dictionaries remembered (a collector sends the same one each time)
MAX_STRINGS = 1_000_000  # key strings one process codes (about 100 bytes each)
log = logging.getLogger(__name__)


def mix(hashes: Sequence[np.ndarray]) -> np.ndarray:
    """The series id from the per-column hashes of the key strings (``SERIES_KEY`` order).

    The combination depends on the order of the columns (a device name in ``port`` gives another
    id) and ends with a 64-bit finaliser so that ids spread over the whole range (they are sorted
    and searched)."""
    h = np.zeros(len(hashes[0]) if hashes else 0, dtype=np.uint64)
    for col in hashes:
        h *= _MIX
        h += col
    h ^= h >> _S33
    h *= _FMIX1
    h ^= h >> _S33
    h *= _FMIX2
    h ^= h >> _S33
    return h


def string_hashes(col: pl.Series) -> np.ndarray:
    """Each string's 64-bit hash (Polars, seed 0): a function of the string alone."""
    return col.cast(pl.String).hash(seed=0).to_numpy()


def is_coded(frame: pl.DataFrame) -> bool:
    """True for a sample frame whose key columns are codes into ``KEYS``."""
    return frame.schema.get("device") == pl.UInt32


class KeyTable:
    """Every key string seen by this process: its code (its place here) and its hash."""

    def __init__(self, limit: int = MAX_STRINGS) -> None:
        self.limit = limit
        self.refused = 0  # dictionaries left uncoded because the table was full
        self._refused_logged = -float("inf")
        self.strings: list[str] = []
        self.hashes = np.empty(0, dtype=np.uint64)
        self._index: dict[str, int] = {}
        self._dicts: dict[tuple[str, ...], np.ndarray] = {}
        self._series: pl.Series | None = None  # ``strings`` as a Series (rebuilt as it grows)
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self.strings)

    def codes(self, strings: Sequence[str]) -> np.ndarray | None:
        """The code of each string (UInt32), adding the ones not seen before; None when that
        would take the table past ``limit`` (the caller reads those strings as strings)."""
        key = tuple(strings)
        hit = self._dicts.get(key)
        if hit is not None:
            return hit
        index = self._index
        if any(s not in index for s in key):
            with self._lock:  # services in threads of one process share the table
                new = [s for s in dict.fromkeys(key) if s not in index]
                if len(self.strings) + len(new) > self.limit:
                    self._refuse()
                    return None
                hashes = string_hashes(pl.Series(new, dtype=pl.String))
                self.hashes = np.concatenate([self.hashes, hashes])  # before the codes exist
                for s in new:
                    index[s] = len(self.strings)
                    self.strings.append(s)
        out = np.fromiter((index[s] for s in key), dtype=np.uint32, count=len(key))
        if len(self._dicts) >= _DICT_CACHE:
            self._dicts.clear()
        self._dicts[key] = out
        return out

    def _refuse(self) -> None:
        self.refused += 1
        now = time.monotonic()
        if now - self._refused_logged >= 60.0:
            self._refused_logged = now
            log.warning(
                "key table full (%d strings): messages naming new devices, ports or metrics "
                "are read as strings (%d so far)",
                self.limit,
                self.refused,
            )

    def column(self, name: str, codes: pl.Series | np.ndarray) -> pl.Series:
        """Codes -> their strings (a null code stays null)."""
        table = self._series
        if table is None or table.len() != len(self.strings):
            table = self._series = pl.Series("s", list(self.strings), dtype=pl.String)
        codes = pl.Series(codes) if isinstance(codes, np.ndarray) else codes
        if codes.len() and int(codes.max()) >= table.len():  # type: ignore[arg-type]
            raise ValueError(f"{name}: a key code past the table of {table.len()}")
        return table.gather(codes).alias(name)

    def decode(self, frame: pl.DataFrame) -> pl.DataFrame:
        """A frame with coded key columns -> the same with strings (and no ``sid``)."""
        if not is_coded(frame):
            return frame
        cols = [self.column(c, frame.get_column(c)) for c in SERIES_KEY if c in frame.columns]
        return frame.with_columns(cols).drop("sid", strict=False)

    def concat(self, frames: list[pl.DataFrame]) -> pl.DataFrame:
        """Frames one after another; where coded and string frames meet (strings restored from
        a checkpoint, codes read since), the coded ones as strings."""
        if len({is_coded(f) for f in frames}) > 1:
            frames = [self.decode(f) for f in frames]
        return pl.concat(frames, how="vertical", rechunk=False)


KEYS = KeyTable()
