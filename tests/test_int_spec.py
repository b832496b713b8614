"""Telemetry Report v2.0 exactly as P4.org's text writes it (telemetry_report.mdk, tag v2.0).

The bytes here are written out by hand from the specification's figures, not with the
package's builder, so that a layout error shared by builder and parser cannot hide.
"""

from __future__ import annotations

import itertools
import random
import struct
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from collector.inband import InbandStats, build_report, parse_datagrams, write_pcap
from collector.inband.aggregate import IntAggregator
from collector.inband.report import (
    _MD_ITEMS,
    INNER_SCHEMA,
    INTYPE_ETHERNET,
    INTYPE_IPV4,
    INTYPE_IPV6,
    INTYPE_TLV,
    REPORT_SCHEMA,
    IndividualReport,
    ReportMetadata,
    truncated_ethernet,
    truncated_ipv4,
    truncated_ipv6,
)
from collector.inband.sequence import SEQ_MOD, SequenceTracker
from rocewatch.core.stats import Stats
from rocewatch.core.topology import Topology
from rocewatch.sources import PcapSource
from tests.test_int_replay import topology

NODE = 11  # leaf-0 in tests.test_int_replay.topology(): int_cell_bytes 80, port 1 Ethernet1/1


def group(node: int, seq: int, hw_id: int = 0) -> bytes:
    """Section 3.2: |Ver(4)|hw_id(6)|Sequence Number(22)| then |Node ID(32)|."""
    return struct.pack(">II", (2 << 28) | (hw_id << 22) | seq, node)


def ipv4_tcp(src: bytes, dst: bytes, sport: int, dport: int) -> bytes:
    """Five words of IPv4 header (IHL 5, proto 6) and five of TCP (data offset 5)."""
    ip = struct.pack(">BBHHHBBH4s4s", 0x45, 0, 40, 7, 0x4000, 64, 6, 0, src, dst)
    tcp = struct.pack(">HHIIBBHHH", sport, dport, 1000, 0, 0x50, 0x02, 65535, 0, 0)
    return ip + tcp


SPEC_IN_PORT, SPEC_EG_PORT, SPEC_QID, SPEC_OCC = 7, 1, 3, 1234


def spec_example(seq: int = 1, node: int = NODE) -> bytes:
    """Section 4.1 "Example with Baseline Metadata and Truncated IPv4", word for word."""
    return (
        group(node, seq, hw_id=0)
        # |0 0 0 1|0 1 0 0|  RepLength=14 | MD Length = 2 |0|0|1|0|  Rsvd |
        + bytes([0b0001_0100, 14, 2, 0b0010_0000])
        # |0 1 0 1 0 0 0 0 0 0 0 0 0 0 0 0|0 ... 0|   RepMdBits bits 1 and 3, Domain Specific ID 0
        + bytes([0b0101_0000, 0, 0, 0])
        + bytes(4)  # DSMdBits, DSMdStatus
        + struct.pack(">HH", SPEC_IN_PORT, SPEC_EG_PORT)  # Ingress / Egress Interface ID
        + struct.pack(">I", (SPEC_QID << 24) | SPEC_OCC)  # Queue ID + Queue Occupancy
        + ipv4_tcp(bytes([192, 0, 2, 1]), bytes([198, 51, 100, 7]), 40000, 443)  # 10 words
    )


def test_spec_worked_example() -> None:
    dgram = spec_example(seq=0x2ABCDE)
    assert len(dgram) == 8 + 4 + 14 * 4  # the group header, the first word, Report Length
    df, stats = parse_datagrams([dgram], rx_ts=[1_795_946_400_000_000_000], inner=True)
    assert stats == InbandStats(datagrams=1, reports=1)  # nothing malformed, skipped, counted
    (row,) = df.to_dicts()
    assert row["node_id"] == NODE and row["hw_id"] == 0 and row["seq"] == 0x2ABCDE
    assert (row["ingress_port"], row["egress_port"]) == (SPEC_IN_PORT, SPEC_EG_PORT)
    assert (row["queue_id"], row["queue_occupancy_cells"]) == (SPEC_QID, SPEC_OCC)
    assert row["flags"] == 0b0010  # F
    for k in ("hop_latency_ns", "ingress_ts", "egress_ts", "buffer_occupancy_cells"):
        assert row[k] is None, k
    assert row["rx_ts"] == 1_795_946_400_000_000_000  # the only time this report has
    assert row["inner_ip_version"] == 4 and row["inner_proto"] == 6
    assert (row["inner_src_ip"], row["inner_dst_ip"]) == ("192.0.2.1", "198.51.100.7")
    assert (row["inner_src_port"], row["inner_dst_port"]) == (40000, 443)


def test_builder_writes_the_spec_example() -> None:
    r = IndividualReport(
        md=ReportMetadata(
            ingress_port=SPEC_IN_PORT,
            egress_port=SPEC_EG_PORT,
            queue_id=SPEC_QID,
            queue_occupancy_cells=SPEC_OCC,
        ),
        in_type=INTYPE_IPV4,
        inner=ipv4_tcp(bytes([192, 0, 2, 1]), bytes([198, 51, 100, 7]), 40000, 443),
        flags=0b0010,
    )
    assert build_report(NODE, 5, [r]) == spec_example(seq=5)


def test_spec_example_with_ds_metadata_and_tlvs() -> None:
    """Section 4.2: domain specific metadata, a TLV of DS extension data, a TLV holding IPv4.

    The example's list says MD Length = 2, but MD Length is defined (section 3.3) to count the
    domain specific metadata too, and its figure shows three metadata words: 3 is what a parser
    can find the inner contents by.
    """
    ipv4 = ipv4_tcp(bytes([10, 0, 0, 1]), bytes([10, 0, 0, 2]), 1, 2)
    body = (
        bytes([0b0001_0001, 0, 3, 0b0010_0000])  # Report Length patched below
        + bytes([0b0101_0000, 0]) + struct.pack(">H", 0x0042)  # Domain Specific ID 0x42
        + struct.pack(">HH", 0x8000, 0x0001)  # DSMdBits (MSB), DSMdStatus
        + struct.pack(">HH", 5, 6)
        + struct.pack(">I", 77)
        + b"DSMD"  # the domain specific metadata word
        + bytes([0b0000_0000, 2]) + struct.pack(">H", 9) + b"ext-data"  # TLV 0, 2 words
        + bytes([0b0010_0000, len(ipv4) // 4, 0, 0]) + ipv4  # TLV 2 (IPv4)
    )  # fmt: skip
    body = body[:1] + bytes([len(body) // 4 - 1]) + body[2:]
    df, stats = parse_datagrams([group(NODE, 1) + body], inner=True)
    assert stats.reports == 1 and stats.domain_specific_md == 1
    assert stats.malformed_reports == stats.truncated_reports == 0
    (row,) = df.to_dicts()
    assert (row["ingress_port"], row["egress_port"], row["queue_occupancy_cells"]) == (5, 6, 77)
    assert (row["inner_src_ip"], row["inner_dst_port"]) == ("10.0.0.1", 2)


FIELDS = {
    1: {"ingress_port": 0xBEEF, "egress_port": 0x0102},
    2: {"hop_latency_ns": 0x01020304},
    3: {"queue_id": 0xA5, "queue_occupancy_cells": 0x123456},
    4: {"ingress_ts": 0x0102030405060708},
    5: {"egress_ts": 0x1112131415161718},
    6: {"l2_ingress_port": 0x01020304, "l2_egress_port": 0x05060708},
    7: {"tx_utilization": 0x0A0B0C0D},
    8: {"buffer_id": 0x5A, "buffer_occupancy_cells": 0x654321},
    15: {"drop_queue_id": 0x0C, "drop_reason": 0x47},
}


def item_bytes(bit: int) -> bytes:
    """Section 3.3.1: the octets of RepMdBits item ``bit``, packed by hand."""
    f = FIELDS.get(bit, {})
    if bit == 1:
        return struct.pack(">HH", f["ingress_port"], f["egress_port"])
    if bit in (3, 8, 15):
        a, b = list(f.values())
        return struct.pack(">I", (a << 24) | (b << 16 if bit == 15 else b))
    if bit in (4, 5):
        return struct.pack(">Q", next(iter(f.values())))
    if bit == 6:
        return struct.pack(">II", f["l2_ingress_port"], f["l2_egress_port"])
    if bit in (2, 7):
        return struct.pack(">I", next(iter(f.values())))
    return b"\x00\x00\x00\x00"  # reserved: bits 0 and 9-14 stand for 4 octets each


def int_report(
    bits: list[int], md: bytes | None = None, inner: bytes = b"", in_type: int = 0
) -> bytes:
    md = md if md is not None else b"".join(item_bytes(b) for b in sorted(bits))
    mask = sum(1 << (15 - b) for b in bits)
    rep_len = 2 + (len(md) + len(inner)) // 4
    hdr = bytes([0x10 | in_type, rep_len, len(md) // 4, 0]) + struct.pack(">HHHH", mask, 0, 0, 0)
    return hdr + md + inner


def expect(bits: list[int]) -> dict[str, int | None]:
    out: dict[str, int | None] = {c: None for c in REPORT_SCHEMA if c not in ("node_id", "seq")}
    for b in bits:
        out.update(FIELDS.get(b, {}))
    return out


@pytest.mark.parametrize("bit", range(16))
def test_every_repmdbit_alone(bit: int) -> None:
    dgram = group(NODE, 1) + int_report([bit])
    df, stats = parse_datagrams([dgram])
    assert stats.reports == 1 and stats.malformed_reports == 0
    assert stats.reserved_md_bits == (1 if bit == 0 or 9 <= bit <= 14 else 0)
    row = df.to_dicts()[0]
    want = expect([bit])
    for k, v in want.items():
        if k not in ("hw_id", "flags", "rx_ts"):
            assert row[k] == v, (bit, k)
    assert len(item_bytes(bit)) == _MD_ITEMS[bit][0] == (8 if bit in (4, 5, 6) else 4)


def test_all_repmdbits_together_and_in_pairs() -> None:
    every = list(range(16))
    rng = random.Random(4)
    combos = [every] + [sorted(rng.sample(every, rng.randrange(1, 16))) for _ in range(30)]
    dgram = group(NODE, 1) + b"".join(int_report(c) for c in combos)
    df, stats = parse_datagrams([dgram])
    assert stats.reports == len(combos) and stats.malformed_reports == 0
    for row, c in zip(df.to_dicts(), combos, strict=True):
        for k, v in expect(c).items():
            if k not in ("hw_id", "flags", "rx_ts"):
                assert row[k] == v, (c, k)


def test_all_ones_is_not_available() -> None:
    """Section 3.3.1: 4 or 8 octets of 0xFF stand for a value the node does not have."""
    md = b"\xff" * 4 + item_bytes(2) + item_bytes(3) + b"\xff" * 8 + item_bytes(5)
    dgram = group(NODE, 1) + int_report([1, 2, 3, 4, 5], md=md)
    df, stats = parse_datagrams([dgram])
    row = df.to_dicts()[0]
    assert row["ingress_port"] is None and row["egress_port"] is None
    assert row["ingress_ts"] is None
    assert row["hop_latency_ns"] == FIELDS[2]["hop_latency_ns"]
    assert row["egress_ts"] == FIELDS[5]["egress_ts"]
    assert stats.unavailable_md == 2 and stats.malformed_reports == 0
    # mixed with reports that have the values: only the all-ones ones are null
    other = int_report([1, 2, 3, 4, 5])
    df, _ = parse_datagrams([group(NODE, 2) + other + int_report([1, 2, 3, 4, 5], md=md) + other])
    assert df["ingress_port"].to_list() == [0xBEEF, None, 0xBEEF]
    assert df["ingress_ts"].null_count() == 1
    # built the same way
    built = build_report(NODE, 1, [IndividualReport(md=ReportMetadata(hop_latency_ns=5),
                                                    unavailable=(1, 4))])  # fmt: skip
    row = parse_datagrams([built])[0].to_dicts()[0]
    assert row["egress_port"] is None and row["ingress_ts"] is None and row["hop_latency_ns"] == 5


def test_several_reports_in_one_datagram() -> None:
    """Reports follow each other to the end of the datagram (section 3.3: compared with the
    UDP length); other RepTypes are skipped by Report Length, and so are inner contents."""
    inner_only = bytes([0x04, 10, 0, 0]) + ipv4_tcp(b"\x01" * 4, b"\x02" * 4, 1, 2)  # RepType 0
    reports = [
        int_report([1, 2]),
        inner_only,
        int_report([3], inner=ipv4_tcp(b"\x0a\x00\x00\x01", b"\x0a\x00\x00\x02", 5, 6), in_type=4),
        bytes([0x20, 1, 0, 0, 1, 2, 3, 4]),  # RepType 2 (IOAM): not defined yet, skipped
        int_report([5], inner=b"\x00" * 12, in_type=2),  # DS extension data: skipped
        int_report([1, 3, 5]),
    ]
    df, stats = parse_datagrams([group(NODE, 9) + b"".join(reports)], inner=True)
    assert stats.reports == 4 and stats.skipped_reptype == 2
    assert stats.truncated_reports == stats.malformed_reports == 0
    assert df["egress_port"].to_list() == [0x0102, None, None, 0x0102]
    assert df["queue_occupancy_cells"].to_list() == [None, 0x123456, None, 0x123456]
    assert df["inner_src_ip"].to_list() == [None, "10.0.0.1", None, None]
    assert df["seq"].to_list() == [9] * 4


def test_inner_packets_ipv6_ethernet_tlv() -> None:
    v6 = truncated_ipv6("2001:db8::1", "2001:db8::2", 17, 4791, 4791)
    tlv_v6 = struct.pack(">BBH", 0x30, len(v6) // 4, 0) + v6
    tlv_ext = struct.pack(">BBH", 0x00, 1, 7) + b"abcd"
    eth = truncated_ethernet(truncated_ipv4("10.1.2.3", "10.4.5.6", 6, 1, 2), vlan=100)
    cases = [
        (INTYPE_IPV6, v6, ("2001:db8::1", "2001:db8::2", 17, 4791, 4791, 6)),
        (INTYPE_ETHERNET, eth, ("10.1.2.3", "10.4.5.6", 6, 1, 2, 4)),
        (INTYPE_TLV, tlv_ext + tlv_v6, ("2001:db8::1", "2001:db8::2", 17, 4791, 4791, 6)),
        (INTYPE_IPV4, v6, (None, None, None, None, None, None)),  # not what InType says
        (INTYPE_IPV6, v6[:36], (None, None, None, None, None, None)),  # cut inside the header
        (INTYPE_IPV6, v6[:40], ("2001:db8::1", "2001:db8::2", 17, None, None, 6)),  # no ports
    ]
    reps = [
        IndividualReport(md=ReportMetadata(hop_latency_ns=1), in_type=t, inner=b)
        for t, b, _ in cases
    ]
    df, stats = parse_datagrams([build_report(NODE, 1, reps)], inner=True)
    assert stats.reports == len(cases)
    got = df.select(
        "inner_src_ip", "inner_dst_ip", "inner_proto", "inner_src_port", "inner_dst_port",
        "inner_ip_version",
    ).rows()  # fmt: skip
    assert got == [want for _, _, want in cases]
    assert df["hop_latency_ns"].to_list() == [1] * len(cases)


def test_inner_columns_only_when_asked() -> None:
    df, _ = parse_datagrams([spec_example()])
    assert list(df.columns) == list(REPORT_SCHEMA)
    df, _ = parse_datagrams([spec_example()], inner=True)
    assert list(df.columns) == [*REPORT_SCHEMA, *INNER_SCHEMA]
    empty, _ = parse_datagrams([b"junk"], inner=True)
    assert empty.height == 0 and list(empty.columns) == [*REPORT_SCHEMA, *INNER_SCHEMA]


def test_truncated_and_malformed_counted() -> None:
    good = int_report([1, 2])
    long = bytearray(int_report([1, 2]))
    long[1] += 1  # Report Length one word past the datagram
    short_md = bytearray(int_report([1, 2, 3]))
    short_md[2] = 1  # MD Length 1 word: the RepMdBits need 3
    short_rep = bytes([0x10, 1, 0, 0]) + b"\x00" * 4  # Report Length < RepMdBits .. DSMdStatus
    payloads = [
        group(NODE, 1) + good + bytes(long),  # second report truncated
        group(NODE, 2) + good + good[:10],  # cut inside the second report's header
        group(NODE, 3) + bytes(short_md) + good,  # malformed, the next one still found
        group(NODE, 4) + short_rep + good,
        group(NODE, 5) + good + b"\x10\x00",  # two stray bytes: no room for a report header
        b"\x20" * 7,  # shorter than the group header
        bytes([0x10]) + group(NODE, 6)[1:] + good,  # version 1
    ]
    df, stats = parse_datagrams(payloads)
    assert stats.reports == 5 and df.height == 5
    assert stats.truncated_reports == 3
    assert stats.malformed_reports == 2
    assert stats.malformed_datagrams == 2
    assert df["seq"].to_list() == [1, 2, 3, 4, 5]


def test_domain_specific_metadata_skipped_by_md_length() -> None:
    r = IndividualReport(
        md=ReportMetadata(egress_port=4, hop_latency_ns=9),
        domain_id=0x1234,
        ds_md_bits=0xC000,
        ds_md=b"\xff" * 12,
        in_type=INTYPE_IPV4,
        inner=truncated_ipv4("10.0.0.9", "10.0.0.8"),
    )
    df, stats = parse_datagrams([build_report(NODE, 1, [r, r])], inner=True)
    assert stats.domain_specific_md == 2 and stats.reports == 2
    assert df["hop_latency_ns"].to_list() == [9, 9]
    assert df["inner_src_ip"].to_list() == ["10.0.0.9"] * 2


@settings(max_examples=100, deadline=None)
@given(st.lists(st.binary(max_size=120), max_size=10), st.integers(0, 3), st.booleans())
def test_random_bytes_never_raise(blobs: list[bytes], mode: int, inner: bool) -> None:
    if mode == 1:  # a valid group header in front, so the walk reaches the reports
        blobs = [group(NODE, 1) + b for b in blobs]
    elif mode == 2:  # a valid INT report header in front of random contents
        blobs = [group(NODE, 1) + bytes([0x10 | (len(b) % 6), len(b) // 4, 0, 0]) + b
                 for b in blobs]  # fmt: skip
    elif mode == 3:  # random bytes dropped into a valid datagram
        base = spec_example()
        blobs = [base[: len(b) % len(base)] + b + base[len(b) % len(base) :] for b in blobs]
    stats = InbandStats()
    df, _ = parse_datagrams(blobs, stats, seq=SequenceTracker(), inner=inner)
    assert df.height == stats.reports
    assert stats.datagrams == len(blobs)


# ---- sequence numbers: per (Node ID, hw_id), 22 bits, wrapping ------------------------------


def test_sequence_gaps_wrap_at_22_bits() -> None:
    t = SequenceTracker()
    seqs = [SEQ_MOD - 3, SEQ_MOD - 2, SEQ_MOD - 1, 0, 1, 4, 5, SEQ_MOD - 1]  # wrap; 2, 3 lost
    dgrams = [spec_example(seq=s) for s in seqs[:-1]]
    parse_datagrams(dgrams, seq=t)
    assert t.take_lost() == {(NODE, 0): 2} and t.late == 0
    parse_datagrams([spec_example(seq=3)], seq=t)  # late: counted so, the loss stays
    assert t.late == 1 and t.take_lost() == {}
    parse_datagrams([spec_example(seq=9)], seq=t)  # across batches: 6, 7, 8 lost
    assert t.take_lost() == {(NODE, 0): 3} and t.lost_total == 5
    parse_datagrams([spec_example(seq=(9 - 5000) % SEQ_MOD)], seq=t)  # far behind: a restart
    assert t.restarts == 1 and t.take_lost() == {}


def test_sequence_per_node_and_hw_id() -> None:
    t = SequenceTracker()
    dgrams = []
    for s in range(10):
        for node, hw in ((NODE, 0), (NODE, 1), (12, 0)):
            if (node, hw, s) != (NODE, 1, 4):
                dgrams.append(group(node, s, hw) + int_report([2]))
    parse_datagrams(dgrams, seq=t)
    assert t.take_lost() == {(NODE, 1): 1}
    assert t.late == 0 and t.restarts == 0


def reference(seqs: list[tuple[int, int]], window: int) -> tuple[dict[int, int], int, int]:
    """The tracker's rules, one datagram at a time."""
    state: dict[int, tuple[int, int]] = {}
    lost: dict[int, int] = {}
    late = restarts = 0
    for k, s in seqs:
        if k not in state:
            state[k] = (s, 0)
            continue
        last, ahead = state[k]
        sd = (s - last) % SEQ_MOD
        sd = sd - SEQ_MOD if sd >= SEQ_MOD // 2 else sd
        if sd < -window:
            restarts += 1
            state[k] = (s, 0)
        elif sd > ahead:
            lost[k] = lost.get(k, 0) + sd - ahead - 1
            state[k] = (s, 0)
        else:
            late += 1
            state[k] = (s, ahead - sd)
    return {k: v for k, v in lost.items() if v}, late, restarts


@settings(max_examples=80, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.integers(0, 2),
            st.one_of(st.integers(-6, 6), st.integers(-(SEQ_MOD // 2), SEQ_MOD // 2)),
        ),
        max_size=60,
    ),
    st.integers(1, 5),
)
def test_sequence_batch_equals_one_by_one(steps: list[tuple[int, int]], parts: int) -> None:
    pos = {0: SEQ_MOD - 5, 1: 0, 2: 100}
    seqs = []
    for k, step in steps:
        pos[k] = (pos[k] + step) % SEQ_MOD
        seqs.append((k, pos[k]))
    lost, late, restarts = reference(seqs, window=8)
    t = SequenceTracker(late_window=8)
    cuts = sorted({0, len(seqs), *[(len(seqs) * i) // parts for i in range(parts)]})
    for a, b in itertools.pairwise(cuts):
        part = seqs[a:b]
        t.update(
            np.array([k for k, _ in part]),
            np.zeros(len(part), dtype=np.uint8),
            np.array([s for _, s in part]),
        )
    assert {n: v for (n, _), v in t.take_lost().items()} == lost
    assert (t.late, t.restarts) == (late, restarts)


def test_sequence_state_is_bounded() -> None:
    t = SequenceTracker(max_keys=3)
    t.update(np.arange(5), np.zeros(5, dtype=np.uint8), np.zeros(5))
    t.update(np.arange(5), np.zeros(5, dtype=np.uint8), np.full(5, 3))
    assert t.untracked == 4 and t.take_lost() == {(0, 0): 2, (1, 0): 2, (2, 0): 2}


def test_lost_reports_per_switch() -> None:
    topo = Topology.from_dict(topology())
    stats = Stats()
    agg = IntAggregator(topo, stats)
    dgrams = [spec_example(seq=s) for s in (1, 2, 5)] + [spec_example(seq=s, node=12)
                                                         for s in (7, 9)]  # fmt: skip
    reports, _ = parse_datagrams(dgrams, rx_ts=[1] * 5, seq=agg.seq)
    agg.add(reports)
    assert dict(agg.lost_by_switch) == {"leaf-0": 2, "leaf-1": 1}
    assert stats.get("int_report_loss") == 3
    assert dict(stats.detail["int_report_loss"]) == {"leaf-0": 2, "leaf-1": 1}


# ---- reports without timestamps become samples -----------------------------------------------


def test_reports_without_timestamps_stamped_by_pcap_record(tmp_path: Path) -> None:
    """The spec's example carries no timestamp: each report is placed by its record's time."""
    t0 = 1_795_946_400_000_000_000
    times = [t0 + i * 50_000_000 for i in range(6)]  # 50 ms apart: 3 intervals of 100 ms
    write_pcap(tmp_path / "int.pcap", [spec_example(seq=i) for i in range(6)], times_ns=times)
    stats = Stats()
    src = PcapSource(tmp_path / "int.pcap", Topology.from_dict(topology()), stats)
    frames = []
    while (df := src.next()) is not None:
        frames.append(df)
    got = pl.concat(frames).filter(pl.col("metric") == "int_queue_mean_bytes").sort("ts")
    assert got["ts"].to_list() == [t0 + k * 100_000_000 + 99_999_999 for k in range(3)]
    assert set(got["device"]) == {"leaf-0"} and set(got["port"]) == {"Ethernet1/1"}
    assert set(got["qual"]) == {str(SPEC_QID)}
    assert got["value"].to_list() == [SPEC_OCC * 80.0] * 3
    assert not {k: v for k, v in stats.counts.items() if v}  # nothing skipped, nothing lost


def test_pcap_microsecond_record_times(tmp_path: Path) -> None:
    """A µs-resolution pcap (magic a1b2c3d4, either byte order) gives record times in ns."""
    from collector.inband import iter_pcap_chunks
    from collector.inband.pcap import ethernet_frame

    frame = ethernet_frame(spec_example())
    for endian in ("<", ">"):
        path = tmp_path / f"us{endian == '<'}.pcap"
        with open(path, "wb") as f:
            f.write(struct.pack(endian + "IHHiIII", 0xA1B2C3D4, 2, 4, 0, 0, 65535, 1))
            f.write(struct.pack(endian + "IIII", 1_795_946_400, 250_000, len(frame), len(frame)))
            f.write(frame)
        (chunk,) = list(iter_pcap_chunks(path))
        assert chunk.ts.tolist() == [1_795_946_400_250_000_000]
