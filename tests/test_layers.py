"""The layers contract (.importlinter, docs/architecture.md): each layer imports only the
layers below it. CI runs `lint-imports` on the tree; these tests show the contract holds here
and that it fails on an upward import."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("rocewatch", "collector", "detectors", "storage", "actions")


def lint(tree: Path) -> subprocess.CompletedProcess[str]:
    # lint-imports finds the packages on sys.path: the tree's own, first
    return subprocess.run(
        [sys.executable, "-c", "import sys; from importlinter.cli import lint_imports_command; "
         "sys.exit(lint_imports_command())", "--no-cache"],
        cwd=tree, capture_output=True, text=True, timeout=300,
        env={"PYTHONPATH": str(tree), "PATH": "/usr/bin:/bin"},
    )  # fmt: skip


def copy_tree(dst: Path) -> Path:
    for p in PACKAGES:
        shutil.copytree(ROOT / p, dst / p, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / ".importlinter", dst / ".importlinter")
    return dst


def test_the_tree_keeps_the_layers_contract() -> None:
    res = lint(ROOT)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-2000:]
    assert "1 kept, 0 broken" in res.stdout


def test_an_upward_import_breaks_the_contract(tmp_path: Path) -> None:
    tree = copy_tree(tmp_path)
    model = tree / "rocewatch" / "core" / "model.py"
    # the floor importing the runtime: what the contract exists to stop
    model.write_text(model.read_text() + "\nfrom rocewatch.runtime import detect  # noqa\n")
    res = lint(tree)
    assert res.returncode != 0
    assert "rocewatch.core is not allowed to import rocewatch.runtime" in res.stdout, res.stdout
    assert "rocewatch.core.model -> rocewatch.runtime.detect" in res.stdout, res.stdout
