"""In-band network telemetry: INT Telemetry Report v2.0 datagrams (CONTRACTS.md section 4).

First version: decoding of UDP payloads into report rows (``report``) and classic libpcap
files (``pcap``). No UDP listener, no conversion into canonical samples, no pipeline wiring yet.
"""

from collector.inband.pcap import PcapStats, iter_pcap_payloads, write_pcap
from collector.inband.report import (
    DEFAULT_PORT,
    REPORT_SCHEMA,
    InbandStats,
    ReportMetadata,
    build_report,
    parse_datagrams,
)

__all__ = [
    "DEFAULT_PORT",
    "REPORT_SCHEMA",
    "InbandStats",
    "PcapStats",
    "ReportMetadata",
    "build_report",
    "iter_pcap_payloads",
    "parse_datagrams",
    "write_pcap",
]
