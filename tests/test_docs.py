"""The documentation keeps up with the code.

Every configuration key the loader accepts is named in docs/configuration.md: the keys come
from walking the config dataclasses as the loader does (scripts/gen_config_docs.py), and from
the loader itself, which lists the keys it knows when it meets an unknown one. So a field added
to any config dataclass without a line in the reference fails here.
"""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from collector.gnmi.config import gnmi_config
from rocewatch.config import config_from_dict
from rocewatch.core.errors import ConfigError

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
    """The keys the loader says it knows in the mapping at ``path`` (None: it does not say),
    less those it refuses when given (a field read from other keys, e.g. ``inhibit``)."""
    with pytest.raises(ConfigError) as err:
        _load(_probe_doc(path))
    msg = str(err.value)
    assert PROBE in msg, f"{path or 'top level'}: the loader failed for another reason: {msg}"
    m = re.search(r"unknown (?:setting|detector) \(known: ([^)]*)\)", msg)
    if m is None:
        return None
    known = {k.strip() for k in m.group(1).split(",")}
    return {k for k in known if not _refused(path, k)}


def _refused(path: str, key: str) -> bool:
    doc = _probe_doc(path)
    node: Any = doc
    for part in path.split(".") if path else []:
        node = node[part[:-2]][0] if part.endswith("[]") else node[part]
    del node[PROBE]
    node[key] = None
    try:
        _load(doc)
    except ConfigError as e:
        return f"{path + '.' if path else ''}{key}: unknown setting".replace("[]", "[0]") in str(e)
    except Exception:  # a None the key's own validation chokes on: the key itself is accepted
        return False
    return False


def _mappings(gen: ModuleType) -> list[str]:
    """Every mapping of the config file the walk found (``x[]``: the items of list ``x``)."""
    paths = {"", "detectors"}
    for s in gen.sections():
        if not any(k.path == s.path for k in s.keys):  # a mapping, not a list key
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
    newly = set(_missing(gen, cut)) - set(_missing(gen, text))
    assert newly == {"detectors.pfc_storm.detection_time_s", "kafka.topics.steps"}


def test_the_reference_names_only_keys_the_loader_accepts(gen: ModuleType) -> None:
    """The other direction: a documented key the loader does not list (a section it reads by
    hand) must at least not be refused as unknown."""
    mappings = _mappings(gen)
    listed: dict[str, set[str]] = {}
    for path in mappings:
        known = _known_by_loader(path)
        if known is not None:
            listed[path] = known
    checked = 0
    for key in gen.reference_keys():
        parent, _, leaf = key.rpartition(".")
        if parent not in listed or leaf in listed[parent]:
            continue
        checked += 1
        assert not _refused(parent, leaf), f"{key}: documented, but the loader refuses it"
    assert checked >= 2  # storage and actions at least: read by hand at the top level


def test_hand_read_sections_accept_the_documented_keys_and_refuse_others() -> None:
    """storage and executors.slurm are read by hand and list no keys in their errors."""
    _load({"storage": {"url": "sqlite:///x.db", "retention_days": 7}})
    _load({"executors": {"slurm": {"backend": "scontrol", "scontrol": {}, "slurmrestd": None}}})
    for doc in (_probe_doc("storage"), _probe_doc("executors.slurm")):
        with pytest.raises(ConfigError, match=PROBE):
            _load(doc)


# --- benchmark figures: data in benchmarks/results, one generated table -----------------------


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    return _script("bench_table")


def test_every_benchmark_result_says_when_where_how_and_what(bench: ModuleType) -> None:
    files = sorted((ROOT / "benchmarks" / "results").glob("*.json"))
    assert files
    problems: list[str] = []
    results = {r.name: r for r in bench.load(warn=problems.append)}
    assert not problems
    for path in files:
        r = results[path.stem]
        assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", r.date), f"{path.name}: date {r.date!r}"
        assert r.commit != "?" and r.machine and r.command, f"{path.name}: commit/machine/command"
        assert r.figures, f"{path.name}: no figures"


def test_the_table_takes_every_result_file_and_skips_a_broken_one(
    bench: ModuleType, tmp_path: Path
) -> None:
    (tmp_path / "scaleout.json").write_text(
        json.dumps(
            {
                "benchmark": "scaleout",
                "command": "python benchmarks/scaleout.py --json",
                "date": "2027-01-02",
                "commit": "abc1234",
                "machine": "8 cores",
                "conditions": {"gpus": 1024},
                "figures": {"efficiency": 0.93, "latency_p99_s": 0.81},
            }
        )
    )
    # a result written without a figures mapping: its top-level numbers are the figures
    (tmp_path / "inband.json").write_text(
        json.dumps(
            {
                "command": "python benchmarks/inband.py --json",
                "date": "2027-01-03",
                "commit": "def5678",
                "machine": "2 cores",
                "pcap_reports_per_s": 1234567,
            }
        )
    )
    (tmp_path / "broken.json").write_text("{not json")
    warnings: list[str] = []
    results = bench.load(tmp_path, warn=warnings.append)
    assert [r.name for r in results] == ["inband", "scaleout"]
    assert len(warnings) == 1 and "broken.json" in warnings[0]
    table = bench.benchmarks_table(results)
    assert "`pcap_reports_per_s` 1,234,567" in table and "2027-01-03, `def5678`" in table
    assert "`efficiency` 0.93" in table and "python benchmarks/inband.py --json" in table
    scaling = bench.scaling_table(results)
    assert "| 1,024 | 1 | 0.93 |" in scaling and "inband" not in scaling


def test_the_docs_tables_are_the_results_folder(bench: ModuleType) -> None:
    results = bench.load()
    for doc, marks, block in (
        (bench.BENCHMARKS_DOC, bench.TABLE, bench.benchmarks_table(results)),
        (bench.SCALING_DOC, bench.SCALING, bench.scaling_table(results)),
    ):
        text = doc.read_text()
        assert bench.replace_between(text, marks, block, doc) == text, (
            f"{doc.name} is stale: run python scripts/bench_table.py"
        )
