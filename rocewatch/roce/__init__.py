"""RoCE configuration: the normalised per-end model, the checks (``netq check roce`` on both ends
of every cable) and ``rocewatch check roce`` (docs/roce_config.md)."""
