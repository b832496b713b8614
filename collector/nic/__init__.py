"""The node agent for GPU nodes: NIC counters (ethtool, RDMA hw_counters, PCIe) -> snapshots
(docs/formats.md section 3) -> Kafka, spooled to disk while the broker is away.

Nothing is imported here: the config loader reads ``collector.nic.config`` alone.
"""
