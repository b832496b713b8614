"""Config primitives every part's section uses: building a frozen dataclass from a mapping
(unknown keys and bad values raise ``ConfigError`` naming the key), ``${ENV_VAR}`` expansion,
reading a YAML file, and ``Secret``. Each part owns its section's dataclass; the product config
(rocewatch/config.py) assembles them."""

from __future__ import annotations

import dataclasses
import os
import re
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

from rocewatch.core.errors import ConfigError

T = TypeVar("T")
_ENV = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


class Secret(str):
    """A string that never shows its value in a repr (kafka-python logs its config dicts)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "'***'"


def expand_env(v: Any) -> Any:
    """``${ENV_VAR}`` in every string of a config document replaced by the variable's value."""
    if isinstance(v, str):

        def sub(m: re.Match[str]) -> str:
            if m.group(1) not in os.environ:
                raise ConfigError(f"environment variable {m.group(1)} is not set")
            return os.environ[m.group(1)]

        return _ENV.sub(sub, v)
    if isinstance(v, dict):
        return {k: expand_env(x) for k, x in v.items()}
    if isinstance(v, list):
        return [expand_env(x) for x in v]
    return v


def build(
    cls: type[T], data: Any, where: str, sections: Mapping[str, type[Any]] | None = None
) -> T:
    """A frozen dataclass from a mapping, recursing into nested dataclass fields.

    A nested section's class is found by its annotation's name: among the names of the
    module that defines ``cls`` (a section owns the sections it holds), else in ``sections``
    (what the caller knows: the product config's top-level sections).
    """
    if data is None:
        return cls()
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: must be a mapping")
    fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    kw: dict[str, Any] = {}
    for k, v in data.items():
        if k not in fields:
            raise ConfigError(f"{where}.{k}: unknown setting (known: {', '.join(sorted(fields))})")
        ftype = fields[k].type
        name = ftype if isinstance(ftype, str) else getattr(ftype, "__name__", "")
        sub = _section_type(cls, name, sections)
        items = _ITEMS.fullmatch(ftype) if isinstance(ftype, str) else None
        item = _section_type(cls, items.group(1), sections) if items is not None else None
        if sub is not None:
            kw[k] = build(sub, v, f"{where}.{k}", sections)
        elif item is not None:  # a list of sections
            if not isinstance(v, list):
                raise ConfigError(f"{where}.{k}: must be a list")
            kw[k] = tuple(build(item, x, f"{where}.{k}[{i}]", sections) for i, x in enumerate(v))
        elif isinstance(v, list):
            kw[k] = tuple(tuple(x) if isinstance(x, list) else x for x in v)
        else:
            kw[k] = _scalar(v, ftype, f"{where}.{k}")
    try:
        obj = cls(**kw)
        validate = getattr(obj, "validate", None)
        if callable(validate):
            validate()
    except (TypeError, ValueError, AttributeError, OverflowError) as e:
        # a value of the wrong type (a word where a number goes) fails inside a check
        raise ConfigError(f"{where}: {e}") from e
    return obj


# a field that holds a list of sections: ``tuple[SomeConfig, ...]``
_ITEMS = re.compile(r"tuple\[(\w+), \.\.\.\]")
_SCALAR_TYPES: dict[str, type] = {"int": int, "float": float, "bool": bool, "str": str}


def _scalar(v: Any, ftype: Any, where: str) -> Any:
    """``v`` checked against a plain scalar annotation (``int``, ``float | None``, ``str``...).

    A value of the wrong type would otherwise get in and fail much later, inside a detector or
    a socket call, with a traceback instead of the key's name. A number given as a string (an
    expanded ``${ENV_VAR}``) is converted; a bool is never taken for a number. Annotations that
    are not plain scalars (tuples, mappings, literals) are left to the section's ``validate``.
    """
    parts = [p.strip() for p in str(ftype).split("|")] if isinstance(ftype, str) else []
    kinds = [p for p in parts if p != "None"]
    if not kinds or any(p not in _SCALAR_TYPES for p in kinds):
        return v
    if v is None:
        if "None" in parts:
            return v
        raise ConfigError(f"{where}: must be set (of type {' | '.join(kinds)})")
    for kind in kinds:
        t = _SCALAR_TYPES[kind]
        if t is bool:
            if isinstance(v, bool):
                return v
        elif t is str:
            if isinstance(v, str):
                return v
        elif isinstance(v, bool):
            continue
        elif isinstance(v, int) or (t is float and isinstance(v, float)):
            return t(v)
        elif isinstance(v, str):
            try:
                return t(v.strip())
            except ValueError:
                continue
    raise ConfigError(f"{where}: {v!r} is not of type {' | '.join(kinds)}")


def _section_type(cls: type[Any], name: str, sections: Mapping[str, type[Any]] | None) -> Any:
    """The dataclass a field annotated ``name`` holds, or None (a plain value)."""
    if not name:
        return None
    found = vars(sys.modules[cls.__module__]).get(name)
    if isinstance(found, type) and dataclasses.is_dataclass(found):
        return found
    if sections is not None and name in sections:
        return sections[name]
    return None


def read_yaml(path: str | Path) -> Any:
    """A config file's YAML document ({} when empty); ``ConfigError`` naming the file."""
    import yaml  # here: `rocewatch agent --once` without a file never needs it

    try:
        return yaml.safe_load(Path(path).read_text()) or {}
    except OSError as e:
        raise ConfigError(f"{path}: cannot read config: {e.strerror}") from e
    except UnicodeDecodeError as e:  # a binary file given by mistake
        raise ConfigError(f"{path}: not UTF-8 text (byte {e.start})") from e
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML: {e}") from e
