"""A collector is one folder plus one registry entry: the command line offers each entry's
command with its flags and runs it, with no edit of rocewatch/cli.py."""

from __future__ import annotations

import argparse
import subprocess
import sys
import types

import pytest

from collector import registry
from collector.registry import COLLECTORS, CollectorEntry
from rocewatch import cli

RAN: list[argparse.Namespace] = []


def _add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--feed", required=True, help="where the dummy reads")
    p.add_argument("--rate", type=float, default=1.0)


def _run(args: argparse.Namespace) -> int:
    RAN.append(args)
    return 7


@pytest.fixture
def dummy(monkeypatch: pytest.MonkeyPatch) -> str:
    """A collector registered in-process: its hooks in a module of its own."""
    mod = types.ModuleType("dummy_collector_command")
    mod.add_arguments = _add_arguments  # type: ignore[attr-defined]
    mod.run = _run  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, mod.__name__, mod)
    entry = CollectorEntry(
        "",
        "",
        "dummy-collect",
        "a collector the registry alone knows",
        arguments=f"{mod.__name__}:add_arguments",
        run=f"{mod.__name__}:run",
    )
    monkeypatch.setitem(COLLECTORS, "dummy", entry)
    RAN.clear()
    return entry.command


def test_the_command_line_offers_and_runs_a_registered_collector(
    dummy: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        cli.build_parser().parse_args(["--help"])
    assert dummy in capsys.readouterr().out  # listed beside the others
    args = cli.build_parser().parse_args([dummy, "--feed", "x", "--rate", "2.5"])
    assert (args.command, args.feed, args.rate) == (dummy, "x", 2.5)
    with pytest.raises(SystemExit):  # its own flags, checked by argparse
        cli.build_parser().parse_args([dummy])
    assert "--feed" in capsys.readouterr().err
    assert cli.main([dummy, "--feed", "y"]) == 7  # dispatched to its runner
    assert [(a.feed, a.rate) for a in RAN] == [("y", 1.0)]


def test_every_registered_command_resolves() -> None:
    """Each entry's hooks exist (a typo in a reference fails here, not in production)."""
    cmds = registry.commands()
    assert {"agent", "int-listen", "nccl-collect"} <= set(cmds)
    for entry in COLLECTORS.values():
        for ref in (entry.load, entry.arguments, entry.run):
            if ref:
                assert callable(registry.resolve(ref)), ref


def test_the_agents_command_line_imports_no_other_collector() -> None:
    """Building the command line for ``agent`` loads only the agent's flags: no Polars, gRPC
    or Kafka client (the agent runs on every GPU node)."""
    code = (
        "import sys; from rocewatch.cli import build_parser, _command_of; "
        "a = build_parser(_command_of(['agent', '--once'])).parse_args(['agent', '--once']); "
        "print(a.command, sorted(m for m in ('polars', 'grpc', 'kafka') if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    ).stdout
    assert out.split() == ["agent", "[]"], out
