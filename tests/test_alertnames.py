"""Alert names are a contract (CONTRACTS.md section 6): code that means one alert uses its
constant in rocewatch.core.model, and every constant is in the contract's list."""

from __future__ import annotations

import re

from detectors.registry import DETECTORS
from rocewatch.core import model


def test_every_alert_name_constant_is_in_the_contract_list() -> None:
    declared = {
        k: v
        for k, v in vars(model).items()
        if re.fullmatch(r"[A-Z][A-Z_]+", k) and isinstance(v, str) and re.fullmatch(r"[A-Z]\w+", v)
    }
    assert len(declared) >= 11, declared
    assert set(declared.values()) <= set(model.ALERTNAMES), declared
    assert model.PFC_STORM == "PFCStorm" and model.FABRIC_INCIDENT == "FabricIncident"


def test_every_detector_raises_a_contract_alert_name() -> None:
    assert {e.alertname for e in DETECTORS.values()} <= set(model.ALERTNAMES)
