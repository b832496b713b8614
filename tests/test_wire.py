import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest

from rocewatch import wire
from rocewatch.core.errors import BadInput
from rocewatch.core.model import conform

ROOT = Path(__file__).resolve().parents[1]


def sample_frame(n: int = 1000) -> pl.DataFrame:
    return conform(
        pl.DataFrame(
            {
                "ts": list(range(n)),
                "device": [f"leaf-{i % 3}" for i in range(n)],
                "port": [f"Ethernet1/{i % 7}" for i in range(n)],
                "qual": ["3" if i % 2 else "" for i in range(n)],
                "metric": ["pfc_rx_pause_us" if i % 2 else "queue_depth_bytes" for i in range(n)],
                "value": [float(i) for i in range(n)],
                "raw": [2**64 - 1 - i if i % 2 else None for i in range(n)],
            }
        )
    )


def test_round_trip_many_messages_exactly():
    a, b = sample_frame(1000), sample_frame(10).with_columns(pl.lit("spine-9").alias("device"))
    out = wire.frames([wire.parse(wire.encode(a)), wire.parse(wire.encode(b))])
    assert out.equals(pl.concat([a, b]))
    assert out["raw"][1] == 2**64 - 2  # exact 64-bit counters


def test_compact():
    import lz4.frame

    df = sample_frame(5000)
    raw = wire.encode(df)
    assert len(raw) <= 42 * df.height  # fixed-width columns, strings once per message
    # what Kafka's lz4 batch compression leaves of it: a gnmic JSON event is ~250 bytes a value
    assert len(lz4.frame.compress(raw)) < 16 * df.height


@pytest.mark.parametrize("data", [b"\xff\xff\xff garbage", b"", wire.encode(sample_frame(10))[:-7]])
def test_garbage_is_bad_input(data):
    with pytest.raises(BadInput):
        wire.parse(data)


def test_newer_schema_is_rejected():
    from rocewatch.wire.telemetry_pb2 import TelemetryBatch

    msg = TelemetryBatch()
    msg.ParseFromString(wire.encode(sample_frame(3)))
    msg.schema_version = 99
    with pytest.raises(BadInput, match="schema_version"):
        wire.parse(msg.SerializeToString())


def test_generated_code_matches_proto(tmp_path: Path):
    subprocess.run(
        [
            sys.executable,
            "-m",
            "grpc_tools.protoc",
            f"-I{ROOT / 'proto'}",
            f"--python_out={tmp_path}",
            str(ROOT / "proto/rocewatch/v1/telemetry.proto"),
        ],
        check=True,
        timeout=60,
    )
    fresh = (tmp_path / "rocewatch/v1/telemetry_pb2.py").read_text()
    committed = (ROOT / "rocewatch/wire/telemetry_pb2.py").read_text()

    def body(s: str) -> str:  # the serialized descriptor is what matters, not the header
        return "\n".join(x for x in s.splitlines() if "AddSerializedFile" in x)

    assert body(fresh) == body(committed), "run scripts/gen_proto.sh and commit the result"


def test_encode_rows_gives_each_group_its_own_exact_message():
    import numpy as np

    df = sample_frame(1000)
    groups = [np.flatnonzero((df["device"] == d).to_numpy()) for d in ("leaf-2", "leaf-0")]
    groups.append(np.array([5, 1, 998], dtype=np.int64))  # any rows, in the order given
    msgs = list(wire.encode_rows(df, groups, source="t", seq0=40))
    assert len(msgs) == 3
    for rows, data in zip(groups, msgs, strict=True):
        d = wire.parse(data)
        assert d.rows == len(rows) and d.source == "t"
        # only the strings its rows use travel with each message
        assert set(d.dict) == set(
            df[rows].select(["device", "port", "qual", "metric"]).unpivot()["value"]
        )
        assert wire.frames([d]).equals(df[rows])
    assert [wire.parse(m).seq for m in msgs] == [41, 42, 43]
    assert list(wire.encode_rows(df, [])) == []


def test_coded_frames_carry_the_same_samples_and_series_ids():
    """The Kafka readers' path: the key as codes into the process's key table, and each row's
    series id; decoding the codes gives exactly ``frames``, and the ids are the strings' ids."""
    from detectors.rates import series_ids
    from rocewatch.core.keys import KEYS, is_coded

    a, b = sample_frame(1000), sample_frame(10).with_columns(pl.lit("spine-9").alias("device"))
    batches = [wire.parse(wire.encode(a)), wire.parse(wire.encode(b))]
    coded = wire.coded_frames(batches)
    strings = wire.frames(batches)
    assert is_coded(coded) and not is_coded(strings)
    assert coded["device"].dtype == pl.UInt32
    assert (coded["sid"].to_numpy() == series_ids(strings)).all()
    assert series_ids(coded).tolist() == coded["sid"].to_list()  # the column is the id
    assert KEYS.decode(coded).equals(strings)
    assert coded["raw"].null_count() == strings["raw"].null_count() == 505  # gauges stay null
    assert wire.coded_frames([]).height == 0
    with pytest.raises(ValueError, match="past the table"):
        KEYS.column("device", pl.Series([len(KEYS) + 5], dtype=pl.UInt32))


def test_a_full_key_table_reads_new_names_as_strings(monkeypatch):
    """Telemetry naming ever new devices cannot grow the process's key table without end:
    once full, a message with new strings is read as strings (the same samples), known ones
    stay coded, and the table does not grow."""
    from rocewatch.core.keys import KEYS, is_coded

    known = sample_frame(100)
    wire.coded_frames([wire.parse(wire.encode(known))])  # its strings are in the table
    monkeypatch.setattr(KEYS, "limit", len(KEYS) + 2)
    size, refused = len(KEYS), KEYS.refused
    flood = sample_frame(30).with_columns(
        pl.format("bogus-{}", pl.int_range(pl.len())).alias("device")
    )
    batches = [wire.parse(wire.encode(known)), wire.parse(wire.encode(flood))]
    got = wire.coded_frames(batches)
    assert not is_coded(got)  # the two meet as strings
    assert got.equals(wire.frames(batches))
    assert len(KEYS) == size and KEYS.refused == refused + 1
    assert is_coded(wire.coded_frames(batches[:1]))  # what the table knows stays coded


def test_a_frame_gives_the_same_dictionary_whatever_its_row_order():
    """Senders sort each message's dictionary: a reader looks a repeated one up once."""
    df = sample_frame(200)
    shuffled = df.sample(fraction=1.0, shuffle=True, seed=3)
    d1, d2 = wire.parse(wire.encode(df)), wire.parse(wire.encode(shuffled))
    assert d1.dict == d2.dict == sorted(d1.dict)
    import numpy as np

    rows = np.arange(200)
    m1 = wire.parse(next(wire.encode_rows(df, [rows])))
    m2 = wire.parse(next(wire.encode_rows(shuffled, [rows])))
    assert m1.dict == m2.dict == sorted(m1.dict)
