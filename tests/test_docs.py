"""The documentation keeps up with the code.

Every configuration key the loader accepts is named in docs/configuration.md: the keys come
from walking the config dataclasses as the loader does (scripts/gen_config_docs.py), and from
the loader itself, which lists the keys it knows when it meets an unknown one. So a field added
to any config dataclass without a line in the reference fails here.
"""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from collector.gnmi.config import gnmi_config
from rocewatch.config import config_from_dict
from rocewatch.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]
PROBE = "zz_probe"
# list items the loader checks for before it reads their keys
REQUIRED = {"gnmi.targets[]": {"name": "leaf-0", "address": "10.0.0.1:9339"}}


def _script(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod  # dataclasses look their module up while the class is built
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def gen() -> ModuleType:
    return _script("gen_config_docs")


def _load(doc: dict[str, Any]) -> None:
    """What the processes do with a config document: the loader, and the collector's gnmi."""
    gnmi_config(config_from_dict(doc).gnmi)


def _probe_doc(path: str) -> dict[str, Any]:
    """A config document with an unknown key in the mapping at ``path``."""
    node: Any = {PROBE: 1}
    parts = path.split(".") if path else []
    for i in range(len(parts) - 1, -1, -1):
        part = parts[i]
        if part.endswith("[]"):
            item = dict(REQUIRED.get(".".join(parts[: i + 1]), {}))
            item.update(node)
            node = {part[:-2]: [item]}
        else:
            node = {part: node}
    return node  # type: ignore[no-any-return]


def _known_by_loader(path: str) -> set[str] | None:
    """The keys the loader says it knows in the mapping at ``path`` (None: it does not say)."""
    with pytest.raises(ConfigError) as err:
        _load(_probe_doc(path))
    msg = str(err.value)
    assert PROBE in msg, f"{path or 'top level'}: the loader failed for another reason: {msg}"
    m = re.search(r"unknown (?:setting|detector) \(known: ([^)]*)\)", msg)
    return None if m is None else {k.strip() for k in m.group(1).split(",")}


def _mappings(gen: ModuleType) -> list[str]:
    """Every mapping of the config file the walk found (``x[]``: the items of list ``x``)."""
    paths = {"", "detectors"}
    for s in gen.sections():
        paths.add(s.path)
        for k in s.keys:
            if k.type.startswith("mapping"):
                paths.add(k.path)
            elif k.type == "list of mappings":
                paths.add(k.path + "[]")
    return sorted(paths)


def _missing(gen: ModuleType, doc: str) -> list[str]:
    """Keys the loader accepts that ``doc`` does not name (as `key`)."""
    walked = set(gen.reference_keys())
    missing = [k for k in walked if f"`{k}`" not in doc]
    seen_by_loader = 0
    for path in _mappings(gen):
        known = _known_by_loader(path)
        if known is None:  # storage, executors.slurm: the walk lists their keys by hand
            continue
        for key in known:
            full = f"{path}.{key}" if path else key
            seen_by_loader += 1
            if f"`{full}`" not in doc:
                missing.append(full)
            # a key the loader knows that the walk missed would be missed by the reference
            assert full in walked, (
                f"{full}: the loader accepts it, gen_config_docs does not walk it"
            )
    assert seen_by_loader > 200, "the loader's lists of known keys were not read"
    return sorted(set(missing))


def test_every_config_key_the_loader_accepts_is_in_the_reference(gen: ModuleType) -> None:
    missing = _missing(gen, (ROOT / "docs" / "configuration.md").read_text())
    assert not missing, (
        "keys the loader accepts but docs/configuration.md does not name "
        f"(run python scripts/gen_config_docs.py --write): {missing}"
    )


def test_a_key_left_out_of_the_reference_is_reported(gen: ModuleType) -> None:
    text = (ROOT / "docs" / "configuration.md").read_text()
    cut = "\n".join(
        line
        for line in text.splitlines()
        if "`detectors.pfc_storm.detection_time_s`" not in line
        and "`kafka.topics.steps`" not in line
    )
    assert _missing(gen, cut) == ["detectors.pfc_storm.detection_time_s", "kafka.topics.steps"]


def test_the_reference_names_only_keys_the_loader_accepts(gen: ModuleType) -> None:
    """The other direction, for the keys of each mapping the loader lists."""
    walked = set(gen.reference_keys())
    listed: set[str] = set()
    unlisted_sections: list[str] = []
    for path in _mappings(gen):
        known = _known_by_loader(path)
        if known is None:
            unlisted_sections.append(path)
            continue
        listed |= {f"{path}.{k}" if path else k for k in known}
    stray = sorted(
        k
        for k in walked
        if k not in listed
        and not any(k.startswith(p + ".") for p in unlisted_sections)
        and k not in unlisted_sections
        and k.rpartition(".")[0] in _mappings(gen)
    )
    # top-level sections the loader takes out of the document before it lists the rest
    assert set(stray) <= {"storage", "actions"}, stray
    assert sorted(unlisted_sections) == ["executors.slurm", "storage"]


def test_hand_read_sections_accept_the_documented_keys_and_refuse_others() -> None:
    """storage and executors.slurm are read by hand and list no keys in their errors."""
    _load({"storage": {"url": "sqlite:///x.db", "retention_days": 7}})
    _load({"executors": {"slurm": {"backend": "scontrol", "scontrol": {}, "slurmrestd": None}}})
    for doc in (_probe_doc("storage"), _probe_doc("executors.slurm")):
        with pytest.raises(ConfigError, match=PROBE):
            _load(doc)
