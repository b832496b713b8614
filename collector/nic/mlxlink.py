"""Bit-error rates from NVIDIA's ``mlxlink`` (MFT), when that tool is installed.

``mlxlink -d <rdma device> -c`` prints "Physical Counters and BER Info" as ``Key : value``
lines; the BERs come as ``3E-12`` and the counters as integers. Running it costs tens of ms,
so the agent calls it at its own, slower cadence.
"""

from __future__ import annotations

import re
import shutil
import subprocess

# printed label -> snapshot key
FIELDS = {
    "Raw Physical BER": "raw_physical_ber",
    "Effective Physical BER": "effective_physical_ber",
    "Effective Physical Errors": "effective_physical_errors",
    "Symbol BER": "symbol_ber",
    "Symbol Errors": "symbol_errors",
    "Time Since Last Clear [Min]": "time_since_last_clear_min",
}
_LINE = re.compile(r"^\s*(?P<key>[^:]+?)\s*:\s*(?P<value>\S+)\s*$")


def parse_mlxlink(text: str) -> dict[str, float | int]:
    """The BER section of ``mlxlink -c`` output -> {key: number}; other lines are ignored."""
    out: dict[str, float | int] = {}
    for line in text.splitlines():
        m = _LINE.match(line)
        if not m or m.group("key") not in FIELDS:
            continue
        raw = m.group("value")
        try:
            num: float | int = int(raw) if raw.isdigit() else float(raw)
        except ValueError:
            continue
        out[FIELDS[m.group("key")]] = num
    return out


def mlxlink_path() -> str | None:
    return shutil.which("mlxlink")


def read_mlxlink(tool: str, nic: str, timeout: float = 10.0) -> dict[str, float | int]:
    res = subprocess.run(
        [tool, "-d", nic, "-c"], capture_output=True, text=True, timeout=timeout, check=False
    )
    return parse_mlxlink(res.stdout)
