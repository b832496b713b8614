"""Builds rocewatch-agent (metadata in pyproject.toml) from the repository's own modules, keeping
only those the node agent imports: ``rocewatch`` and ``collector`` hold the whole service too.

tests/test_deploy_agent.py builds the wheel and runs the agent from it with Polars, NumPy and
the rest of the product unimportable, so a module missing here fails there.
"""

from __future__ import annotations

from typing import Any

from setuptools import setup
from setuptools.command.build_py import build_py

MODULES = {
    "rocewatch.__init__",
    "rocewatch.config",
    "rocewatch.bus.__init__",
    "rocewatch.bus.config",
    "rocewatch.core.__init__",
    "rocewatch.core.config",
    "rocewatch.core.errors",
    "rocewatch.core.metrics",
    "rocewatch.core.stats",
    "collector.__init__",
    "collector.mapping",
    "collector.output",
    "collector.registry",  # `rocewatch agent` finds its command there (rocewatch/cli.py)
    "collector.nic.__init__",
    "collector.nic.agent",
    "collector.nic.batch",
    "rocewatch.agent_cli",
    "collector.nic.config",
    "collector.nic.ethtool",
    "collector.nic.kafka_output",
    "collector.nic.mlxlink",
    "collector.nic.roce_config",
    "collector.nic.samples",
    "collector.nic.spool",
    "collector.nic.sysfs",
}


class BuildAgent(build_py):
    def find_package_modules(self, package: str, package_dir: str) -> list[Any]:
        found = super().find_package_modules(package, package_dir)
        return [m for m in found if f"{m[0]}.{m[1]}" in MODULES]


setup(cmdclass={"build_py": BuildAgent})
