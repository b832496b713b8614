"""Classic libpcap files (not pcapng) carrying INT reports over Ethernet / IPv4 / UDP.

``iter_pcap_chunks`` (and ``iter_pcap_payloads`` on top of it) reads either byte order and µs
or ns timestamps (magic ``a1b2c3d4`` / ``a1b23c4d``), LINKTYPE_ETHERNET (1) only, 802.1Q /
802.1ad tags skipped. Frames that are not IPv4/UDP, IP fragments, other UDP ports and frames cut
short by the snap length are counted in ``PcapStats`` and skipped; a truncated last record ends
the file quietly (counted). A damaged record header (a length or time no capture writes) is
counted and reading resumes at the next record that makes sense, so one damaged byte does not
cost the rest of the file. A file that is not classic pcap, or of another link type, raises
``ValueError``.

Every payload keeps its record's capture time (``PayloadChunk.ts``, ns): reports that carry no
timestamp of their own are placed by it.

``write_pcap`` writes such a file from UDP payloads (tests, simulator).
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import numpy as np

from collector.inband.report import DEFAULT_PORT

LINKTYPE_ETHERNET = 1
_MAGIC_US = 0xA1B2C3D4
_MAGIC_NS = 0xA1B23C4D
_ETH_IPV4 = 0x0800
_ETH_VLAN = (0x8100, 0x88A8, 0x9100)
_IPPROTO_UDP = 17
# a capture's next record is not a day older than the last one, nor a year newer (merged
# captures are in time order); a header read a byte off has a time decades away
_DAY_S, _YEAR_S = 86_400, 366 * 86_400
_ETH_TYPES = (_ETH_IPV4, *_ETH_VLAN)
_ETH_TYPE_BYTES = tuple(struct.pack(">H", t) for t in _ETH_TYPES)
MAX_RECORD_BYTES = 1 << 18  # the largest snap length libpcap writes


@dataclass
class PcapStats:
    records: int = 0
    payloads: int = 0  # UDP payloads yielded
    not_ipv4_udp: int = 0  # other ethertypes / protocols, IP fragments, bad IP header
    wrong_port: int = 0
    truncated: int = 0  # frames shorter than their headers / UDP length, truncated last record
    corrupt: int = 0  # damaged record headers (reading resumes at the next record that fits)


@dataclass
class PayloadChunk:
    """UDP payloads in one buffer: payload ``i`` is ``buf[starts[i] : starts[i] + lens[i]]``,
    captured at ``ts[i]`` (ns since the epoch)."""

    buf: np.ndarray  # uint8
    starts: np.ndarray  # int64, increasing
    lens: np.ndarray  # int64
    ts: np.ndarray  # int64

    def __len__(self) -> int:
        return int(self.starts.shape[0])

    def payloads(self) -> list[bytes]:
        b = self.buf.tobytes()
        return [b[s : s + n] for s, n in zip(self.starts.tolist(), self.lens.tolist(), strict=True)]


def _open_pcap(f: IO[bytes], path: str | Path) -> tuple[str, bool]:
    """The file's byte order and whether its timestamps are in ns (else µs)."""
    hdr = f.read(24)
    if len(hdr) < 24:
        raise ValueError(f"{path}: not a classic pcap file (short header)")
    for endian in (">", "<"):
        (magic,) = struct.unpack_from(endian + "I", hdr)
        if magic in (_MAGIC_US, _MAGIC_NS):
            break
    else:
        raise ValueError(f"{path}: not a classic pcap file (magic {hdr[:4].hex()})")
    (linktype,) = struct.unpack_from(endian + "I", hdr, 20)
    if linktype & 0x0FFFFFFF != LINKTYPE_ETHERNET:
        raise ValueError(f"{path}: link type {linktype} is not Ethernet")
    return endian, magic == _MAGIC_NS


def _be16(buf: np.ndarray, idx: np.ndarray) -> np.ndarray:
    return (buf[idx].astype(np.int64) << 8) | buf[idx + 1]


def _udp_payloads(
    buf: np.ndarray, fo: np.ndarray, fl: np.ndarray, port: int | None, st: PcapStats
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Frames at ``fo`` of length ``fl`` in ``buf`` -> (payload starts, lengths, the frames'
    indices), vectorised."""
    total = int(fo.shape[0])
    last = buf.shape[0] - 2
    ok = fl >= 14
    st.truncated += total - int(np.count_nonzero(ok))
    fi = np.flatnonzero(ok)
    fo, fl = fo[ok], fl[ok]
    off = np.full(fo.shape[0], 12, dtype=np.int64)
    etype = _be16(buf, fo + 12)
    for _ in range(4):  # 802.1Q / 802.1ad tags
        tagged = np.isin(etype, _ETH_VLAN)
        if not tagged.any():
            break
        short = tagged & (off + 8 > fl)
        st.truncated += int(np.count_nonzero(short))
        keep = ~short
        fo, fl, off, etype, tagged = fo[keep], fl[keep], off[keep], etype[keep], tagged[keep]
        fi = fi[keep]
        off = np.where(tagged, off + 4, off)
        etype = np.where(tagged, _be16(buf, np.minimum(fo + off, last)), etype)
    off += 2
    ipv4 = etype == _ETH_IPV4
    st.not_ipv4_udp += int(np.count_nonzero(~ipv4))
    fo, fl, off, fi = fo[ipv4], fl[ipv4], off[ipv4], fi[ipv4]
    short = off + 20 > fl
    st.truncated += int(np.count_nonzero(short))
    fo, fl, off, fi = fo[~short], fl[~short], off[~short], fi[~short]
    ip = fo + off
    vihl = buf[ip].astype(np.int64)
    ihl = (vihl & 0x0F) * 4
    frag = _be16(buf, ip + 6)
    good = ((vihl >> 4) == 4) & (ihl >= 20) & (buf[ip + 9] == _IPPROTO_UDP) & ((frag & 0x3FFF) == 0)
    st.not_ipv4_udp += int(np.count_nonzero(~good))
    fo, fl, udp, fi = fo[good], fl[good], off[good] + ihl[good], fi[good]
    short = udp + 8 > fl
    st.truncated += int(np.count_nonzero(short))
    fo, fl, udp, fi = fo[~short], fl[~short], udp[~short], fi[~short]
    u = fo + udp
    if port is not None:
        right = _be16(buf, u + 2) == port
        st.wrong_port += int(np.count_nonzero(~right))
        fo, fl, udp, u, fi = fo[right], fl[right], udp[right], u[right], fi[right]
    ulen = _be16(buf, u + 4)
    bad = (ulen < 8) | (udp + ulen > fl)
    st.truncated += int(np.count_nonzero(bad))
    return (u + 8)[~bad], (ulen - 8)[~bad], fi[~bad]


def iter_pcap_chunks(
    path: str | Path,
    port: int | None = DEFAULT_PORT,
    chunk_bytes: int = 8 << 20,
    stats: PcapStats | None = None,
) -> Iterator[PayloadChunk]:
    """Yield the UDP payloads to ``port`` (None: any) of about ``chunk_bytes`` of file at a time.

    The file header is checked at once (``ValueError`` when it is not classic Ethernet pcap).
    Only the record headers are walked in Python; the Ethernet / IPv4 / UDP checks run over a
    whole chunk at once and payloads are not copied out of the chunk.
    """
    st = stats if stats is not None else PcapStats()
    f = open(path, "rb")  # noqa: SIM115 - closed by the generator
    try:
        endian, ns = _open_pcap(f, path)
    except BaseException:
        f.close()
        raise
    return _chunks(f, endian, ns, port, chunk_bytes, st)


def _chunks(
    f: IO[bytes], endian: str, ns: bool, port: int | None, chunk_bytes: int, st: PcapStats
) -> Iterator[PayloadChunk]:
    u32 = np.dtype(endian + "u4")
    frac_ns = 1 if ns else 1000
    frac_max = 1_000_000_000 if ns else 1_000_000
    with f:
        unpack = struct.Struct(endian + "IIII").unpack_from
        rest = b""
        eof = False
        lost = False  # past a damaged record header, looking for the next record
        # the capture's time (s), from its records: it moves by small steps, or when two
        # records in a row agree on a new time (``moved``); a header read a few bytes off has
        # a time decades away, and one damaged time taken for it would make every later record
        # look wrong
        now_s: int | None = None
        moved: int | None = None

        def timely(sec: int) -> bool:
            return (
                now_s is None
                or now_s - _DAY_S <= sec <= now_s + _YEAR_S
                or (moved is not None and abs(sec - moved) <= _DAY_S)
            )

        def ip_frame(blob: bytes, p: int) -> bool:
            return (blob[p + 28] << 8 | blob[p + 29]) in _ETH_TYPES

        def resumes_at(blob: bytes, p: int) -> bool:
            """Whether a record that makes sense starts at ``p``: a plausible header (its time
            near the capture's) and an Ethernet frame carrying IPv4 or a VLAN tag."""
            sec, frac, incl, orig = unpack(blob, p)
            return (
                frac < frac_max
                and 14 <= incl <= orig <= MAX_RECORD_BYTES
                and timely(sec)
                and ip_frame(blob, p)
            )

        def next_record(blob: bytes, start: int, n: int) -> int:
            """Where the next record that makes sense starts at or after ``start`` (-1: not in
            ``blob``). Candidates are found by their frame's EtherType (``bytes.find``), so a
            long damaged stretch costs a scan in C, not a header unpacked per byte."""
            hits = [blob.find(e, start + 28, n) for e in _ETH_TYPE_BYTES]
            while True:
                live = [h for h in hits if h >= 0]
                if not live:
                    return -1
                at = min(live)
                if resumes_at(blob, at - 28):
                    return at - 28
                hits = [
                    blob.find(e, at + 1, n) if h == at else h
                    for e, h in zip(_ETH_TYPE_BYTES, hits, strict=True)
                ]

        while not eof:
            data = f.read(chunk_bytes)
            eof = not data
            blob = rest + data if rest else data
            n = len(blob)
            pos = 0
            fo: list[int] = []
            fl: list[int] = []
            while True:
                if lost:
                    # one damaged header must not cost the rest of the file: look for the next
                    # record that makes sense (a header and the start of its frame: 30 bytes)
                    at = next_record(blob, pos, n)
                    if at < 0:
                        pos = max(pos, n - 29)  # what may still start one, with more data
                        break  # (at the end of the file the rest is lost: counted)
                    pos, lost = at, False
                if pos + 16 > n:
                    break
                sec, frac, incl, orig = unpack(blob, pos)
                # (the common case inline: a record in the capture's current second)
                on_time = sec == now_s or timely(sec)
                if not on_time and pos + 30 > n and not eof:
                    break  # its frame decides (below): read on
                if (
                    incl > MAX_RECORD_BYTES
                    or incl > orig
                    or frac >= frac_max
                    or (not on_time and (incl < 14 or pos + 30 > n or not ip_frame(blob, pos)))
                ):
                    # no capture writes such a header (taken for a record, its length would
                    # swallow the records after it); an odd time with an IP frame after it is
                    # the capture's (a damaged time, or a gap of days)
                    st.corrupt += 1
                    lost = True
                    pos += 1
                    continue
                if pos + 16 + incl > n:
                    break
                fo.append(pos + 16)
                fl.append(incl)
                if sec == now_s:
                    pass
                elif now_s is None or now_s < sec <= now_s + _DAY_S:
                    now_s, moved = sec, None
                elif not now_s - _DAY_S <= sec <= now_s + _DAY_S:
                    if moved is not None and abs(sec - moved) <= _DAY_S:
                        now_s, moved = sec, None  # two records agree: the capture's time moved
                    else:
                        moved = sec
                pos += 16 + incl
            rest = blob[pos:n]
            if eof and rest and not lost:
                st.truncated += 1  # a truncated last record ends the file
            st.records += len(fo)
            if not fo:
                continue
            buf = np.frombuffer(blob, dtype=np.uint8)
            fo_a = np.asarray(fo, dtype=np.int64)
            starts, lens, fi = _udp_payloads(buf, fo_a, np.asarray(fl, dtype=np.int64), port, st)
            st.payloads += int(starts.shape[0])
            if starts.shape[0]:
                # record header: ts_sec, ts_usec (or ts_nsec), incl_len, orig_len
                rec = fo_a[fi] - 16
                sec = buf[rec[:, None] + np.arange(4)].view(u32).ravel().astype(np.int64)
                frac = buf[rec[:, None] + np.arange(4, 8)].view(u32).ravel().astype(np.int64)
                yield PayloadChunk(buf, starts, lens, sec * 1_000_000_000 + frac * frac_ns)


def iter_pcap_payloads(
    path: str | Path,
    port: int | None = DEFAULT_PORT,
    chunk_size: int = 4096,
    stats: PcapStats | None = None,
) -> Iterator[list[bytes]]:
    """Yield lists of at most ``chunk_size`` UDP payloads to ``port`` (None: any port)."""
    chunk: list[bytes] = []
    for c in iter_pcap_chunks(path, port, stats=stats):
        for p in c.payloads():
            chunk.append(p)
            if len(chunk) >= chunk_size:
                yield chunk
                chunk = []
    if chunk:
        yield chunk


def _ip_checksum(hdr: bytes) -> int:
    s = sum(struct.unpack(f">{len(hdr) // 2}H", hdr))
    while s >> 16:
        s = (s & 0xFFFF) + (s >> 16)
    return ~s & 0xFFFF


def ethernet_frame(
    payload: bytes,
    port: int = DEFAULT_PORT,
    src_ip: str = "10.255.0.1",
    dst_ip: str = "10.255.0.2",
    src_port: int = 49152,
) -> bytes:
    """Ethernet II / IPv4 / UDP frame around ``payload`` (UDP checksum 0 = none)."""
    udp = struct.pack(">HHHH", src_port, port, 8 + len(payload), 0) + payload
    src = bytes(int(x) for x in src_ip.split("."))
    dst = bytes(int(x) for x in dst_ip.split("."))
    ip = struct.pack(">BBHHHBBH4s4s", 0x45, 0, 20 + len(udp), 0, 0x4000, 64, 17, 0, src, dst)
    ip = ip[:10] + struct.pack(">H", _ip_checksum(ip)) + ip[12:]
    eth = bytes.fromhex("020000000002") + bytes.fromhex("020000000001") + b"\x08\x00"
    return eth + ip + udp


def write_pcap(
    path: str | Path,
    payloads: Iterable[bytes],
    port: int = DEFAULT_PORT,
    start_ns: int = 1_700_000_000_000_000_000,
    interval_ns: int = 1000,
    times_ns: Sequence[int] | None = None,
) -> int:
    """Write ``payloads`` as Ethernet/IPv4/UDP frames to ``port``; ns-resolution, little-endian.

    Record ``i`` is stamped ``times_ns[i]``, else ``start_ns + i * interval_ns``. Returns the
    number of records written.
    """
    n = 0
    with open(path, "wb") as f:
        f.write(struct.pack("<IHHiIII", _MAGIC_NS, 2, 4, 0, 0, 262144, LINKTYPE_ETHERNET))
        for i, p in enumerate(payloads):
            frame = ethernet_frame(p, port)
            ts = times_ns[i] if times_ns is not None else start_ns + i * interval_ns
            f.write(
                struct.pack("<IIII", ts // 1_000_000_000, ts % 1_000_000_000, *[len(frame)] * 2)
            )
            f.write(frame)
            n += 1
    return n
