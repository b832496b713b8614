"""Classic libpcap files (not pcapng) carrying INT reports over Ethernet / IPv4 / UDP.

``iter_pcap_payloads`` reads either byte order and µs or ns timestamps (magic ``a1b2c3d4`` /
``a1b23c4d``), LINKTYPE_ETHERNET (1) only, 802.1Q / 802.1ad tags skipped. Frames that are not
IPv4/UDP, IP fragments, other UDP ports and frames cut short by the snap length are counted in
``PcapStats`` and skipped; a truncated last record ends the file quietly (counted). A file that is
not classic pcap, or of another link type, raises ``ValueError``.

``write_pcap`` writes such a file from UDP payloads (tests, simulator).
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from collector.inband.report import DEFAULT_PORT

LINKTYPE_ETHERNET = 1
_MAGIC_US = 0xA1B2C3D4
_MAGIC_NS = 0xA1B23C4D
_ETH_IPV4 = 0x0800
_ETH_VLAN = (0x8100, 0x88A8, 0x9100)
_IPPROTO_UDP = 17


@dataclass
class PcapStats:
    records: int = 0
    payloads: int = 0  # UDP payloads yielded
    not_ipv4_udp: int = 0  # other ethertypes / protocols, IP fragments, bad IP header
    wrong_port: int = 0
    truncated: int = 0  # frames shorter than their headers / UDP length, truncated last record


def _udp_payload(frame: bytes, port: int | None, st: PcapStats) -> bytes | None:
    n = len(frame)
    if n < 14:
        st.truncated += 1
        return None
    off = 12
    (etype,) = struct.unpack_from(">H", frame, off)
    off += 2
    while etype in _ETH_VLAN:
        if off + 4 > n:
            st.truncated += 1
            return None
        (etype,) = struct.unpack_from(">H", frame, off + 2)
        off += 4
    if etype != _ETH_IPV4:
        st.not_ipv4_udp += 1
        return None
    if off + 20 > n:
        st.truncated += 1
        return None
    vihl = frame[off]
    ihl = (vihl & 0x0F) * 4
    if vihl >> 4 != 4 or ihl < 20:
        st.not_ipv4_udp += 1
        return None
    (frag,) = struct.unpack_from(">H", frame, off + 6)
    if frame[off + 9] != _IPPROTO_UDP or frag & 0x3FFF:  # MF flag or fragment offset
        st.not_ipv4_udp += 1
        return None
    udp = off + ihl
    if udp + 8 > n:
        st.truncated += 1
        return None
    _sport, dport, ulen = struct.unpack_from(">HHH", frame, udp)
    if port is not None and dport != port:
        st.wrong_port += 1
        return None
    if ulen < 8 or udp + ulen > n:
        st.truncated += 1
        return None
    return frame[udp + 8 : udp + ulen]


def iter_pcap_payloads(
    path: str | Path,
    port: int | None = DEFAULT_PORT,
    chunk_size: int = 4096,
    stats: PcapStats | None = None,
) -> Iterator[list[bytes]]:
    """Yield lists of at most ``chunk_size`` UDP payloads to ``port`` (None: any port)."""
    st = stats if stats is not None else PcapStats()
    with open(path, "rb") as f:
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
        rec = struct.Struct(endian + "IIII")
        chunk: list[bytes] = []
        while True:
            rh = f.read(16)
            if not rh:
                break
            if len(rh) < 16:
                st.truncated += 1
                break
            _ts, _frac, incl, _orig = rec.unpack(rh)
            frame = f.read(incl)
            if len(frame) < incl:
                st.truncated += 1
                break
            st.records += 1
            payload = _udp_payload(frame, port, st)
            if payload is None:
                continue
            st.payloads += 1
            chunk.append(payload)
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
) -> int:
    """Write ``payloads`` as Ethernet/IPv4/UDP frames to ``port``; ns-resolution, little-endian.

    Returns the number of records written.
    """
    n = 0
    with open(path, "wb") as f:
        f.write(struct.pack("<IHHiIII", _MAGIC_NS, 2, 4, 0, 0, 262144, LINKTYPE_ETHERNET))
        for i, p in enumerate(payloads):
            frame = ethernet_frame(p, port)
            ts = start_ns + i * interval_ns
            f.write(
                struct.pack("<IIII", ts // 1_000_000_000, ts % 1_000_000_000, *[len(frame)] * 2)
            )
            f.write(frame)
            n += 1
    return n
