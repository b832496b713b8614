"""collector.output: the one output protocol of the collectors (a file, stdout, Kafka)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import orjson
import polars as pl
import pytest

from collector.inband.live import sample_lines
from collector.output import LinesOutput, json_lines
from rocewatch.core.errors import ConfigError


def test_a_file_output_appends_each_batch_as_it_comes_and_close_keeps_everything(
    tmp_path: Path,
) -> None:
    path = tmp_path / "out.jsonl"
    path.write_bytes(b'{"before":1}\n')
    out = LinesOutput(path, json_lines)
    out([{"a": 1}, {"a": 2}])
    # flushed per batch: a reader tailing the file sees it before close
    assert path.read_bytes().count(b"\n") == 3
    out([])
    out([{"a": 3}])
    out.close()
    rows = [orjson.loads(line) for line in path.read_bytes().splitlines()]
    assert rows == [{"before": 1}, {"a": 1}, {"a": 2}, {"a": 3}]


def test_dash_is_stdout_and_close_leaves_stdout_open() -> None:
    code = (
        "import sys\n"
        "from collector.output import LinesOutput, joined\n"
        "o = LinesOutput('-', joined)\n"
        "o([b'one\\n', b'two\\n'])\n"
        "o.close()\n"
        "sys.stdout.write('still open\\n')\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert res.stdout == b"one\ntwo\nstill open\n"


def test_an_output_that_cannot_be_opened_is_a_config_error_naming_it(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"--out .*nowhere"):
        LinesOutput(tmp_path / "nowhere" / "out.jsonl", json_lines)


def test_int_samples_as_lines_keep_the_sample_columns() -> None:
    df = pl.DataFrame(
        {
            "ts": [1, 2],
            "device": ["leaf-0", "leaf-0"],
            "port": ["Ethernet0", "Ethernet4"],
            "qual": ["3", "3"],
            "metric": ["queue_depth_bytes", "queue_depth_bytes"],
            "value": [10.0, 20.0],
            "raw": [None, None],
        }
    )
    rows = [orjson.loads(line) for line in sample_lines(df).splitlines()]
    assert rows[1] == {
        "ts": 2,
        "device": "leaf-0",
        "port": "Ethernet4",
        "qual": "3",
        "metric": "queue_depth_bytes",
        "value": 20.0,
    }
