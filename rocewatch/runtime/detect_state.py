"""A detect stage's state record: what a domain's stage holds between steps (its pipeline's
state, the partial steps, offsets), written to the state topic and laid over a pipeline built
from today's configuration on a takeover."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np
import polars as pl

from rocewatch.core import checkpoint
from rocewatch.core.checkpoint import CheckpointError
from rocewatch.core.keys import KEYS
from rocewatch.pipeline import Pipeline
from rocewatch.runtime.aggregate import STATE_VERSION

DETECT_STATE_KIND = "detect-state"  # a detect stage's


def load_detect_state(raw: bytes, pipeline: Pipeline) -> DetectState:
    """A detect stage's state record read back, its pipeline's state laid over ``pipeline``
    (built from today's configuration and topology), as ``load_agg_state``."""
    return DetectState.restore(
        checkpoint.loads(raw, DETECT_STATE_KIND, Pipeline.state_types()), pipeline
    )


@dataclass
class DetectState:
    version: int
    pipeline: Pipeline
    part_closed: dict[int, int]  # newest closed time reported per telemetry partition
    part_idle: dict[int, bool]
    buffer: dict[int, dict[int, pl.DataFrame]]  # step index -> telemetry partition -> rows
    closed_ns: int | None  # every step ending at or before this has been evaluated
    offset: int  # next steps-topic offset
    out_ends: dict[tuple[str, int], int]  # end offsets of the output topics at checkpoint time
    # next offset per partition of the configuration topic (rocewatch/runtime/config_feed.py);
    # the records read before it are in the pipeline's state (a state from before: none read)
    config_offsets: dict[int, int] = field(default_factory=dict)

    def state(self) -> dict[str, Any]:
        """What its state record holds (``restore`` takes it back)."""
        # the partial steps travel as one frame: many small frames cost more in headers
        d = {f.name: getattr(self, f.name) for f in fields(self)}
        d["pipeline"] = self.pipeline.state()  # its parts' state, never the parts
        # (coded keys, which mean something only in this process, as their strings: decoded
        # once for the whole buffer, not per frame, which cost a gather per key column and
        # frame: hundreds of frames while the stage is behind)
        held = [pf for _, slot in sorted(self.buffer.items()) for pf in sorted(slot.items())]
        if not held:
            d["buffer"] = None
            return d
        part = np.repeat(np.array([p for p, _ in held]), [f.height for _, f in held])
        flat = KEYS.decode(KEYS.concat([f for _, f in held]))
        d["buffer"] = flat.with_columns(pl.Series("part", part, dtype=pl.Int32))
        return d

    def record_data(self) -> tuple[dict[str, Any], str, checkpoint.StateTypes]:
        """What its state record holds, the record's kind and the record types in it
        (``load_detect_state``)."""
        return self.state(), DETECT_STATE_KIND, Pipeline.state_types()

    @classmethod
    def restore(cls, d: Any, pipeline: Pipeline) -> DetectState:
        """The state ``state()`` gave, its pipeline's laid over ``pipeline`` (built from
        today's configuration); ``CheckpointError`` if it is not one of this version or does
        not fit that pipeline."""
        if not isinstance(d, dict) or d.get("version") != STATE_VERSION:
            v = d.get("version") if isinstance(d, dict) else None
            raise CheckpointError(f"detect state version {v!r}, reads {STATE_VERSION}")
        flat = d.get("buffer")
        buffer: dict[int, dict[int, pl.DataFrame]] = {}
        try:
            if flat is not None and flat.height:
                for (idx, p), f in flat.partition_by(
                    ["step", "part"], as_dict=True, maintain_order=True
                ).items():
                    buffer.setdefault(int(idx), {})[int(p)] = f.drop("part")  # type: ignore[call-overload]
            pipeline.restore(d["pipeline"])
            st = cls(**{**d, "buffer": buffer, "pipeline": pipeline})
        except (AttributeError, KeyError, TypeError, ValueError, pl.exceptions.PolarsError) as e:
            raise CheckpointError(f"not a detect stage's state: {e}") from e
        if not (
            isinstance(st.offset, int)
            and all(
                isinstance(x, dict)
                for x in (st.part_closed, st.part_idle, st.out_ends, st.config_offsets)
            )
        ):
            raise CheckpointError("a detect stage's state of the wrong shape")
        return st
