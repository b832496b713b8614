"""The state topic's MAC key the tests' detectors sign with (``kafka.state_signing``).

``rocewatch detect`` refuses to start without one, so every test that runs it names this key:
in-process configs through ``signed`` (or ``SIGNING``), the YAML of a ``rocewatch detect``
subprocess through ``SIGNING_YAML``. The key file is a fixture, for tests only.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from rocewatch.config import KafkaConfig, StateKeyConfig, StateSigningConfig

KEY_FILE = Path(__file__).resolve().parents[1] / "fixtures" / "state_key_tests.txt"
KEY_ID = "tests"
SIGNING = StateSigningConfig(key=StateKeyConfig(id=KEY_ID, file=str(KEY_FILE)))
SIGNING_YAML: dict[str, Any] = {"key": {"id": KEY_ID, "file": str(KEY_FILE)}}


def signed(k: KafkaConfig) -> KafkaConfig:
    """``k`` with the tests' state key."""
    return dataclasses.replace(k, state_signing=SIGNING)
