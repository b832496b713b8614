"""State as data: what a stateful part keeps across a restart, apart from what it is built from.

A part (a detector, the alert lifecycle, the window engine) is built at every start from the
current configuration file and topology; ``state()`` gives what it learned and holds since
(episodes, baselines, open alerts), and ``restore(data)`` lays that over a part built anew. So a
changed threshold applies at once, and a checkpoint never carries configuration.

``Stateful`` gives that pair to a part whose attributes are its state, but for those it is
built from (``topology``, ``config``, ``name``) and those it derives from them (``NOT_STATE``).
Small helper objects that take configuration values (a ``Sustain`` with its ``sustain_s``)
name them in ``PARAMS``: a restored helper keeps its episodes and takes the values of the
helper built from today's configuration.

>>> class Counter(Stateful):
...     def __init__(self, limit: int) -> None:
...         self.config, self.limit_ns, self.seen = limit, limit * 10, 0
...     NOT_STATE = frozenset({"limit_ns"})
>>> a = Counter(1); a.seen = 5
>>> b = Counter(2); b.restore(a.state())
>>> b.seen, b.limit_ns
(5, 20)
"""

from __future__ import annotations

from typing import Any, ClassVar


class StateMismatch(ValueError):
    """A part's state that cannot be laid over the part built from today's configuration (the
    step length changed, say): the caller counts it and starts that part afresh."""


# what a part is built from, never its state
BUILT_FROM = frozenset({"topology", "config", "name", "stats"})


class Stateful:
    """``state()`` / ``restore()`` for a part whose attributes are its state (module doc)."""

    # record classes its state may hold besides plain data (an episode, an alert): the
    # checkpoint codec writes and reads only the types the parts declare
    STATE_TYPES: ClassVar[tuple[type, ...]] = ()
    # attributes derived from configuration or topology when built: rebuilt, never restored
    NOT_STATE: ClassVar[frozenset[str]] = frozenset()

    def state(self) -> dict[str, Any]:
        """What it holds now, as data (plain values, frames, arrays, declared records)."""
        skip = BUILT_FROM | self.NOT_STATE
        return {k: v for k, v in vars(self).items() if k not in skip and not k.startswith("__")}

    def restore(self, data: dict[str, Any]) -> None:
        """Lay ``state()`` of an earlier run over this part, built from today's configuration.
        Keys this build does not keep are ignored; what the data lacks keeps its new value."""
        skip = BUILT_FROM | self.NOT_STATE
        mine = vars(self)
        for k, v in data.items():
            if k in skip or k not in mine:
                continue
            carry_params(v, mine[k])
            mine[k] = v
        self.restored()

    def restored(self) -> None:
        """Called once the state is laid over: a part fixes up what depends on both."""


def carry_params(old: Any, fresh: Any, depth: int = 0) -> None:
    """Give ``old`` (a restored helper) the configuration values (``PARAMS``) of ``fresh`` (the
    same helper built from today's configuration), in helpers held by attribute or in dicts."""
    if depth > 3 or type(old) is not type(fresh):
        return
    if isinstance(old, dict):
        for k in old.keys() & fresh.keys():
            carry_params(old[k], fresh[k], depth + 1)
        return
    params = getattr(type(old), "PARAMS", ())
    for p in params:
        object.__setattr__(old, p, getattr(fresh, p))
    d = getattr(old, "__dict__", None)
    if d is None:
        return
    for k, v in d.items():
        if k in params:
            continue
        if isinstance(v, dict) or getattr(type(v), "PARAMS", None) is not None:
            f = getattr(fresh, k, None)
            if f is not None:
                carry_params(v, f, depth + 1)
