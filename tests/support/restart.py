"""A restart as the service makes one: each part's ``state()`` through the product's checkpoint
codec (rocewatch/core/checkpoint.py), laid over parts built anew from the configuration
(rocewatch/core/state.py). What the detector tests use for "a checkpoint taken mid-fault"."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from rocewatch.config import Config
from rocewatch.core import checkpoint
from rocewatch.core.checkpoint import StateTypes
from rocewatch.pipeline import Pipeline

KIND = "test-state"
D = TypeVar("D")


def through_codec(data: Any, types: StateTypes = checkpoint.NO_TYPES) -> Any:
    """``data`` written as a checkpoint record with ``types`` and read back with the same."""
    return checkpoint.loads(checkpoint.dumps(data, KIND, types), KIND, types)


def own_types(part: Any) -> StateTypes:
    """The record types a part declares (``STATE_TYPES``): all its state may hold."""
    return StateTypes(type(part).STATE_TYPES)


def restart_part(det: Any, fresh: D) -> D:
    """``det``'s state (a detector's, or any stateful part's) through the codec with only the
    types it declares, restored into ``fresh`` (the same part built anew from today's
    configuration)."""
    fresh.restore(through_codec(det.state(), own_types(det)))  # type: ignore[attr-defined]
    return fresh


def restart_pipeline(
    p: Pipeline,
    config: Config | None = None,
    only: Iterable[str] | None = None,
    detectors: Callable[[Pipeline], list[Any]] | None = None,
) -> Pipeline:
    """``p`` stopped and started again: a pipeline built from ``config`` (``p``'s if none) and
    its topology, with ``p``'s state laid over it. The pipeline's state goes through the codec
    with ``Pipeline.state_types()`` (as the detect stage writes it), and each detector's with
    only the types that detector declares (so a detector that forgets one fails here).
    ``only``: keep only these detectors (as the test built ``p``); ``detectors``: the
    detectors to run instead of the configured ones (scripted ones)."""
    q = Pipeline(
        p.topology,
        config or p.config,
        rollup_s=p.rollups.resolution_s if p.rollups is not None else None,
        retain=p.retain,
        domain=p.domain,
    )
    if only is not None:
        keep = set(only)
        q.detectors = [d for d in q.detectors if d.name in keep]
    if detectors is not None:
        q.detectors = detectors(q)
    data = through_codec(p.state(), Pipeline.state_types())
    data["detectors"] = {d.name: through_codec(d.state(), own_types(d)) for d in p.detectors}
    q.restore(data)
    return q
