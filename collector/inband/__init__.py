"""In-band network telemetry: INT Telemetry Report v2.0 datagrams (CONTRACTS.md section 4).

``report`` decodes UDP payloads into report rows (vectorised over a batch), ``pcap`` reads and
writes classic libpcap files, ``udp`` receives live datagrams into a fixed receive ring, and
``aggregate`` turns report rows into canonical samples per interval and queue.
"""

from collector.inband.pcap import (
    PayloadChunk,
    PcapStats,
    iter_pcap_chunks,
    iter_pcap_payloads,
    write_pcap,
)
from collector.inband.report import (
    DEFAULT_PORT,
    REPORT_SCHEMA,
    InbandStats,
    ReportMetadata,
    build_report,
    parse_buffer,
    parse_datagrams,
)

__all__ = [
    "DEFAULT_PORT",
    "REPORT_SCHEMA",
    "InbandStats",
    "PayloadChunk",
    "PcapStats",
    "ReportMetadata",
    "build_report",
    "iter_pcap_chunks",
    "iter_pcap_payloads",
    "parse_buffer",
    "parse_datagrams",
    "write_pcap",
]
