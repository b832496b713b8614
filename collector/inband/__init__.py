"""In-band network telemetry: INT Telemetry Report v2.0 datagrams (docs/formats.md section 4).

``report`` decodes UDP payloads into report rows (vectorised over a batch), ``sequence`` counts
reports lost from the group headers' sequence numbers, ``pcap`` reads and writes classic libpcap
files, ``udp`` receives live datagrams into a fixed receive ring, and ``aggregate`` turns report
rows into canonical samples per interval and queue. The layout: ``docs/formats/int.md``.
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
    INNER_SCHEMA,
    REPORT_SCHEMA,
    InbandStats,
    IndividualReport,
    ReportMetadata,
    build_report,
    parse_buffer,
    parse_datagrams,
)
from collector.inband.sequence import SequenceTracker

__all__ = [
    "DEFAULT_PORT",
    "INNER_SCHEMA",
    "REPORT_SCHEMA",
    "InbandStats",
    "IndividualReport",
    "PayloadChunk",
    "PcapStats",
    "ReportMetadata",
    "SequenceTracker",
    "build_report",
    "iter_pcap_chunks",
    "iter_pcap_payloads",
    "parse_buffer",
    "parse_datagrams",
    "write_pcap",
]
