"""gNMI paths: the xpath-like strings of config and of gnmic's events, and the Path message.

``parse_xpath("/interfaces/interface[name=Ethernet1]/state")`` gives ``[(name, {key: value})]``;
``to_path`` builds the protobuf ``Path`` of it. ``flatten`` turns a prefix and a path into the
keyless path string the mapping table matches and the gnmic-style ``<elem>_<key>`` tags.
"""

from __future__ import annotations

from typing import Any

from pygnmi.spec.v080 import gnmi_pb2 as pb

from rocewatch.core.errors import ConfigError


def parse_xpath(xpath: str) -> list[tuple[str, dict[str, str]]]:
    """'/a/b[k=v][k2=v2]/c' -> [('a', {}), ('b', {'k': 'v', 'k2': 'v2'}), ('c', {})].

    Key values may contain '/' ('[name=Ethernet1/1]'); a value is read up to its ']'.
    """
    s = xpath.strip()
    if ":" in s.split("/", 2)[1 if s.startswith("/") else 0] and not s.startswith("/"):
        s = s.split(":", 1)[1]  # "origin:/path"
    out: list[tuple[str, dict[str, str]]] = []
    i, n = 0, len(s)
    while i < n:
        if s[i] == "/":
            i += 1
            continue
        j = i
        while j < n and s[j] not in "/[":
            j += 1
        name = s[i:j]
        keys: dict[str, str] = {}
        while j < n and s[j] == "[":
            end = s.find("]", j)
            eq = s.find("=", j)
            if end < 0 or eq < 0 or eq > end:
                raise ConfigError(f"bad gNMI path {xpath!r}: unbalanced key at {j}")
            keys[s[j + 1 : eq].strip()] = s[eq + 1 : end].strip()
            j = end + 1
        if not name:
            raise ConfigError(f"bad gNMI path {xpath!r}: empty element at {i}")
        out.append((name, keys))
        i = j
    return out


def to_path(xpath: str, origin: str = "", target: str = "") -> Any:
    """The ``gnmi.Path`` message for an xpath string (``origin:`` prefix allowed)."""
    s = xpath.strip()
    if not s.startswith("/") and ":" in s.split("/", 1)[0]:
        origin, s = s.split(":", 1)
    p = pb.Path(origin=origin, target=target)
    for name, keys in parse_xpath(s):
        p.elem.add(name=name, key=keys)
    return p


def flatten(
    prefix: Any | None, path: Any, tags: dict[str, str] | None = None
) -> tuple[str, dict[str, str]]:
    """(keyless path string, gnmic-style tags) of ``prefix + path``.

    Handles both PathElem paths and the deprecated string ``element`` form (gNMI < 0.4, still
    sent by openconfig's fake target); element strings may carry keys in brackets.
    """
    names: list[str] = []
    out_tags: dict[str, str] = dict(tags or {})
    for p in (prefix, path):
        if p is None:
            continue
        if len(p.elem):
            for e in p.elem:
                names.append(e.name)
                for k, v in e.key.items():
                    out_tags[f"{e.name}_{k}"] = v
        else:
            for el in p.element:
                for name, keys in parse_xpath(el) if el else []:
                    names.append(name)
                    for k, v in keys.items():
                        out_tags[f"{name}_{k}"] = v
    return "/" + "/".join(names), out_tags
