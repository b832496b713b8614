"""INT Telemetry Report v2.0 (CONTRACTS.md section 4): parse UDP payloads, and build them.

Wire layout used here (all fields big-endian). Details that could not be checked against the
P4.org Telemetry Report v2.0 text while writing this are marked (*); every offset and width lives
in the constants below and in ``_MD_FIELDS``, so a correction is a one-place change.

Telemetry group header, ``GROUP_HDR_LEN`` = 12 bytes::

    word 0: Ver(4) = 2 | HW_ID(6) | Sequence Number(22)
    word 1: Node ID(32)                          -> the switch (topology ``int_node_id``)
    word 2: Rep Length(16) | Rsvd(16)  (*)       Rep Length = 4-byte words of individual
                                                 reports following this header (*)

Individual report header, ``IND_HDR_LEN`` = 12 bytes::

    word 0: RepType(4) | InType(4) | Report Length(8) | MD Length(8) | D Q F I(4) | Rsvd(4)
    word 1: RepMdBits(16) | Domain Specific ID(16)
    word 2: DSMdBits(16) | DSMdStatus(16)

    Report Length = 4-byte words after this 12-byte header (metadata + any inner packet) (*)
    MD Length     = 4-byte words of metadata (standard + domain specific) at the start of them

Only RepType 1 (INT) is decoded; other report types are skipped (counted, not malformed).
Metadata follows in RepMdBits order, bit 0 = most significant bit of the 16-bit field as in
the INT spec's instruction bitmap (*: bit 0 is the MSB, ``0x8000``):

    bit0 level-1 ingress port id(16) + egress port id(16)   4 bytes
    bit1 hop latency (ns, 32)                               4 bytes
    bit2 queue id(8) + queue occupancy(24, cells)           4 bytes
    bit3 ingress timestamp(64)                              8 bytes
    bit4 egress timestamp(64)                               8 bytes
    bit5 level-2 ingress(32) + egress(32) port ids          8 bytes (skipped over, not output)
    bit6 egress tx utilisation(32)                          4 bytes (skipped over, not output)
    bit7 buffer id(8) + buffer occupancy(24, cells)         4 bytes
    bits 8-15                                               not decoded; they come after the
                                                            known ones, so MD Length covers them

A report is malformed when its MD Length is shorter than the metadata its known RepMdBits need,
or when it runs past the group's Rep Length or the datagram; a group header with the wrong
version or a datagram too short for it is malformed as a whole. Everything malformed is counted
in ``InbandStats`` and skipped; ``parse_datagrams`` never raises on input bytes.

Occupancy is left in cells (the switch's ``int_cell_bytes`` converts it); hop latency in ns.
Parsing is batched and vectorised (``parse_buffer``): the headers of every datagram in a batch
are walked together, one numpy step per report position, then the metadata fields of all
reports sharing one RepMdBits value are gathered with numpy at fixed offsets.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import polars as pl

# ---- layout: the one place to change ---------------------------------------------------------
TR_VERSION = 2
REPTYPE_INT = 1
GROUP_HDR_LEN = 12
IND_HDR_LEN = 12
WORD = 4
DEFAULT_PORT = 32766


def md_bit(n: int) -> int:
    """RepMdBits mask of metadata bit ``n`` (bit 0 = MSB of the 16-bit field)."""
    return 1 << (15 - n)


# metadata bit -> (size in bytes, [(column, byte offset inside the item, width in bytes)])
_MD_FIELDS: dict[int, tuple[int, list[tuple[str, int, int]]]] = {
    0: (4, [("ingress_port", 0, 2), ("egress_port", 2, 2)]),
    1: (4, [("hop_latency_ns", 0, 4)]),
    2: (4, [("queue_id", 0, 1), ("queue_occupancy_cells", 1, 3)]),
    3: (8, [("ingress_ts", 0, 8)]),
    4: (8, [("egress_ts", 0, 8)]),
    5: (8, []),
    6: (4, []),
    7: (4, [("buffer_id", 0, 1), ("buffer_occupancy_cells", 1, 3)]),
}
_KNOWN_MASK = sum(md_bit(b) for b in _MD_FIELDS)
# ----------------------------------------------------------------------------------------------

REPORT_SCHEMA: dict[str, Any] = {
    "node_id": pl.UInt32,
    "seq": pl.UInt32,
    "hw_id": pl.UInt8,
    "ingress_port": pl.UInt16,
    "egress_port": pl.UInt16,
    "hop_latency_ns": pl.UInt32,
    "queue_id": pl.UInt8,
    "queue_occupancy_cells": pl.UInt32,
    "buffer_id": pl.UInt8,
    "buffer_occupancy_cells": pl.UInt32,
    "ingress_ts": pl.UInt64,
    "egress_ts": pl.UInt64,
}
_MD_COLUMNS = [c for c in REPORT_SCHEMA if c not in ("node_id", "seq", "hw_id")]


@dataclass
class InbandStats:
    """Counters of one or more ``parse_datagrams`` calls (``merge`` adds them up)."""

    datagrams: int = 0
    reports: int = 0  # INT reports decoded into rows
    malformed_datagrams: int = 0  # too short for the group header, wrong version, bad Rep Length
    truncated_reports: int = 0  # report header or body past the group / datagram end
    malformed_reports: int = 0  # MD Length too short for the RepMdBits
    skipped_reptype: int = 0  # well-formed reports of a RepType other than 1
    trailing_bytes: int = 0  # datagrams with bytes after the group's Rep Length

    def merge(self, other: InbandStats) -> None:
        for name in self.__dataclass_fields__:
            setattr(self, name, getattr(self, name) + getattr(other, name))


def empty_reports() -> pl.DataFrame:
    return pl.DataFrame(schema=REPORT_SCHEMA)


def _md_layout(bits: int) -> tuple[int, dict[str, tuple[int, int]]]:
    """Known metadata length in bytes for ``bits`` and column -> (offset, width)."""
    off = 0
    cols: dict[str, tuple[int, int]] = {}
    for b, (size, fields) in _MD_FIELDS.items():
        if bits & md_bit(b):
            for name, rel, width in fields:
                cols[name] = (off + rel, width)
            off += size
    return off, cols


_LAYOUT_CACHE: dict[int, tuple[int, dict[str, tuple[int, int]]]] = {}


def _layout(bits: int) -> tuple[int, dict[str, tuple[int, int]]]:
    got = _LAYOUT_CACHE.get(bits)
    if got is None:
        got = _LAYOUT_CACHE[bits] = _md_layout(bits)
    return got


_SPAN = {w: np.arange(w, dtype=np.int64) for w in range(1, 9)}
_POW2 = {1: 1, 2: 2, 3: 4, 4: 4, 5: 8, 6: 8, 7: 8, 8: 8}


def _be(buf: np.ndarray, idx: np.ndarray, width: int) -> np.ndarray:
    """Big-endian unsigned integers of ``width`` bytes at byte offsets ``idx``.

    One gather of a (n, width) byte matrix, viewed as big-endian words: the dtype is the
    native unsigned type of the next power-of-two width.
    """
    g = buf[idx[:, None] + _SPAN[width]]
    w = _POW2[width]
    if w != width:
        g = np.concatenate([np.zeros((g.shape[0], w - width), dtype=np.uint8), g], axis=1)
    return g.view(f">u{w}").ravel().astype(f"u{w}")


def _need_table() -> np.ndarray:
    """Known metadata bytes for every RepMdBits value (65536 entries)."""
    bits = np.arange(1 << 16, dtype=np.int64)
    need = np.zeros(1 << 16, dtype=np.int64)
    for b, (size, _) in _MD_FIELDS.items():
        need += np.where(bits & md_bit(b), size, 0)
    return need


_NEED = _need_table()


def parse_datagrams(
    payloads: Sequence[bytes], stats: InbandStats | None = None
) -> tuple[pl.DataFrame, InbandStats]:
    """Decode UDP payloads into one row per INT report (schema ``REPORT_SCHEMA``).

    Fields the report's RepMdBits did not carry are null. Rows keep datagram/report order.
    ``stats`` (new if None) is updated and returned.
    """
    lens = np.fromiter((len(p) for p in payloads), dtype=np.int64, count=len(payloads))
    starts = np.zeros(len(payloads), dtype=np.int64)
    if len(payloads) > 1:
        np.cumsum(lens[:-1], out=starts[1:])
    buf = np.frombuffer(b"".join(payloads), dtype=np.uint8)
    return parse_buffer(buf, starts, lens, stats)


def parse_buffer(
    buf: np.ndarray,
    starts: np.ndarray,
    lens: np.ndarray,
    stats: InbandStats | None = None,
) -> tuple[pl.DataFrame, InbandStats]:
    """Decode datagrams that lie in one byte buffer (pcap chunk, receive ring) into report rows.

    Datagram ``i`` is ``buf[starts[i] : starts[i] + lens[i]]``; ``starts`` must increase (rows
    come out in datagram order). Nothing is copied per datagram: the headers of all datagrams
    are walked together, one numpy step per report position, so the Python work grows with the
    most reports one datagram holds, not with the number of datagrams.
    """
    st = stats if stats is not None else InbandStats()
    n = int(starts.shape[0])
    st.datagrams += n
    if n == 0:
        return empty_reports(), st
    starts = starts.astype(np.int64, copy=False)
    lens = lens.astype(np.int64, copy=False)
    room = lens >= GROUP_HDR_LEN
    s = starts[room]
    size = lens[room]
    w0 = _be(buf, s, 4).astype(np.uint64)
    rep_words = _be(buf, s + 8, 2).astype(np.int64)
    end = GROUP_HDR_LEN + rep_words * WORD
    good = ((w0 >> np.uint64(28)) == TR_VERSION) & (end <= size)
    st.malformed_datagrams += n - int(np.count_nonzero(good))
    st.trailing_bytes += int(np.count_nonzero(good & (end < size)))
    s, end, w0 = s[good], end[good], w0[good]
    node_g = _be(buf, s + 4, 4).astype(np.uint32)
    seq_g = (w0 & np.uint64(0x3FFFFF)).astype(np.uint32)
    hw_g = ((w0 >> np.uint64(22)) & np.uint64(0x3F)).astype(np.uint8)
    dg_end = s + end
    cur = s + GROUP_HDR_LEN
    dg = np.arange(s.shape[0], dtype=np.int64)
    found_off: list[np.ndarray] = []
    found_dg: list[np.ndarray] = []
    found_bits: list[np.ndarray] = []
    while cur.shape[0]:
        live = cur < dg_end
        if not live.all():
            cur, dg, dg_end = cur[live], dg[live], dg_end[live]
            if not cur.shape[0]:
                break
        fits = cur + IND_HDR_LEN <= dg_end
        body = cur + IND_HDR_LEN
        rep_len = buf[np.minimum(cur + 1, buf.shape[0] - 1)].astype(np.int64)
        nxt = body + rep_len * WORD
        fits &= nxt <= dg_end
        if not fits.all():
            st.truncated_reports += int(np.count_nonzero(~fits))
            cur, dg, dg_end, body, rep_len, nxt = (
                cur[fits],
                dg[fits],
                dg_end[fits],
                body[fits],
                rep_len[fits],
                nxt[fits],
            )
        b0 = buf[cur]
        md_len = buf[cur + 2].astype(np.int64)
        bits = _be(buf, cur + 4, 2).astype(np.int64)
        bad_md = md_len > rep_len
        other = ~bad_md & ((b0 >> 4) != REPTYPE_INT)
        short = ~bad_md & ~other & (_NEED[bits] > md_len * WORD)
        ok = ~(bad_md | other | short)
        st.malformed_reports += int(np.count_nonzero(bad_md | short))
        st.skipped_reptype += int(np.count_nonzero(other))
        found_off.append(body[ok])
        found_dg.append(dg[ok])
        found_bits.append(bits[ok])
        cur = nxt
    offs = np.concatenate(found_off) if found_off else np.zeros(0, dtype=np.int64)
    if not offs.shape[0]:
        return empty_reports(), st
    dgs = np.concatenate(found_dg)
    bits_all = np.concatenate(found_bits)
    if len(found_off) > 1:  # report-position-major -> datagram/report order
        order = np.argsort(offs, kind="stable")
        offs, dgs, bits_all = offs[order], dgs[order], bits_all[order]
    m = int(offs.shape[0])
    st.reports += m
    cols: dict[str, pl.Series] = {
        "node_id": pl.Series("node_id", node_g[dgs]),
        "seq": pl.Series("seq", seq_g[dgs]),
        "hw_id": pl.Series("hw_id", hw_g[dgs]),
    }
    uniq = np.unique(bits_all)
    values: dict[str, np.ndarray] = {}
    valid: dict[str, np.ndarray | None] = {}
    for b in uniq.tolist():
        _, lay = _layout(int(b))
        if uniq.shape[0] == 1:
            sel: np.ndarray | None = None
            o = offs
        else:
            sel = np.flatnonzero(bits_all == b)
            o = offs[sel]
        for name, (rel, width) in lay.items():
            v = _be(buf, o + rel, width)
            if sel is None:
                values[name] = v
                valid[name] = None
                continue
            if name not in values:
                values[name] = np.zeros(m, dtype=np.uint64)
                valid[name] = np.zeros(m, dtype=bool)
            values[name][sel] = v
            mask = valid[name]
            assert mask is not None
            mask[sel] = True
    for name in _MD_COLUMNS:
        dtype = REPORT_SCHEMA[name]
        if name not in values:
            cols[name] = pl.Series(name, [None], dtype=dtype).extend_constant(None, m - 1)
            continue
        ser = pl.Series(name, values[name]).cast(dtype)
        mask = valid[name]
        if mask is not None and not mask.all():
            ser = pl.select(pl.when(pl.Series(mask)).then(ser).otherwise(None)).to_series()
            ser = ser.alias(name)
        cols[name] = ser
    return pl.DataFrame([cols[c] for c in REPORT_SCHEMA]), st


# ---- builder (tests, simulator) --------------------------------------------------------------


@dataclass
class ReportMetadata:
    """One node's INT metadata; the fields that are set decide RepMdBits."""

    ingress_port: int | None = None
    egress_port: int | None = None
    hop_latency_ns: int | None = None
    queue_id: int | None = None
    queue_occupancy_cells: int | None = None
    ingress_ts: int | None = None
    egress_ts: int | None = None
    buffer_id: int | None = None
    buffer_occupancy_cells: int | None = None


def _encode_md(md: ReportMetadata) -> tuple[int, bytes]:
    bits = 0
    out = bytearray()
    if md.ingress_port is not None or md.egress_port is not None:
        bits |= md_bit(0)
        out += struct.pack(">HH", md.ingress_port or 0, md.egress_port or 0)
    if md.hop_latency_ns is not None:
        bits |= md_bit(1)
        out += struct.pack(">I", md.hop_latency_ns)
    if md.queue_id is not None or md.queue_occupancy_cells is not None:
        bits |= md_bit(2)
        out += struct.pack(">I", ((md.queue_id or 0) << 24) | (md.queue_occupancy_cells or 0))
    if md.ingress_ts is not None:
        bits |= md_bit(3)
        out += struct.pack(">Q", md.ingress_ts)
    if md.egress_ts is not None:
        bits |= md_bit(4)
        out += struct.pack(">Q", md.egress_ts)
    if md.buffer_id is not None or md.buffer_occupancy_cells is not None:
        bits |= md_bit(7)
        out += struct.pack(">I", ((md.buffer_id or 0) << 24) | (md.buffer_occupancy_cells or 0))
    return bits, bytes(out)


def build_report(
    node_id: int,
    seq: int,
    reports: Iterable[ReportMetadata | Mapping[str, int]] = (),
    *,
    hw_id: int = 0,
    rep_type: int = REPTYPE_INT,
) -> bytes:
    """Encode one Telemetry Report v2.0 datagram (group header + individual reports).

    ``reports`` items are ``ReportMetadata`` or mappings of its field names.
    """
    body = bytearray()
    for r in reports:
        md = r if isinstance(r, ReportMetadata) else ReportMetadata(**r)
        bits, mdb = _encode_md(md)
        words = len(mdb) // WORD
        body += struct.pack(">BBBBHHHH", (rep_type & 0xF) << 4, words, words, 0, bits, 0, 0, 0)
        body += mdb
    w0 = (TR_VERSION << 28) | ((hw_id & 0x3F) << 22) | (seq & 0x3FFFFF)
    return struct.pack(">IIHH", w0, node_id & 0xFFFFFFFF, len(body) // WORD, 0) + bytes(body)
