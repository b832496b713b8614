"""NCCL job telemetry: Inspector NDJSON and textfiles, CoMMA, RAS, NCCL_DEBUG and the join.

One module per input (``inspector``, ``prometheus``, ``comma``, ``ras``, ``debug``), the
directory follower (``tail``), the rank -> host/GPU/NIC map (``join``) and a recorded job
directory read as one source (``recording``). Everything yields sample frames of
``rocewatch.core.model``; nothing here knows of detectors (docs/nccl.md).
"""
