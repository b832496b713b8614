"""Collectors: turn what devices speak into columnar sample batches (rocewatch.core.model)."""
