"""INT Telemetry Report v2.0 (docs/formats.md section 4): parse UDP payloads, and build them.

The layout is P4.org's Telemetry Report Format Specification v2.0 (tagged 2020-05-25,
``telemetry/specs/telemetry_report.mdk`` in p4lang/p4-applications), as its text writes it;
``docs/formats/int.md`` goes through it rule by rule with the section each comes from. All
fields are big-endian; bit 0 is the most significant bit of a field.

Telemetry Report Group Header (section 3.2), ``GROUP_HDR_LEN`` = 8 octets, once per datagram::

    Ver(4) = 2 | hw_id(6) | Sequence Number(22)
    Node ID(32)                                   -> the switch (topology ``int_node_id``)

Individual reports follow it back to back up to the end of the datagram (there is no group
length; the UDP length bounds them). Individual Report Header (section 3.3)::

    RepType(4) | InType(4) | Report Length(8) | MD Length(8) | D Q F I(4) | Rsvd(4)
    -- main contents for RepType 1, INT (section 3.3.1):
    RepMdBits(16) | Domain Specific ID(16)
    DSMdBits(16)  | DSMdStatus(16)
    baseline metadata, in RepMdBits order; then domain specific metadata
    -- inner contents, as InType says: 0 none, 1 TLVs, 2 domain specific extension data,
       3 Ethernet, 4 IPv4, 5 IPv6 (a truncated copy of the packet)

    Report Length = 4-byte words of the report after its first word (main + inner contents)
    MD Length     = 4-byte words of baseline + domain specific metadata (not the two fixed words)

RepMdBits (``_MD_ITEMS``; 4 octets per bit, 8 for bits 4, 5 and 6)::

    bit 0       reserved                                      4, skipped (counted)
    bit 1       level-1 ingress(16) + egress(16) interface id 4
    bit 2       hop latency                                   4
    bit 3       queue id(8) + queue occupancy(24)             4
    bit 4       ingress timestamp                             8
    bit 5       egress timestamp                              8
    bit 6       level-2 ingress(32) + egress(32) interface id 8
    bit 7       egress port tx utilisation                    4
    bit 8       buffer id(8) + buffer occupancy(24)           4
    bits 9-14   reserved                                      4 each, skipped (counted)
    bit 15      queue id(8) + drop reason(8) + padding(16)    4

A metadata item whose 4 or 8 octets are all ones is "not available" (section 3.3.1): its
fields are null (counted in ``unavailable_md``). Domain specific metadata (Domain Specific ID
not 0) is skipped by MD Length (counted). Only RepType 1 reports become rows; other types are
skipped by Report Length (counted). Inner contents are skipped by Report Length; with
``inner=True`` the inner packet's 5-tuple (InType 3, 4, 5, or the first TLV of type Ethernet,
IPv4 or IPv6) comes out in the ``INNER_SCHEMA`` columns. A report is malformed when its Report
Length is shorter than its main contents or its MD Length shorter than its RepMdBits need, and
truncated when its header or Report Length runs past the datagram; a datagram shorter than the
group header or of another version is malformed as a whole. Everything is counted in
``InbandStats`` and skipped: ``parse_datagrams`` never raises on input bytes.

Occupancy is left in cells (the switch's ``int_cell_bytes`` converts it); hop latency in ns;
timestamps are taken as ns since the Unix epoch. ``rx_ts`` is the time the datagram was received
(live) or captured (pcap record), for reports that carry no timestamp of their own.

Parsing is batched and vectorised (``parse_buffer``): the headers of every datagram in a batch
are walked together, one numpy step per report position; then every metadata item is gathered
for all reports at once, at the offset its RepMdBits value puts it (a table per item).
"""

from __future__ import annotations

import ipaddress
import struct
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import polars as pl

from collector.inband.sequence import SequenceTracker

# ---- layout: the one place to change ---------------------------------------------------------
TR_VERSION = 2
REPTYPE_INNER_ONLY = 0
REPTYPE_INT = 1
INTYPE_NONE = 0
INTYPE_TLV = 1
INTYPE_DS_EXTENSION = 2
INTYPE_ETHERNET = 3
INTYPE_IPV4 = 4
INTYPE_IPV6 = 5
TLV_DS_EXTENSION = 0
TLV_ETHERNET = 1
TLV_IPV4 = 2
TLV_IPV6 = 3
GROUP_HDR_LEN = 8
REPORT_WORD0_LEN = 4  # RepType .. Rsvd: the word Report Length does not count
INT_FIXED_LEN = 8  # RepMdBits .. DSMdStatus: counted by Report Length, not by MD Length
IND_HDR_LEN = REPORT_WORD0_LEN + INT_FIXED_LEN
WORD = 4
DEFAULT_PORT = 32766
FLAG_D, FLAG_Q, FLAG_F, FLAG_I = 8, 4, 2, 1


def md_bit(n: int) -> int:
    """RepMdBits mask of metadata bit ``n`` (bit 0 = MSB of the 16-bit field)."""
    return 1 << (15 - n)


# RepMdBits bit -> (item size in octets, [(column, shift, width in bits)] inside the item)
_MD_ITEMS: dict[int, tuple[int, tuple[tuple[str, int, int], ...]]] = {
    0: (4, ()),  # reserved
    1: (4, (("ingress_port", 16, 16), ("egress_port", 0, 16))),
    2: (4, (("hop_latency_ns", 0, 32),)),
    3: (4, (("queue_id", 24, 8), ("queue_occupancy_cells", 0, 24))),
    4: (8, (("ingress_ts", 0, 64),)),
    5: (8, (("egress_ts", 0, 64),)),
    6: (8, (("l2_ingress_port", 32, 32), ("l2_egress_port", 0, 32))),
    7: (4, (("tx_utilization", 0, 32),)),
    8: (4, (("buffer_id", 24, 8), ("buffer_occupancy_cells", 0, 24))),
    **{b: (4, ()) for b in range(9, 15)},  # reserved
    15: (4, (("drop_queue_id", 24, 8), ("drop_reason", 16, 8))),  # then 16 bits of padding
}
RESERVED_MD_BITS = md_bit(0) | sum(md_bit(b) for b in range(9, 15))
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
    "l2_ingress_port": pl.UInt32,
    "l2_egress_port": pl.UInt32,
    "tx_utilization": pl.UInt32,
    "drop_queue_id": pl.UInt8,
    "drop_reason": pl.UInt8,
    "flags": pl.UInt8,  # D Q F I: D = 8, Q = 4, F = 2, I = 1
    "rx_ts": pl.Int64,  # datagram received / captured, ns since the epoch; null when unknown
}
# with parse_buffer(inner=True): the truncated inner packet's 5-tuple (null where absent)
INNER_SCHEMA: dict[str, Any] = {
    "inner_ip_version": pl.UInt8,
    "inner_src_ip": pl.String,
    "inner_dst_ip": pl.String,
    "inner_proto": pl.UInt8,
    "inner_src_port": pl.UInt16,
    "inner_dst_port": pl.UInt16,
}
_NP_DTYPE = {
    pl.UInt8: np.uint8,
    pl.UInt16: np.uint16,
    pl.UInt32: np.uint32,
    pl.UInt64: np.uint64,
}
_MD_COLUMNS = [c for _, (_, fields) in sorted(_MD_ITEMS.items()) for c, _, _ in fields]
_L4_WITH_PORTS = (6, 17, 132)  # TCP, UDP, SCTP: ports in the first 4 octets


@dataclass
class InbandStats:
    """Counters of one or more ``parse_datagrams`` calls (``merge`` adds them up)."""

    datagrams: int = 0
    reports: int = 0  # INT reports decoded into rows
    malformed_datagrams: int = 0  # shorter than the group header, or not version 2
    truncated_reports: int = 0  # report header or Report Length past the datagram end
    malformed_reports: int = 0  # Report Length < main contents, or MD Length < RepMdBits need
    skipped_reptype: int = 0  # well-formed reports of a RepType other than 1
    domain_specific_md: int = 0  # INT reports whose domain specific metadata was skipped
    reserved_md_bits: int = 0  # INT reports with reserved RepMdBits set (4 octets each skipped)
    unavailable_md: int = 0  # metadata items sent as all ones ("not available"): null fields

    def merge(self, other: InbandStats) -> None:
        for name in self.__dataclass_fields__:
            setattr(self, name, getattr(self, name) + getattr(other, name))


def empty_reports(inner: bool = False) -> pl.DataFrame:
    return pl.DataFrame(schema={**REPORT_SCHEMA, **(INNER_SCHEMA if inner else {})})


def _item_tables() -> tuple[np.ndarray, dict[int, np.ndarray]]:
    """Metadata bytes every RepMdBits value needs, and per item its offset for every value."""
    bits = np.arange(1 << 16, dtype=np.int64)
    need = np.zeros(1 << 16, dtype=np.int64)
    offset: dict[int, np.ndarray] = {}
    for b, (size, fields) in _MD_ITEMS.items():
        if fields:  # where item b starts: the sizes of the items before it
            offset[b] = need.astype(np.int16)
        need += np.where(bits & md_bit(b), size, 0)
    return need, offset


_NEED, _ITEM_OFF = _item_tables()
_SPAN = {w: np.arange(w, dtype=np.int64) for w in range(1, 9)}
_ALL_ONES = {4: np.uint32(0xFFFFFFFF), 8: np.uint64(0xFFFFFFFFFFFFFFFF)}


def _be(buf: np.ndarray, idx: np.ndarray, width: int) -> np.ndarray:
    """Big-endian unsigned integers of ``width`` (1, 2, 4 or 8) bytes at byte offsets ``idx``.

    One gather of a (n, width) byte matrix, viewed as big-endian words.
    """
    if width == 1:
        return buf[idx]
    g = buf[idx[:, None] + _SPAN[width]]
    return g.view(f">u{width}").ravel().astype(f"u{width}")


def parse_datagrams(
    payloads: Sequence[bytes],
    stats: InbandStats | None = None,
    *,
    rx_ts: Sequence[int] | np.ndarray | None = None,
    seq: SequenceTracker | None = None,
    inner: bool = False,
) -> tuple[pl.DataFrame, InbandStats]:
    """Decode UDP payloads into one row per INT report (schema ``REPORT_SCHEMA``).

    Fields the report's RepMdBits did not carry, or sent as "not available", are null. Rows keep
    datagram/report order. ``stats`` (new if None) is updated and returned; see ``parse_buffer``
    for the keyword arguments.
    """
    lens = np.fromiter((len(p) for p in payloads), dtype=np.int64, count=len(payloads))
    starts = np.zeros(len(payloads), dtype=np.int64)
    if len(payloads) > 1:
        np.cumsum(lens[:-1], out=starts[1:])
    buf = np.frombuffer(b"".join(payloads), dtype=np.uint8)
    rx = None if rx_ts is None else np.asarray(rx_ts, dtype=np.int64)
    return parse_buffer(buf, starts, lens, stats, rx_ts=rx, seq=seq, inner=inner)


def parse_buffer(
    buf: np.ndarray,
    starts: np.ndarray,
    lens: np.ndarray,
    stats: InbandStats | None = None,
    *,
    rx_ts: np.ndarray | None = None,
    seq: SequenceTracker | None = None,
    inner: bool = False,
) -> tuple[pl.DataFrame, InbandStats]:
    """Decode datagrams that lie in one byte buffer (pcap chunk, receive ring) into report rows.

    Datagram ``i`` is ``buf[starts[i] : starts[i] + lens[i]]``; ``starts`` must increase (rows
    come out in datagram order). ``rx_ts[i]`` (ns) is when datagram ``i`` was received or
    captured (the ``rx_ts`` column; null without it). ``seq`` is given the group header of
    every datagram of version 2, reports or not, to count lost ones. ``inner`` adds the
    ``INNER_SCHEMA`` columns. Nothing is copied per datagram: the headers of all datagrams are
    walked together, one numpy step per report position, so the Python work grows with the
    most reports one datagram holds, not with the number of datagrams.
    """
    st = stats if stats is not None else InbandStats()
    n = int(starts.shape[0])
    st.datagrams += n
    if n == 0:
        return empty_reports(inner), st
    starts = starts.astype(np.int64, copy=False)
    lens = lens.astype(np.int64, copy=False)
    dgi = np.flatnonzero(lens >= GROUP_HDR_LEN)
    w0 = _be(buf, starts[dgi], 4)
    good = (w0 >> 28) == TR_VERSION
    st.malformed_datagrams += n - int(np.count_nonzero(good))
    if not good.all():
        dgi, w0 = dgi[good], w0[good]
    s = starts[dgi]
    node_g = _be(buf, s + 4, 4)
    seq_g = w0 & np.uint32(0x3FFFFF)
    hw_g = ((w0 >> 22) & np.uint32(0x3F)).astype(np.uint8)
    if seq is not None:
        seq.update(node_g, hw_g, seq_g)
    walked = _walk(buf, s + GROUP_HDR_LEN, s + lens[dgi], st, inner)
    if walked is None:
        return empty_reports(inner), st
    offs, dgs, bits = walked[0], walked[1], walked[2]
    m = int(offs.shape[0])
    st.reports += m
    st.reserved_md_bits += int(np.count_nonzero(bits & RESERVED_MD_BITS))
    st.domain_specific_md += int(np.count_nonzero(_be(buf, offs + 6, 2)))
    cols: dict[str, pl.Series] = {
        "node_id": pl.Series("node_id", node_g[dgs]),
        "seq": pl.Series("seq", seq_g[dgs]),
        "hw_id": pl.Series("hw_id", hw_g[dgs]),
        "flags": pl.Series("flags", buf[offs + 3] >> 4),
    }
    cols.update(_metadata(buf, offs + IND_HDR_LEN, bits, st))
    if rx_ts is not None:
        cols["rx_ts"] = pl.Series("rx_ts", rx_ts.astype(np.int64, copy=False)[dgi[dgs]])
    out = [cols[c] if c in cols else _nulls(c, dt, m) for c, dt in REPORT_SCHEMA.items()]
    if inner:
        _, _, _, md_len, rep_len, in_type = walked
        start = offs + IND_HDR_LEN + md_len * WORD
        end = offs + REPORT_WORD0_LEN + rep_len * WORD
        out += _inner_columns(buf, start, end, in_type)
    return pl.DataFrame(out), st


_NULLS: dict[Any, pl.Series] = {}


def _nulls(name: str, dtype: Any, m: int) -> pl.Series:
    """``m`` nulls: a slice of one cached column per type (making one costs a query)."""
    s = _NULLS.get(dtype)
    if s is None or s.len() < m:
        s = _NULLS[dtype] = pl.repeat(None, max(m, 1 << 14), dtype=dtype, eager=True)
    return s.slice(0, m).alias(name)


def _walk(
    buf: np.ndarray, cur: np.ndarray, dg_end: np.ndarray, st: InbandStats, inner: bool
) -> tuple[np.ndarray, ...] | None:
    """Walk the individual reports of all datagrams together.

    Returns the INT reports' offsets, datagram indices and RepMdBits in buffer order (with
    ``inner`` also MD Length, Report Length and InType), or None when there are none. Once
    fewer than ``SCALAR_BELOW`` datagrams are left (eight times as many after 16 steps: their
    reports are small), the rest is walked one report at a time, as numpy's fixed cost per
    step would dominate: a small batch, or a datagram of two thousand empty reports that would
    cost a numpy step each.
    """
    dg = np.arange(cur.shape[0], dtype=np.int64)
    last = buf.shape[0] - 1
    found: list[list[np.ndarray]] = []
    steps = 0
    while cur.shape[0]:
        live = cur < dg_end
        if not live.all():
            cur, dg, dg_end = cur[live], dg[live], dg_end[live]
            if not cur.shape[0]:
                break
        steps += 1
        left = cur.shape[0]
        if left < SCALAR_BELOW or (steps > 16 and left < 8 * SCALAR_BELOW):
            found += _walk_scalar(buf, cur, dg, dg_end, st, inner)
            break
        rep_len = buf[np.minimum(cur + 1, last)].astype(np.int64)
        nxt = cur + REPORT_WORD0_LEN + rep_len * WORD
        fits = nxt <= dg_end  # also false when not even the first word fits
        if not fits.all():
            # the rest of such a datagram cannot be found: its walk ends here
            st.truncated_reports += int(np.count_nonzero(~fits))
            cur, dg, dg_end, rep_len, nxt = (
                cur[fits],
                dg[fits],
                dg_end[fits],
                rep_len[fits],
                nxt[fits],
            )
        b0 = buf[cur]
        is_int = (b0 >> 4) == REPTYPE_INT
        r_cur, r_dg, r_len, r_b0 = cur, dg, rep_len, b0
        if not is_int.all():
            st.skipped_reptype += int(np.count_nonzero(~is_int))
            r_cur, r_dg, r_len, r_b0 = cur[is_int], dg[is_int], rep_len[is_int], b0[is_int]
        md_len = buf[r_cur + 2].astype(np.int64)
        ok = r_len * WORD >= INT_FIXED_LEN + md_len * WORD
        if not ok.all():
            st.malformed_reports += int(np.count_nonzero(~ok))
            r_cur, r_dg, r_len, r_b0, md_len = r_cur[ok], r_dg[ok], r_len[ok], r_b0[ok], md_len[ok]
        bits = _be(buf, r_cur + 4, 2).astype(np.int64)
        ok = _NEED[bits] <= md_len * WORD
        if not ok.all():
            st.malformed_reports += int(np.count_nonzero(~ok))
            r_cur, r_dg, r_len, r_b0 = r_cur[ok], r_dg[ok], r_len[ok], r_b0[ok]
            md_len, bits = md_len[ok], bits[ok]
        if r_cur.shape[0]:
            if inner:
                found.append([r_cur, r_dg, bits, md_len, r_len, (r_b0 & 0x0F).astype(np.int64)])
            else:
                found.append([r_cur, r_dg, bits])
        cur = nxt
    if not found:
        return None
    parts = [np.concatenate(p) for p in zip(*found, strict=True)]
    if len(found) > 1:  # report-position-major -> buffer (datagram, then report) order
        order = np.argsort(parts[0], kind="stable")
        parts = [p[order] for p in parts]
    return tuple(parts)


SCALAR_BELOW = 16  # datagrams left: walk the rest in Python (about break-even, measured)
_NEED_LIST: list[int] = _NEED.tolist()


def _walk_scalar(
    buf: np.ndarray,
    cur: np.ndarray,
    dg: np.ndarray,
    dg_end: np.ndarray,
    st: InbandStats,
    inner: bool,
) -> list[list[np.ndarray]]:
    """``_walk``'s rules, one report at a time (for a few datagrams); same results."""
    out: list[list[int]] = [[] for _ in range(6 if inner else 3)]
    need = _NEED_LIST
    for c, d, e in zip(cur.tolist(), dg.tolist(), dg_end.tolist(), strict=True):
        raw = buf[c:e].tobytes()
        n = len(raw)
        p = 0
        while p < n:
            nxt = p + REPORT_WORD0_LEN + (raw[p + 1] * WORD if p + 1 < n else 0)
            if nxt > n:
                st.truncated_reports += 1
                break
            b0 = raw[p]
            if b0 >> 4 != REPTYPE_INT:
                st.skipped_reptype += 1
            else:
                rep_len, md_len = raw[p + 1], raw[p + 2]
                bits = (raw[p + 4] << 8) | raw[p + 5] if rep_len >= 2 else 0
                if rep_len * WORD < INT_FIXED_LEN + md_len * WORD or need[bits] > md_len * WORD:
                    st.malformed_reports += 1
                else:
                    row = (c + p, d, bits, md_len, rep_len, b0 & 0x0F)
                    for col, v in zip(out, row, strict=False):
                        col.append(v)
            p = nxt
    if not out[0]:
        return []
    return [[np.asarray(col, dtype=np.int64) for col in out]]


def _metadata(
    buf: np.ndarray, md0: np.ndarray, bits: np.ndarray, st: InbandStats
) -> dict[str, pl.Series]:
    """The baseline metadata columns of reports whose metadata starts at ``md0``.

    Each item is gathered once for every report that carries it, at the offset its report's
    RepMdBits puts it, then split into its fields; an all-ones item makes its fields null.
    """
    m = int(md0.shape[0])
    first = int(bits[0])
    one = bool((bits == first).all())  # the usual case: one exporter configuration
    out: dict[str, pl.Series] = {}
    for b, offset in _ITEM_OFF.items():
        size, fields = _MD_ITEMS[b]
        sel: np.ndarray | None = None
        if one:
            if not first & md_bit(b):
                continue
            o = md0 + int(offset[first])
        else:
            has = (bits & md_bit(b)) != 0
            if not has.any():
                continue
            if not has.all():
                sel = np.flatnonzero(has)
            o = md0 + offset[bits] if sel is None else md0[sel] + offset[bits[sel]]
        w = _be(buf, o, size)
        na = w == _ALL_ONES[size]
        n_na = int(np.count_nonzero(na))
        st.unavailable_md += n_na
        valid: np.ndarray | None = None
        if sel is not None or n_na:
            valid = np.zeros(m, dtype=bool)
            if sel is None:
                valid[:] = ~na
            else:
                valid[sel] = ~na
        for name, shift, width in fields:
            npt = _NP_DTYPE[REPORT_SCHEMA[name]]
            v = w if shift == 0 and width == size * 8 else (w >> shift) & ((1 << width) - 1)
            v = v.astype(npt, copy=False)
            if sel is not None:
                full = np.zeros(m, dtype=npt)
                full[sel] = v
                v = full
            if valid is None:
                out[name] = pl.Series(name, v)
            else:
                out[name] = pl.Series(name, np.ma.masked_array(v, mask=~valid))
    return out


# ---- inner contents: the truncated packet's 5-tuple (only with inner=True) --------------------

_ETH_VLAN = (0x8100, 0x88A8, 0x9100)
_ETHERTYPE_KIND = {0x0800: INTYPE_IPV4, 0x86DD: INTYPE_IPV6}
_TLV_KIND = {TLV_ETHERNET: INTYPE_ETHERNET, TLV_IPV4: INTYPE_IPV4, TLV_IPV6: INTYPE_IPV6}


def _inner_columns(
    buf: np.ndarray, start: np.ndarray, end: np.ndarray, in_type: np.ndarray
) -> list[pl.Series]:
    """``INNER_SCHEMA`` columns for inner contents ``buf[start:end]`` of type ``in_type``."""
    m = int(start.shape[0])
    last = buf.shape[0] - 1
    kind = np.where(np.isin(in_type, (INTYPE_ETHERNET, INTYPE_IPV4, INTYPE_IPV6)), in_type, 0)
    pos, lim = start.copy(), end.copy()
    # InType 1: the first TLV holding Ethernet, IPv4 or IPv6 (section 3.3.2)
    t = np.flatnonzero(in_type == INTYPE_TLV)
    while t.shape[0]:
        p, e = pos[t], lim[t]
        hdr = p + WORD <= e
        t, p, e = t[hdr], p[hdr], e[hdr]
        tlv_type = buf[p] >> 4
        data = p + WORD
        data_end = data + buf[p + 1].astype(np.int64) * WORD
        inside = data_end <= e
        hit = inside & np.isin(tlv_type, list(_TLV_KIND))
        if hit.any():
            h = t[hit]
            kind[h] = np.select(
                [tlv_type[hit] == k for k in _TLV_KIND], list(_TLV_KIND.values()), 0
            )
            pos[h], lim[h] = data[hit], data_end[hit]
        more = inside & ~hit
        t = t[more]
        pos[t] = data_end[more]
    # Ethernet: past up to two VLAN tags to IPv4 / IPv6
    eth = np.flatnonzero((kind == INTYPE_ETHERNET) & (pos + 14 <= lim))
    kind[(kind == INTYPE_ETHERNET)] = 0
    if eth.shape[0]:
        off = np.full(eth.shape[0], 12, dtype=np.int64)
        p, e = pos[eth], lim[eth]
        etype = _be(buf, np.minimum(p + off, last - 1), 2).astype(np.int64)
        for _ in range(2):
            tag = np.isin(etype, _ETH_VLAN) & (p + off + 6 <= e)
            off = np.where(tag, off + 4, off)
            etype = np.where(tag, _be(buf, np.minimum(p + off, last - 1), 2), etype)
        for et, k in _ETHERTYPE_KIND.items():
            sel = etype == et
            kind[eth[sel]] = k
        pos[eth] = p + off + 2
    ver = np.zeros(m, dtype=np.uint8)
    proto = np.zeros(m, dtype=np.uint8)
    l4 = np.full(m, -1, dtype=np.int64)
    frag = np.zeros(m, dtype=bool)
    src = _nulls("inner_src_ip", pl.String, m)
    dst = _nulls("inner_dst_ip", pl.String, m)
    v4 = np.flatnonzero((kind == INTYPE_IPV4) & (pos + 20 <= lim))
    if v4.shape[0]:
        p = pos[v4]
        vihl = buf[p]
        ok = ((vihl >> 4) == 4) & ((vihl & 0x0F) >= 5)
        v4, p, vihl = v4[ok], p[ok], vihl[ok]
        ver[v4] = 4
        proto[v4] = buf[p + 9]
        l4[v4] = p + (vihl & 0x0F).astype(np.int64) * 4
        frag[v4] = (_be(buf, p + 6, 2) & 0x1FFF) != 0  # later fragments carry no ports
        src = src.scatter(v4, _ipv4_strings(_be(buf, p + 12, 4)))
        dst = dst.scatter(v4, _ipv4_strings(_be(buf, p + 16, 4)))
    v6 = np.flatnonzero((kind == INTYPE_IPV6) & (pos + 40 <= lim))
    if v6.shape[0]:
        p = pos[v6]
        ok = (buf[p] >> 4) == 6
        v6, p = v6[ok], p[ok]
        ver[v6] = 6
        proto[v6] = buf[p + 6]  # the first Next Header; extension headers are not walked
        l4[v6] = p + 40
        src = src.scatter(v6, _ipv6_strings(buf, p + 8))
        dst = dst.scatter(v6, _ipv6_strings(buf, p + 24))
    has_ip = ver != 0
    ports = has_ip & ~frag & np.isin(proto, _L4_WITH_PORTS) & (l4 + 4 <= lim)
    pi = np.flatnonzero(ports)
    sport = np.zeros(m, dtype=np.uint16)
    dport = np.zeros(m, dtype=np.uint16)
    if pi.shape[0]:
        sport[pi] = _be(buf, l4[pi], 2)
        dport[pi] = _be(buf, l4[pi] + 2, 2)
    return [
        pl.Series("inner_ip_version", np.ma.masked_array(ver, mask=~has_ip)),
        src,
        dst,
        pl.Series("inner_proto", np.ma.masked_array(proto, mask=~has_ip)),
        pl.Series("inner_src_port", np.ma.masked_array(sport, mask=~ports)),
        pl.Series("inner_dst_port", np.ma.masked_array(dport, mask=~ports)),
    ]


def _ipv4_strings(a: np.ndarray) -> pl.Series:
    octets = pl.DataFrame(
        {f"o{i}": ((a >> (24 - 8 * i)) & 0xFF).astype(np.uint8) for i in range(4)}
    )
    return octets.select(pl.format("{}.{}.{}.{}", "o0", "o1", "o2", "o3")).to_series()


def _ipv6_strings(buf: np.ndarray, at: np.ndarray) -> pl.Series:
    raw = buf[at[:, None] + np.arange(16)].tobytes()
    return pl.Series(
        [str(ipaddress.IPv6Address(raw[i : i + 16])) for i in range(0, len(raw), 16)],
        dtype=pl.String,
    )


# ---- builder (tests, simulator, benchmarks) ---------------------------------------------------


@dataclass
class ReportMetadata:
    """One node's INT baseline metadata; the fields that are set decide RepMdBits."""

    ingress_port: int | None = None
    egress_port: int | None = None
    hop_latency_ns: int | None = None
    queue_id: int | None = None
    queue_occupancy_cells: int | None = None
    ingress_ts: int | None = None
    egress_ts: int | None = None
    buffer_id: int | None = None
    buffer_occupancy_cells: int | None = None
    l2_ingress_port: int | None = None
    l2_egress_port: int | None = None
    tx_utilization: int | None = None
    drop_queue_id: int | None = None
    drop_reason: int | None = None


@dataclass
class IndividualReport:
    """One individual report: its metadata and the rest of its header and contents."""

    md: ReportMetadata = field(default_factory=ReportMetadata)
    in_type: int = INTYPE_NONE
    inner: bytes = b""  # inner contents, zero-padded to a 4-octet multiple
    flags: int = 0  # D Q F I (FLAG_D ...)
    domain_id: int = 0
    ds_md_bits: int = 0
    ds_md_status: int = 0
    ds_md: bytes = b""  # domain specific metadata, zero-padded to a 4-octet multiple
    unavailable: tuple[int, ...] = ()  # RepMdBits bits sent as all ones ("not available")
    reserved: tuple[int, ...] = ()  # reserved RepMdBits bits to set (4 zero octets each)
    rep_type: int = REPTYPE_INT


def _pad(b: bytes) -> bytes:
    return b + b"\x00" * (-len(b) % WORD)


_ENCODE = [
    (b, size, md_bit(b), tuple((name, shift, (1 << width) - 1) for name, shift, width in fields))
    for b, (size, fields) in sorted(_MD_ITEMS.items())
]


def encode_metadata(
    md: ReportMetadata, unavailable: Iterable[int] = (), reserved: Iterable[int] = ()
) -> tuple[int, bytes]:
    """RepMdBits and the baseline metadata bytes for ``md``."""
    na, rsv = set(unavailable), set(reserved)
    bits = 0
    out: list[bytes] = []
    for b, size, mask, fields in _ENCODE:
        if na and b in na:
            bits |= mask
            out.append(b"\xff" * size)
            continue
        word = 0
        present = False
        for name, shift, wmask in fields:
            v = getattr(md, name)
            if v is not None:
                present = True
                word |= (v & wmask) << shift
        if present:
            bits |= mask
            out.append(word.to_bytes(size, "big"))
        elif rsv and b in rsv:
            bits |= mask
            out.append(bytes(size))
    return bits, b"".join(out)


def encode_report(r: IndividualReport) -> bytes:
    """One individual report: header word, main contents (RepType 1) and inner contents."""
    inner = _pad(r.inner)
    if r.rep_type == REPTYPE_INNER_ONLY:  # no main contents; MD Length 0 (section 3.3)
        main, md_words = b"", 0
    else:
        bits, mdb = encode_metadata(r.md, r.unavailable, r.reserved)
        ds = _pad(r.ds_md)
        md_words = (len(mdb) + len(ds)) // WORD
        fixed = struct.pack(">HHHH", bits, r.domain_id, r.ds_md_bits, r.ds_md_status)
        main = fixed + mdb + ds
    words = (len(main) + len(inner)) // WORD
    b0 = ((r.rep_type & 0xF) << 4) | (r.in_type & 0xF)
    return struct.pack(">BBBB", b0, words, md_words, (r.flags & 0xF) << 4) + main + inner


def group_header(node_id: int, seq: int, hw_id: int = 0) -> bytes:
    """The 8-octet Telemetry Report Group Header."""
    w0 = (TR_VERSION << 28) | ((hw_id & 0x3F) << 22) | (seq & 0x3FFFFF)
    return struct.pack(">II", w0, node_id & 0xFFFFFFFF)


def build_report(
    node_id: int,
    seq: int,
    reports: Iterable[IndividualReport | ReportMetadata | Mapping[str, int]] = (),
    *,
    hw_id: int = 0,
    rep_type: int = REPTYPE_INT,
) -> bytes:
    """Encode one Telemetry Report v2.0 datagram (group header + individual reports).

    ``reports`` items are ``IndividualReport``, or ``ReportMetadata`` / mappings of its field
    names (reports of ``rep_type`` without inner contents).
    """
    body = bytearray(group_header(node_id, seq, hw_id))
    for r in reports:
        if not isinstance(r, IndividualReport):
            md = r if isinstance(r, ReportMetadata) else ReportMetadata(**r)
            r = IndividualReport(md=md, rep_type=rep_type)
        body += encode_report(r)
    return bytes(body)


def _l4(proto: int, sport: int, dport: int) -> bytes:
    if proto == 6:  # TCP: data offset 5, ACK
        return struct.pack(">HHIIBBHHH", sport, dport, 1, 1, 0x50, 0x10, 0xFFFF, 0, 0)
    if proto in (17, 132):
        return struct.pack(">HHHH", sport, dport, 8, 0)
    return b""


def truncated_ipv4(
    src: str, dst: str, proto: int = 17, sport: int = 49152, dport: int = 4791
) -> bytes:
    """An IPv4 header and its TCP / UDP header, as a report's truncated packet holds them."""
    l4 = _l4(proto, sport, dport)
    ip = struct.pack(
        ">BBHHHBBH4s4s",
        0x45,
        0,
        20 + len(l4),
        0,
        0x4000,
        64,
        proto,
        0,
        ipaddress.IPv4Address(src).packed,
        ipaddress.IPv4Address(dst).packed,
    )
    s = sum(struct.unpack(">10H", ip))
    while s >> 16:
        s = (s & 0xFFFF) + (s >> 16)
    return ip[:10] + struct.pack(">H", ~s & 0xFFFF) + ip[12:] + l4


def truncated_ipv6(
    src: str, dst: str, proto: int = 17, sport: int = 49152, dport: int = 4791
) -> bytes:
    """An IPv6 header and its TCP / UDP header, as a report's truncated packet holds them."""
    l4 = _l4(proto, sport, dport)
    ip = struct.pack(">IHBB", 6 << 28, len(l4), proto, 64)
    return ip + ipaddress.IPv6Address(src).packed + ipaddress.IPv6Address(dst).packed + l4


def truncated_ethernet(packet: bytes, vlan: int | None = None) -> bytes:
    """An Ethernet header (optionally 802.1Q tagged) in front of an IPv4 / IPv6 packet."""
    etype = 0x86DD if packet[:1] and packet[0] >> 4 == 6 else 0x0800
    tag = b"" if vlan is None else struct.pack(">HH", 0x8100, vlan & 0x0FFF)
    macs = bytes.fromhex("020000000002020000000001")
    return macs + tag + struct.pack(">H", etype) + packet
