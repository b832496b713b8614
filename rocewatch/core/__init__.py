"""The bottom layer: what every part of rocewatch shares and nothing of rocewatch's own is
imported by (state as data, ...). See docs/architecture.md for the layers."""
