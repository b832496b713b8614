"""Every decoder of outside input, fuzzed (Hypothesis): gnmic JSON event lines, NIC JSON
snapshots, TelemetryBatch bytes, pcap files, topology and config YAML.

The property for each: arbitrary or mutated input never raises anything but the decoder's own
error type (bad records: counted and skipped; unusable files: ``ValueError`` for pcap,
``ConfigError`` for YAML, ``BadInput`` for a Kafka message), and valid input decodes as it should.
INT datagrams are fuzzed in tests/test_int_spec.py and tests/test_inband.py.

Examples are few and inputs small (each test well under the fast tier's 2 s); Hypothesis keeps
no database here (``database=None``), so no file is left in the tree.
"""

from __future__ import annotations

import dataclasses
import logging
import string
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import polars as pl
import pytest
import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from pygnmi.spec.v080 import gnmi_pb2 as gpb

from collector.decode import GnmicEventDecoder, NicSnapshotDecoder
from collector.inband import PcapStats, iter_pcap_chunks, iter_pcap_payloads, write_pcap
from rocewatch import wire
from rocewatch.config import Config, load_config
from rocewatch.core.errors import BadInput, ConfigError
from rocewatch.core.model import SAMPLE_SCHEMA, conform
from rocewatch.core.topology import Topology
from rocewatch.notify.base import AlertmanagerConfig, WebhookConfig

FUZZ = settings(
    max_examples=200,
    deadline=None,  # the first example pays for imports; the budget is the test's, below
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
I64 = 1 << 63
U64 = 1 << 64


@pytest.fixture(autouse=True)
def _quiet_skips() -> Iterator[None]:
    """Skipped input is counted (what the tests check) and logged once per kind per decoder:
    a fresh decoder per example would log thousands of lines, most of these tests' time."""
    log = logging.getLogger("rocewatch.core.stats")
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        yield
    finally:
        log.setLevel(level)


TOPO = Topology.from_dict(
    {
        "switches": [{"name": "leaf-r0-p0", "role": "leaf", "address": "10.0.0.11"}],
        "nodes": [
            {"name": "gpu-001", "nics": [{"nic": "mlx5_0", "switch_port": "leaf-r0-p0/Ethernet33"}]}
        ],
    }
)

# Characters that names and values meet: ASCII, control characters, accents, CJK, an emoji,
# and the separators paths and references use. An explicit alphabet: Hypothesis' default one
# builds a table of every Unicode character the first time (seconds, once per run).
ALPHABET = string.printable + '\x00\x01\x7f\u00e9\u00fc\u00a0\u2028\u4e2d\U0001f642/:[]={}"\\'


_CHARS = st.sampled_from(ALPHABET)


def texts(min_size: int = 0, max_size: int = 12) -> st.SearchStrategy[str]:
    # (not st.text: even with an alphabet it loads Hypothesis' Unicode table, once per run)
    return st.lists(_CHARS, min_size=min_size, max_size=max_size).map("".join)


# any JSON value, with integers over the whole range orjson writes (i64 and u64)
scalars = (
    st.none()
    | st.booleans()
    | st.integers(-I64, U64 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | texts(max_size=12)
    | st.sampled_from(["17", "-1", " 42 ", "1e3", "nan", "inf", "18446744073709551616", "0x10"])
)
json_values = st.recursive(
    scalars,
    lambda c: st.lists(c, max_size=3) | st.dictionaries(texts(max_size=8), c, max_size=3),
    max_leaves=4,
)


@st.composite
def mutated(draw: st.DrawFn, valid: st.SearchStrategy[bytes]) -> bytes:
    """A valid encoding with a few bytes flipped, cut, inserted or deleted."""
    data = bytearray(draw(valid))
    for _ in range(draw(st.integers(1, 4))):
        op = draw(st.sampled_from(["flip", "set", "insert", "delete", "cut"]))
        i = draw(st.integers(0, max(len(data) - 1, 0)))
        if op == "cut":
            del data[i:]
        elif not data:
            data.append(draw(st.integers(0, 255)))
        elif op == "flip":
            data[i] ^= 1 << draw(st.integers(0, 7))
        elif op == "set":
            data[i] = draw(st.integers(0, 255))
        elif op == "insert":
            data[i:i] = draw(st.binary(min_size=1, max_size=8))
        else:
            del data[i : i + draw(st.integers(1, 8))]
    return bytes(data)


def check_frame(df: pl.DataFrame) -> None:
    assert dict(df.schema) == SAMPLE_SCHEMA


# --- gnmic JSON event lines (docs/formats.md section 2) ----------------------------------------

# path -> (canonical metric, the tag that names its interface, the tag that names its qual)
GNMI_COUNTERS = {
    "/interfaces/interface/state/counters/in-fcs-errors": (
        "port_in_fcs_errors",
        "interface_name",
        None,
    ),
    "/qos/interfaces/interface/switch-priority/state/counters/out-pause-pkts": (
        "pfc_tx_pause_frames",
        "interface_interface-id",
        "switch-priority_priority",
    ),
}
GNMI_PATHS = [
    *GNMI_COUNTERS,
    "/qos/interfaces/interface/output/queues/queue/state/instant-queue-len",
    "/COUNTERS/Ethernet0/SAI_PORT_STAT_PFC_3_RX_PAUSE_DURATION_US",
    "/unknown/path",
]
SOURCES = ["leaf-r0-p0", "leaf-r0-p0:9339", "10.0.0.11", "stranger:57400", ""]
TAGS = ["interface_name", "interface_interface-id", "queue_name", "switch-priority_priority"]

gnmic_events = st.fixed_dictionaries(
    {
        "timestamp": st.integers(-I64, U64 - 1) | json_values,
        "tags": st.fixed_dictionaries(
            {"source": st.sampled_from(SOURCES) | json_values},
            optional={t: texts(max_size=8) | json_values for t in TAGS},
        )
        | json_values,
        "values": st.dictionaries(
            st.sampled_from(GNMI_PATHS) | texts(max_size=16), json_values, max_size=4
        )
        | json_values,
    },
    optional={"name": json_values},
)
gnmic_lines = (gnmic_events | st.lists(gnmic_events, max_size=2) | json_values).map(orjson.dumps)


@settings(FUZZ, max_examples=100)  # the richest inputs here: half the examples, same budget
@given(st.lists(gnmic_lines | mutated(gnmic_lines) | st.binary(max_size=64), max_size=3))
def test_gnmic_events_never_raise(lines: list[bytes]) -> None:
    """Whatever the lines hold, a batch comes back: a bad event, value or timestamp (one past
    64 bits failed the whole batch's frame) is counted and skipped, never the batch."""
    d = GnmicEventDecoder(TOPO)
    df = d.decode_lines(lines)
    check_frame(df)
    assert set(df["device"].to_list()) <= {"leaf-r0-p0"}
    assert df["port"].str.len_chars().min() or df.height == 0  # never a row without a port


@FUZZ
@given(
    st.lists(
        st.tuples(
            st.sampled_from(sorted(GNMI_COUNTERS)),
            texts(min_size=1, max_size=10),  # any port name a vendor uses
            st.sampled_from(["0", "3", "7"]),
            st.integers(0, U64 - 1),
            st.integers(0, I64 - 1),
            st.booleans(),  # the value as a decimal string (gnmic's usual) or a JSON number
        ),
        min_size=1,
        max_size=3,
    ),
    st.sampled_from(SOURCES[:3]),
)
def test_gnmic_valid_counters_decode_exactly(
    events: list[tuple[str, str, str, int, int, bool]], source: str
) -> None:
    """Valid events give one row each: their device, port, qual and exact 64-bit value."""
    lines = []
    want = []
    for path, port, qual, value, ts, as_text in events:
        metric, port_tag, qual_tag = GNMI_COUNTERS[path]
        tags = {"source": source, port_tag: port}
        if qual_tag:
            tags[qual_tag] = qual
        v: Any = str(value) if as_text else value
        lines.append(orjson.dumps({"timestamp": ts, "tags": tags, "values": {path: v}}))
        want.append((ts, "leaf-r0-p0", port, qual if qual_tag else "", metric, value))
    d = GnmicEventDecoder(TOPO)
    df = d.decode_lines(lines)
    got = [
        (r["ts"], r["device"], r["port"], r["qual"], r["metric"], r["raw"]) for r in df.to_dicts()
    ]
    assert got == want
    assert df["value"].to_list() == [float(w[-1]) for w in want]
    assert not d.stats.counts


def test_gnmic_out_of_range_timestamp_and_scaled_counter_are_counted() -> None:
    """The cases the fuzzing found: a timestamp past 64 bits (signed) and a counter that a
    mapping's scale takes past 64 bits failed the whole batch; now each is counted alone."""
    ok = {"source": "leaf-r0-p0", "interface_name": "Ethernet1"}
    fcs = "/interfaces/interface/state/counters/in-fcs-errors"
    lines = [
        orjson.dumps({"timestamp": U64 - 1, "tags": ok, "values": {fcs: 1}}),
        orjson.dumps({"timestamp": True, "tags": ok, "values": {fcs: 1}}),
        orjson.dumps({"timestamp": 5, "tags": ok, "values": {fcs: "9"}}),
    ]
    d = GnmicEventDecoder(TOPO)
    df = d.decode_lines(lines)
    assert df["raw"].to_list() == [9]
    assert d.stats.get("malformed_events") == 2


# --- gNMI notifications (a target's SubscribeResponses, collector/gnmi/decode.py) --------------


json_bytes = json_values.map(orjson.dumps)
# built once: a strategy made per draw costs Hypothesis more than the decoding
TYPED_VALUES = st.one_of(
    st.builds(lambda v: gpb.TypedValue(uint_val=v), st.integers(0, U64 - 1)),
    st.builds(lambda v: gpb.TypedValue(int_val=v), st.integers(-I64, I64 - 1)),
    st.builds(lambda v: gpb.TypedValue(double_val=v), st.floats()),
    st.builds(lambda v: gpb.TypedValue(float_val=v), st.floats(width=32)),
    st.builds(lambda v: gpb.TypedValue(string_val=v), texts() | st.sampled_from(["17", "1e400"])),
    st.builds(lambda v: gpb.TypedValue(bool_val=v), st.booleans()),
    st.builds(lambda v: gpb.TypedValue(bytes_val=v), st.binary(max_size=8)),
    st.builds(lambda v: gpb.TypedValue(json_val=v), st.binary(max_size=16) | json_bytes),
    st.builds(lambda v: gpb.TypedValue(json_ietf_val=v), json_bytes),
    st.builds(
        lambda d, p: gpb.TypedValue(decimal_val=gpb.Decimal64(digits=d, precision=p)),
        st.integers(-I64, I64 - 1),
        st.integers(0, (1 << 32) - 1),  # a uint32: 10**precision must not be computed whole
    ),
    st.just(gpb.TypedValue()),
)
GNMI_ELEMS = ["interfaces", "interface", "state", "counters", "in-fcs-errors", "qos", "queue"]
GNMI_PATHS_PB = st.lists(
    st.builds(
        lambda n, k: gpb.PathElem(name=n, key=k),
        st.sampled_from(GNMI_ELEMS) | texts(max_size=6),
        st.dictionaries(st.sampled_from(["name", "id", "priority"]), texts(max_size=8), max_size=2),
    ),
    max_size=4,
).map(lambda elems: gpb.Path(elem=elems)) | st.lists(  # the deprecated string form (gNMI < 0.4)
    st.sampled_from(["interfaces", "interface[name=Ethernet1/1]", "state", "a[k=v", "b[k]", ""])
    | texts(max_size=8),
    max_size=4,
).map(lambda els: gpb.Path(element=els))
FCS_PB = texts(min_size=1, max_size=8).map(
    lambda port: gpb.Path(
        elem=[
            gpb.PathElem(name="interfaces"),
            gpb.PathElem(name="interface", key={"name": port}),
            gpb.PathElem(name="state"),
            gpb.PathElem(name="counters"),
            gpb.PathElem(name="in-fcs-errors"),
        ]
    )
)
NOTIFICATIONS = st.builds(
    lambda ts, prefix, updates, deletes: gpb.Notification(
        timestamp=ts,
        prefix=prefix,
        update=[gpb.Update(path=p, val=v) for p, v in updates],
        delete=deletes,
    ),
    st.integers(-I64, I64 - 1),
    st.none() | GNMI_PATHS_PB,
    st.lists(st.tuples(FCS_PB | GNMI_PATHS_PB, TYPED_VALUES), max_size=4),
    st.lists(GNMI_PATHS_PB, max_size=1),
)


@settings(FUZZ, max_examples=100)  # protobuf structures: the costliest inputs to generate
@given(st.lists(NOTIFICATIONS, min_size=1, max_size=2))
def test_gnmi_notifications_never_raise(notifs: list[Any]) -> None:
    """Whatever a target sends, the shared decoder keeps everyone's batch (a Decimal64 of
    precision 4e9 used to compute 10**4e9: the collector hung; an element path 'a[k=v' raised
    ConfigError, which ended the target's session for good), and the event output the
    collector writes for it serialises."""
    from collector.gnmi.decode import NotificationDecoder, notification_events

    d = NotificationDecoder()
    seen = sum(d.add_notification("leaf-0", n) for n in notifs)
    df = d.take()
    check_frame(df)
    assert df.height <= seen
    for n in notifs:
        orjson.dumps(notification_events("leaf-0:9339", "fabric", n))


# --- NIC JSON snapshots (docs/formats.md section 3) --------------------------------------------

NIC_COUNTERS = {  # section, driver name -> canonical metric, qual, scale
    ("ethtool", "rx_crc_errors_phy"): ("nic_rx_crc_errors", "", 1),
    ("ethtool", "rx_prio3_pause"): ("nic_rx_pause_frames", "3", 1),
    ("hw_counters", "out_of_sequence"): ("nic_out_of_sequence", "", 1),
    ("port_counters", "port_xmit_data"): ("nic_port_tx_bytes", "", 4),
}
NIC_NAMES = {
    "ethtool": ["rx_prio3_pause", "tx_prio3_pause_duration", "rx_crc_errors_phy", "x_unknown"],
    "hw_counters": ["out_of_sequence", "np_cnp_sent", "hw_unknown"],
    "port_counters": ["port_rcv_data", "port_xmit_data", "port_rcv_errors"],
    "mlxlink": ["raw_ber", "effective_ber", "effective_errors", "nonsense"],
    "pcie": ["current_link_speed", "max_link_speed", "current_link_width", "max_link_width"],
}


def _section(names: list[str]) -> st.SearchStrategy[Any]:
    return (
        st.dictionaries(
            st.sampled_from(names) | texts(max_size=8),
            json_values | st.sampled_from(["32.0 GT/s PCIe", "16 GT/s", "8.0 GT/s", "GT/s"]),
            max_size=4,
        )
        | json_values
    )


nic_snapshots = st.fixed_dictionaries(
    {
        "timestamp": st.integers(-I64, U64 - 1) | json_values,
        "node": st.sampled_from(["gpu-001", "gpu-999"]) | json_values,
        "nic": st.sampled_from(["mlx5_0"]) | json_values,
    },
    optional={
        "speed_mbps": json_values,
        "netdev": json_values,
        **{s: _section(n) for s, n in NIC_NAMES.items()},
    },
)
nic_lines = (nic_snapshots | json_values).map(orjson.dumps)


@settings(FUZZ, max_examples=120)  # rich nested snapshots: the budget's share
@given(st.lists(nic_lines | mutated(nic_lines) | st.binary(max_size=64), max_size=3))
def test_nic_snapshots_never_raise(lines: list[bytes]) -> None:
    d = NicSnapshotDecoder(TOPO)
    df = d.decode_lines(lines)
    check_frame(df)


@settings(FUZZ, max_examples=80)  # two decoders and a wire round trip per example
@given(st.lists(nic_lines | mutated(nic_lines), max_size=3))
def test_the_agents_batches_of_any_snapshots_decode_to_the_services_frame(
    lines: list[bytes],
) -> None:
    """The node agent encodes its rows itself (collector/nic/batch.py, no Polars on the node):
    whatever the snapshots hold, the bytes it sends decode to what the services' decoder makes
    of the same lines (an agent that raised here would stop sending for its node)."""
    from collector.nic import batch
    from collector.nic.samples import SnapshotReader

    cols = SnapshotReader().read_lines(lines)  # the mapping tables the agent ships
    want = NicSnapshotDecoder(None).decode_lines(lines)
    assert wire.decode(batch.encode(cols, source="agent:gpu-001", seq=1)).equals(want)


@FUZZ
@given(
    st.lists(
        st.tuples(st.sampled_from(sorted(NIC_COUNTERS)), st.integers(0, U64 - 1)),
        min_size=1,
        max_size=4,
        unique_by=lambda x: x[0],
    ),
    st.integers(-I64, I64 - 1),
)
def test_nic_valid_counters_decode_exactly(
    counters: list[tuple[tuple[str, str], int]], ts: int
) -> None:
    """Valid counters give their exact value (times the mapping's scale); one scaled past 64
    bits (IB data words x 4 near a wrap: it failed the batch) is counted and skipped."""
    doc: dict[str, Any] = {"timestamp": ts, "node": "gpu-001", "nic": "mlx5_0"}
    want = {}
    for (section, name), v in counters:
        doc.setdefault(section, {})[name] = v
        metric, qual, scale = NIC_COUNTERS[(section, name)]
        if v * scale < U64:
            want[metric] = (qual, v * scale)
    d = NicSnapshotDecoder(TOPO)
    df = d.decode_lines([orjson.dumps(doc)])
    got = {r["metric"]: (r["qual"], r["raw"]) for r in df.to_dicts()}
    assert got == want
    assert set(df["ts"].to_list()) <= {ts}
    assert d.stats.get("out_of_range_values") == len(counters) - len(want)


def test_nic_out_of_range_timestamp_is_counted() -> None:
    d = NicSnapshotDecoder(TOPO)
    bad = {"node": "gpu-001", "nic": "mlx5_0", "ethtool": {"rx_crc_errors_phy": 1}}
    df = d.decode_lines(
        [
            orjson.dumps({**bad, "timestamp": U64 - 1}),
            orjson.dumps({**bad, "timestamp": False}),
            orjson.dumps({**bad, "timestamp": 7}),
        ]
    )
    assert df["ts"].to_list() == [7]
    assert d.stats.get("malformed_snapshots") == 2


# --- TelemetryBatch bytes (proto/rocewatch/v1/telemetry.proto) ---------------------------------

sample_rows = st.lists(
    st.tuples(
        st.integers(-I64, I64 - 1),
        st.sampled_from(["leaf-0", "gpu-001", "spine/0", ""]),
        texts(max_size=6),
        st.sampled_from(["", "3"]),
        st.sampled_from(["pfc_rx_pause_us", "port_in_fcs_errors", "queue_depth_bytes"]),
        st.floats(allow_nan=False),
        st.none() | st.integers(0, U64 - 1),
    ),
    max_size=8,
)


def frame_of(rows: list[tuple[Any, ...]]) -> pl.DataFrame:
    cols = list(SAMPLE_SCHEMA)
    return conform(
        pl.DataFrame([dict(zip(cols, r, strict=True)) for r in rows], schema=SAMPLE_SCHEMA)
    )


@settings(FUZZ, max_examples=150)  # a frame built, encoded and decoded per example
@given(sample_rows, texts(max_size=8), st.integers(0, U64 - 1))
def test_wire_round_trip(rows: list[tuple[Any, ...]], source: str, seq: int) -> None:
    df = frame_of(rows)
    data = wire.encode(df, source=source, seq=seq)
    assert wire.decode(data).equals(df)
    got = wire.parse(data)
    assert (got.source, got.seq, got.rows) == (source, seq, df.height)


encoded = sample_rows.map(lambda rows: wire.encode(frame_of(rows), source="c", seq=1))


@settings(FUZZ, max_examples=150)  # a frame built and encoded per example
@given(encoded | mutated(encoded) | st.binary(max_size=200))
def test_wire_bad_bytes_raise_only_bad_input(data: bytes) -> None:
    """A message from the topic is a batch or ``BadInput`` (the consumer counts and skips it)."""
    try:
        df = wire.decode(data)
    except BadInput:
        return
    check_frame(df)
    assert df.height == wire.parse(data).rows


# --- pcap files (collector/inband/pcap.py) -----------------------------------------------------

payload_lists = st.lists(st.binary(max_size=40), max_size=5)


def pcap_bytes(tmp: Path, payloads: list[bytes]) -> bytes:
    write_pcap(tmp / "w.pcap", payloads)
    return (tmp / "w.pcap").read_bytes()


def read_all(path: Path, stats: PcapStats) -> int:
    n = 0
    for c in iter_pcap_chunks(path, port=None, chunk_bytes=64, stats=stats):
        n += len(c)
        assert len(c.payloads()) == len(c)
    return n


@FUZZ
@given(data=st.data())
def test_pcap_files_raise_only_value_error(
    data: st.DataObject, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Any file: not pcap at all -> ``ValueError`` when opened (replay turns it into exit 2);
    a pcap file with damaged records -> its records counted, never an exception mid-file."""
    tmp = tmp_path_factory.mktemp("pcap")
    valid = pcap_bytes(tmp, data.draw(payload_lists))
    blob = data.draw(
        st.just(valid)
        | mutated(st.just(valid))
        | st.binary(max_size=120)
        # a valid header and garbage records: the walk of record headers
        | st.binary(max_size=120).map(lambda b: valid[:24] + b)
    )
    path = tmp / "f.pcap"
    path.write_bytes(blob)
    ps = PcapStats()
    try:
        n = read_all(path, ps)
    except ValueError:
        assert blob[:24] != valid[:24]  # only a damaged file header is unusable
        return
    assert ps.payloads == n <= ps.records


@FUZZ
@given(payloads=payload_lists, chunk=st.sampled_from([64, 100, 4096]))
def test_pcap_round_trip(payloads: list[bytes], chunk: int, tmp_path: Path) -> None:
    """What write_pcap wrote reads back, in order, whatever the chunking."""
    path = tmp_path / "rt.pcap"
    write_pcap(path, payloads)
    ps = PcapStats()
    got = [p for c in iter_pcap_chunks(path, chunk_bytes=chunk, stats=ps) for p in c.payloads()]
    assert got == payloads
    assert ps.records == ps.payloads == len(payloads) and ps.truncated == 0
    assert [p for c in iter_pcap_payloads(path) for p in c] == payloads


@FUZZ
@given(
    payloads=st.lists(st.binary(min_size=8, max_size=40), min_size=3, max_size=8),
    which=st.integers(0, 7),
    field=st.integers(0, 15),  # a byte of the header: ts_sec, ts_frac, incl_len, orig_len
    bits=st.integers(1, 255),
)
# The full-suite failure (records=1, truncated=2, corrupt=0), found on the reader before its time
# guard (24b4969): the first record's incl_len 50 -> 49 still fits its orig_len (a snap-cut
# frame, counted truncated), so the next header was read a byte early; its lengths (50 << 8)
# passed the length checks and swallowed the file as a truncated last record. Its time is years
# off the capture's and no IP frame follows it, so it is damage, not a truncated last record.
@example(payloads=[bytes(8)] * 3, which=0, field=8, bits=3)
def test_pcap_one_damaged_record_header_costs_that_record_only(
    payloads: list[bytes], which: int, field: int, bits: int, tmp_path: Path
) -> None:
    """A damaged record header (a flipped byte in its lengths or time) is counted and reading
    resumes at the next record: it used to end the file there, or a length made larger
    swallowed the records after it."""
    path = tmp_path / "d.pcap"
    write_pcap(path, payloads)
    data = bytearray(path.read_bytes())
    which %= len(payloads)
    at = 24 + sum(16 + 42 + len(p) for p in payloads[:which])  # Ethernet+IPv4+UDP: 42 bytes
    data[at + field] ^= bits
    path.write_bytes(bytes(data))
    ps = PcapStats()
    got = [p for c in iter_pcap_chunks(path, chunk_bytes=64, stats=ps) for p in c.payloads()]
    rest = payloads[:which] + payloads[which + 1 :]
    assert got in (rest, payloads), (which, field, bits, ps)
    assert ps.corrupt <= 1


def test_pcap_of_garbage_after_a_good_header_is_read_in_one_pass(tmp_path: Path) -> None:
    """16 MiB of garbage behind a valid file header: one damaged stretch, counted, read at
    the speed of a scan (a header unpacked per byte took 15 s; a replay must not hang)."""
    import random
    import time

    path = tmp_path / "g.pcap"
    header = struct.pack("<IHHiIII", 0xA1B23C4D, 2, 4, 0, 0, 262144, 1)
    path.write_bytes(header + random.Random(5).randbytes(16 << 20))
    ps = PcapStats()
    t0 = time.perf_counter()
    assert sum(len(c) for c in iter_pcap_chunks(path, stats=ps)) == 0
    took = time.perf_counter() - t0
    assert ps.corrupt == 1 and ps.records == 0
    assert took < 6.0, took


def test_pcap_header_of_another_kind_is_a_value_error(tmp_path: Path) -> None:
    path = tmp_path / "x.pcap"
    path.write_bytes(struct.pack("<IHHiIII", 0xA1B2C3D4, 2, 4, 0, 0, 65535, 105))  # 802.11
    with pytest.raises(ValueError, match="link type"):
        iter_pcap_chunks(path)


# --- topology YAML (docs/formats.md section 1) -------------------------------------------------

VALID_TOPOLOGY: dict[str, Any] = {
    "fabric": "fuzz",
    "switches": [
        {
            "name": "leaf-0",
            "role": "leaf",
            "rail": 0,
            "address": "10.0.0.1",
            "int_node_id": 11,
            "int_ports": {1: "Ethernet1/1"},
            "int_cell_bytes": 80,
            "buffer_bytes": 1 << 26,
        },
        {"name": "spine-0", "role": "spine"},
    ],
    "links": [{"a": "leaf-0/Ethernet9", "b": "spine-0/Ethernet1"}],
    "nodes": [
        {
            "name": "gpu-001",
            "scheduler": "slurm",
            "nics": [
                {
                    "nic": "mlx5_0",
                    "netdev": "eth0",
                    "speed_gbps": 400,
                    "rail": 0,
                    "switch_port": "leaf-0/Ethernet1/1",
                }
            ],
        }
    ],
    "jobs": [{"name": "llm", "tenant": "a", "priority": 3, "nodes": ["gpu-001"]}],
}


def _paths(doc: Any, at: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every place in a nested document (dict keys, list indices)."""
    out = [at]
    if isinstance(doc, dict):
        for k, v in doc.items():
            out += _paths(v, (*at, k))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            out += _paths(v, (*at, i))
    return out


def _replace(doc: Any, at: tuple[Any, ...], value: Any) -> Any:
    if not at:
        return value
    head, rest = at[0], at[1:]
    if isinstance(doc, dict):
        return {**doc, head: _replace(doc[head], rest, value)}
    out = list(doc)
    out[head] = _replace(doc[head], rest, value)
    return out


@st.composite
def damaged(draw: st.DrawFn, doc: dict[str, Any]) -> Any:
    """``doc`` with a few values (or whole sections) replaced by any YAML-able value."""
    places = _paths(doc)
    for _ in range(draw(st.integers(1, 3))):
        at = draw(st.sampled_from(places))
        doc = _replace(doc, at, draw(json_values))
        places = _paths(doc)
    return doc


def _load_topology(path: Path) -> Topology | None:
    try:
        return Topology.load(path)
    except ConfigError as e:
        assert str(e).strip()
        return None


@FUZZ
@given(
    text=damaged(VALID_TOPOLOGY).map(yaml.safe_dump)
    | mutated(st.just(yaml.safe_dump(VALID_TOPOLOGY)).map(str.encode)).map(
        lambda b: b.decode("utf-8", "replace")
    )
    | texts(max_size=80)
)
def test_topology_yaml_raises_only_config_error(text: str, tmp_path: Path) -> None:
    path = tmp_path / "topology.yaml"
    path.write_text(text)
    _load_topology(path)


@FUZZ
@given(data=st.binary(max_size=80) | mutated(st.just(yaml.safe_dump(VALID_TOPOLOGY).encode())))
def test_topology_file_bytes_raise_only_config_error(data: bytes, tmp_path: Path) -> None:
    """A file that is not UTF-8 text (a binary dropped in by mistake) is a ConfigError too."""
    path = tmp_path / "topology.yaml"
    path.write_bytes(data)
    _load_topology(path)


def test_topology_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "topology.yaml"
    path.write_text(yaml.safe_dump(VALID_TOPOLOGY))
    topo = Topology.load(path)
    again = Topology.from_dict(topo.to_dict())
    assert again.to_dict() == topo.to_dict()
    assert topo.resolve_device("10.0.0.1:9339") == "leaf-0"
    assert topo.switches["leaf-0"].int_ports == {1: "Ethernet1/1"}


# --- config YAML (rocewatch/config.py) ---------------------------------------------------------


def _fields(cls: Any) -> list[str]:
    return [f.name for f in dataclasses.fields(cls)]


def _detector_keys() -> dict[str, list[str]]:
    from detectors.registry import DETECTORS

    return {name: _fields(e.config) for name, e in DETECTORS.items()}


DETECTOR_KEYS = _detector_keys()
CONFIG_KEYS: dict[str, list[str]] = {
    "window": _fields(Config().window),
    "lifecycle": _fields(Config().lifecycle),
    "actions": _fields(Config().policy),
    "membership": _fields(Config().membership),
    "api": _fields(Config().api),
    "kafka": _fields(Config().kafka),
    "agent": _fields(Config().agent),
    "executors": _fields(Config().executors),
    "notify": ["retry", "poll_s", "drain_timeout_s", "seed", "outbox_url"],
    "storage": ["url", "retention_days"],
}
SINK_KEYS = sorted({*_fields(WebhookConfig), *_fields(AlertmanagerConfig)})
TOP_SCALARS = ["state_dir", "metrics_port", "topology", "inhibit_wait_s", "inhibit_rules", "gnmi"]


def _settings(keys: list[str]) -> st.SearchStrategy[Any]:
    """A section's own settings with values of any type (the common mistake), or anything."""
    return st.dictionaries(st.sampled_from(keys), json_values, max_size=3) | json_values


@st.composite
def config_docs(draw: st.DrawFn) -> dict[str, Any]:
    doc: dict[str, Any] = {}
    for section in draw(st.lists(st.sampled_from(sorted(CONFIG_KEYS)), max_size=2, unique=True)):
        doc[section] = draw(_settings(CONFIG_KEYS[section]))
    if draw(st.booleans()):
        name = draw(st.sampled_from(sorted(DETECTOR_KEYS)))
        doc["detectors"] = {name: draw(_settings(DETECTOR_KEYS[name]))}
    if draw(st.booleans()):
        kind = draw(st.sampled_from(["webhooks", "alertmanagers"]))
        sink = {"name": "x", "url": "http://127.0.0.1:9/", "secret": "s"}
        sink.update(draw(st.dictionaries(st.sampled_from(SINK_KEYS), json_values, max_size=2)))
        notify = doc.get("notify")
        doc["notify"] = {**(notify if isinstance(notify, dict) else {}), kind: [sink]}
    for k in draw(st.lists(st.sampled_from(TOP_SCALARS), max_size=1)):
        doc[k] = draw(json_values)
    return doc


@settings(FUZZ, max_examples=100)  # each example builds and validates a whole Config
@given(text=config_docs().map(yaml.safe_dump) | texts(max_size=60).map(lambda t: "window:\n  " + t))
def test_config_yaml_raises_only_config_error(text: str, tmp_path: Path) -> None:
    """Any setting of any type in any section: loaded, or refused with a ConfigError (rocewatch
    exits 2 with its message), never a TypeError from deep inside."""
    path = tmp_path / "rocewatch.yaml"
    path.write_text(text)
    try:
        load_config(path)
    except ConfigError as e:
        assert str(e).strip()  # the one line rocewatch prints before it exits 2


def test_config_file_bytes_raise_only_config_error(tmp_path: Path) -> None:
    path = tmp_path / "rocewatch.yaml"
    path.write_bytes(b"window: {step_s: 1}\n\xff\xfe\x00garbage")
    with pytest.raises(ConfigError, match=str(path)):
        load_config(path)
