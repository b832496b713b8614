"""INT Telemetry Report v2.0: builder -> pcap -> reader -> parser, and robustness (the layout
itself, byte by byte from the specification's text, is in test_int_spec.py)."""

from __future__ import annotations

import struct
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path

import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from collector.inband import (
    InbandStats,
    PcapStats,
    ReportMetadata,
    build_report,
    iter_pcap_payloads,
    parse_datagrams,
    report,
    write_pcap,
)
from collector.inband.pcap import ethernet_frame
from collector.inband.report import IndividualReport, truncated_ipv4
from collector.inband.sequence import SequenceTracker

FULL = ReportMetadata(
    ingress_port=3,
    egress_port=17,
    hop_latency_ns=1234,
    queue_id=5,
    queue_occupancy_cells=0xABCDEF,
    ingress_ts=(1 << 63) + 7,
    egress_ts=1_700_000_000_123_456_789,
    buffer_id=1,
    buffer_occupancy_cells=4096,
)


def _datagrams() -> list[bytes]:
    return [
        build_report(11, 1, [FULL, {"hop_latency_ns": 99, "egress_port": 2}], hw_id=3),
        build_report(12, 0x3FFFFF, [{"queue_id": 7, "queue_occupancy_cells": 100}]),
        build_report(0xFFFFFFFF, 2, []),
    ]


def _check_rows(df) -> None:
    rows = df.to_dicts()
    assert len(rows) == 3
    a, b, c = rows
    assert a["node_id"] == 11 and a["seq"] == 1 and a["hw_id"] == 3
    for k in (
        "ingress_port",
        "egress_port",
        "hop_latency_ns",
        "queue_id",
        "queue_occupancy_cells",
        "ingress_ts",
        "egress_ts",
        "buffer_id",
        "buffer_occupancy_cells",
    ):
        assert a[k] == getattr(FULL, k), k
    assert b["node_id"] == 11 and b["hop_latency_ns"] == 99 and b["egress_port"] == 2
    assert b["ingress_port"] == 0  # level-1 interface ids travel as a pair (RepMdBits bit 1)
    assert b["queue_id"] is None and b["ingress_ts"] is None
    assert c["node_id"] == 12 and c["seq"] == 0x3FFFFF
    assert c["queue_id"] == 7 and c["queue_occupancy_cells"] == 100
    assert c["hop_latency_ns"] is None


def test_parse_direct() -> None:
    df, stats = parse_datagrams(_datagrams())
    _check_rows(df)
    assert stats.datagrams == 3 and stats.reports == 3
    assert stats.malformed_datagrams == stats.truncated_reports == stats.malformed_reports == 0


def test_pcap_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "int.pcap"
    assert write_pcap(path, _datagrams()) == 3
    ps = PcapStats()
    chunks = list(iter_pcap_payloads(path, chunk_size=2, stats=ps))
    assert [len(c) for c in chunks] == [2, 1]
    df, _ = parse_datagrams([p for c in chunks for p in c])
    _check_rows(df)
    assert ps.records == 3 and ps.payloads == 3


def test_pcap_big_endian_vlan_and_filtering(tmp_path: Path) -> None:
    good = build_report(21, 9, [{"hop_latency_ns": 5}])
    frame = ethernet_frame(good)
    vlan = frame[:12] + b"\x81\x00\x00\x64" + frame[12:]
    other_port = ethernet_frame(good, port=4789)
    arp = frame[:12] + b"\x08\x06" + frame[14:]
    recs = [frame, vlan, other_port, arp, frame[:30]]
    path = tmp_path / "be.pcap"
    with open(path, "wb") as f:
        f.write(struct.pack(">IHHiIII", 0xA1B2C3D4, 2, 4, 0, 0, 65535, 1))
        for r in recs:
            f.write(struct.pack(">IIII", 1, 2, len(r), len(r)) + r)
        f.write(b"\x00\x00\x00\x01\x00")  # truncated record header
    ps = PcapStats()
    payloads = [p for c in iter_pcap_payloads(path, stats=ps) for p in c]
    assert payloads == [good, good]
    assert ps.wrong_port == 1 and ps.not_ipv4_udp == 1 and ps.truncated == 2
    df, _ = parse_datagrams(payloads)
    assert df["hop_latency_ns"].to_list() == [5, 5]


def test_not_pcap(tmp_path: Path) -> None:
    path = tmp_path / "x.pcap"
    path.write_bytes(b"\x0a\x0d\x0d\x0a" + b"\x00" * 40)  # pcapng
    with pytest.raises(ValueError):
        list(iter_pcap_payloads(path))


def test_malformed_counted_and_skipped() -> None:
    good = _datagrams()
    full = good[0]
    wrong_version = bytes([0x10]) + full[1:]
    cut = full[:-4]  # the second report's Report Length now runs past the datagram
    # MD Length smaller than the RepMdBits need
    one = build_report(40, 1, [{"hop_latency_ns": 1, "egress_ts": 2}])
    bad_md = one[:10] + b"\x01" + one[11:]
    other_type = build_report(41, 1, [{"hop_latency_ns": 1}], rep_type=2)
    payloads = [
        b"",
        b"\x20",
        b"garbage" * 5,
        wrong_version,
        good[0],
        cut,
        bad_md,
        other_type,
        good[1],
        good[2],
    ]
    df, stats = parse_datagrams(payloads)
    assert df.height == 4  # good[0]'s two, the first of cut, good[1]'s one
    _check_rows(df.filter(pl.int_range(pl.len()) != 2))
    assert df.row(2, named=True)["ingress_ts"] == FULL.ingress_ts  # cut's first report is whole
    assert stats.datagrams == len(payloads)
    assert stats.malformed_datagrams == 4  # empty, 1 byte, garbage ("g": version 6), version 1
    assert stats.truncated_reports == 1  # cut's second report
    assert stats.malformed_reports == 1
    assert stats.skipped_reptype == 1
    assert stats.reports == 4


def test_stats_accumulate() -> None:
    total = InbandStats()
    parse_datagrams(_datagrams(), total)
    parse_datagrams([b"x"], total)
    assert total.datagrams == 4 and total.reports == 3 and total.malformed_datagrams == 1
    df, _ = parse_datagrams([])
    assert df.height == 0 and "node_id" in df.columns


@contextmanager
def numpy_walk() -> Iterator[None]:
    """Walk every batch with numpy, however few datagrams are left (not in Python)."""
    before = report.SCALAR_BELOW
    report.SCALAR_BELOW = 0
    try:
        yield
    finally:
        report.SCALAR_BELOW = before


@settings(max_examples=80, deadline=None)
@given(st.lists(st.binary(max_size=96), max_size=8), st.integers(0, 3), st.booleans())
def test_never_raises(blobs: list[bytes], mode: int, vector: bool) -> None:
    # mode 1-3: start from a valid header so the walk gets past the group header (and into
    # the first report's header and metadata)
    if mode:
        blobs = [build_report(1, 1, [FULL])[: 8 * mode] + b for b in blobs]
    with numpy_walk() if vector else nullcontext():
        df, stats = parse_datagrams(blobs, inner=True)
    assert df.height == stats.reports
    assert stats.datagrams == len(blobs)


@settings(max_examples=20, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.binary(max_size=80),
            st.lists(
                st.fixed_dictionaries(
                    {},
                    optional={
                        "egress_port": st.integers(0, 0xFFFF),
                        "hop_latency_ns": st.integers(0, 0xFFFFFFFF),
                        "queue_occupancy_cells": st.integers(0, 0xFFFFFF),
                        "egress_ts": st.integers(0, (1 << 64) - 1),
                        "buffer_id": st.integers(0, 255),
                    },
                ),
                max_size=5,
            ).map(lambda reps: build_report(7, 1, reps)),
            st.builds(
                lambda seq, n, inner: build_report(
                    8,
                    seq,
                    [IndividualReport(ReportMetadata(hop_latency_ns=1), in_type=4, inner=inner)]
                    * n,
                ),
                st.integers(0, 40),
                st.integers(1, 3),
                st.sampled_from([truncated_ipv4("10.0.0.1", "10.0.0.2"), b"\x45" * 12, b""]),
            ),
        ),
        max_size=12,
    ),
    st.integers(0, 40),
)
def test_batch_equals_one_by_one(blobs: list[bytes], cut: int) -> None:
    """The vectorised walk over a batch gives what parsing each datagram alone gives."""
    if blobs and cut:
        blobs[0] = blobs[0][:-cut]  # truncated in the middle somewhere
    rx = list(range(len(blobs)))
    bseq, oseq = SequenceTracker(), SequenceTracker()
    with numpy_walk():  # the batch walked by numpy, each datagram alone in Python
        batch, bstats = parse_datagrams(blobs, rx_ts=rx, seq=bseq, inner=True)
    parts = [
        parse_datagrams([b], rx_ts=[t], seq=oseq, inner=True)
        for b, t in zip(blobs, rx, strict=True)
    ]
    one = [row for df, _ in parts for row in df.to_dicts()]
    assert batch.to_dicts() == one
    total = InbandStats()
    for _, s in parts:
        total.merge(s)
    assert bstats == total
    seen = [(t.take_lost(), t.late, t.restarts) for t in (bseq, oseq)]
    assert seen[0] == seen[1]


@settings(max_examples=40, deadline=None)
@given(frames=st.lists(st.binary(min_size=0, max_size=120), max_size=10), cut=st.integers(0, 60))
def test_pcap_reader_never_raises_on_records(
    frames: list[bytes], cut: int, tmp_path_factory: pytest.TempPathFactory
) -> None:
    good = ethernet_frame(build_report(3, 1, [{"hop_latency_ns": 9}]))
    path = tmp_path_factory.mktemp("fuzz") / "f.pcap"
    recs = [good, *frames, good]
    with open(path, "wb") as f:
        f.write(struct.pack("<IHHiIII", 0xA1B2C3D4, 2, 4, 0, 0, 65535, 1))
        for r in recs:
            f.write(struct.pack("<IIII", 1, 2, len(r), len(r)) + r)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - cut])
    ps = PcapStats()
    payloads = [p for c in iter_pcap_payloads(path, port=None, stats=ps) for p in c]
    assert ps.records <= len(recs)
    assert ps.payloads == len(payloads) >= 1  # the first record is whole
    df, _ = parse_datagrams(payloads)
    assert df.height <= len(payloads) * 5 + 2
