"""A grouped alert's ``members`` annotation: the label sets of the entities one alert stands
for (a storm's victims, a switch's origin ports), and an alert seen as one label set per member.

Grouping writes it, inhibition and the detectors that read the alerts firing read it.

>>> text = encode_members([{"switch": "leaf-1", "port": "Ethernet2"}])
>>> views({"alertname": "PFCStorm", "switch": "leaf-1"}, {"members": text})
[{'alertname': 'PFCStorm', 'switch': 'leaf-1', 'port': 'Ethernet2'}]
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping

import orjson

MEMBERS = "members"
# labels that name one entity (and what the topology says of it): a grouped alert's view of
# one member takes these from the member, the rest from the alert
ENTITY_KEYS = frozenset({"switch", "port", "node", "nic", "queue", "rail", "job", "tenant"})


def encode_members(sets: Iterable[Mapping[str, str]]) -> str:
    """Entity label sets as the ``members`` annotation (compact JSON, in a stable order)."""
    rows = sorted({tuple(sorted(s.items())) for s in sets})
    return orjson.dumps([dict(r) for r in rows]).decode()


@functools.lru_cache(maxsize=4096)
def parse_members(text: str) -> tuple[tuple[tuple[str, str], ...], ...]:
    """The label sets of a ``members`` annotation; what is not a list of string mappings is
    left out (an annotation a receiver or an older version wrote is no reason to fail)."""
    try:
        data = orjson.loads(text)
    except orjson.JSONDecodeError:
        return ()
    if not isinstance(data, list):
        return ()
    out = []
    for m in data:
        if (
            isinstance(m, dict)
            and m
            and all(isinstance(k, str) and isinstance(v, str) for k, v in m.items())
        ):
            out.append(tuple(sorted(m.items())))
    return tuple(out)


def views(labels: Mapping[str, str], annotations: Mapping[str, str]) -> list[Mapping[str, str]]:
    """An alert as one label set per member (its own labels when it has no members)."""
    text = annotations.get(MEMBERS)
    if not text:
        return [labels]
    return list(_views(tuple(sorted(labels.items())), text)) or [labels]


@functools.lru_cache(maxsize=1024)
def _views(labels: tuple[tuple[str, str], ...], text: str) -> tuple[Mapping[str, str], ...]:
    base = {k: v for k, v in labels if k not in ENTITY_KEYS}
    return tuple({**base, **dict(m)} for m in parse_members(text))
