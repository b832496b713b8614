"""Configuration: one YAML file, read into frozen dataclasses and validated at start-up.

Unknown keys and bad values raise ConfigError naming the key. Secrets may be given as
``${ENV_VAR}`` so they stay out of the file; they are never logged.

Each section's dataclass lives with the code it configures (``detectors.windows``,
``actions.policy``, ``collector.nic.config``, ...) and is imported only when that section is
built, so that a process reading one part does not import the others: the node agent reads
``kafka``, ``agent`` and ``metrics_port`` with :func:`load_agent_config` and never imports a
detector, Polars or an action module.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from collector.nic.config import AgentConfig
from rocewatch.bus.config import (  # noqa: F401 (re-exported: the product config holds them)
    SASL_MECHANISMS,
    KafkaConfig,
    StateKeyConfig,
    StateSigningConfig,
    TopicsConfig,
)
from rocewatch.core.config import Secret, expand_env, read_yaml  # noqa: F401
from rocewatch.core.config import build as _build
from rocewatch.core.errors import ConfigError

if TYPE_CHECKING:
    from actions.api import ApiConfig
    from actions.membership import MembershipConfig
    from actions.policy import PolicyConfig
    from actions.routing import ExecutorsConfig
    from detectors.lifecycle import LifecycleConfig
    from detectors.windows import WindowConfig
    from rocewatch.alerting.inhibit import InhibitConfig
    from rocewatch.alerting.interference import InterferenceConfig
    from rocewatch.notify.base import NotifyConfig

T = TypeVar("T")


@dataclass(frozen=True)
class SinkConfig:
    # `rocewatch detect` stores and notifies what it publishes itself, in a thread (with
    # storage.url or notify sinks); false: a separate `rocewatch sink` does it
    embedded: bool = True


def _section(module: str, name: str) -> Callable[[], Any]:
    """A default_factory that imports the section's dataclass only when a default is made."""

    def make() -> Any:
        return getattr(importlib.import_module(module), name)()

    return make


@dataclass(frozen=True)
class Config:
    topology: str | None = None
    kafka: KafkaConfig = field(default_factory=KafkaConfig)
    storage_url: str | None = None
    storage_retention_days: float | None = None  # storage.retention_days: prune older rows
    state_dir: str = "./rocewatch-state"
    metrics_port: int | None = None
    window: WindowConfig = field(default_factory=_section("detectors.windows", "WindowConfig"))
    lifecycle: LifecycleConfig = field(
        default_factory=_section("detectors.lifecycle", "LifecycleConfig")
    )
    policy: PolicyConfig = field(default_factory=_section("actions.policy", "PolicyConfig"))
    executors: ExecutorsConfig = field(
        default_factory=_section("actions.routing", "ExecutorsConfig")
    )
    membership: MembershipConfig = field(
        default_factory=_section("actions.membership", "MembershipConfig")
    )
    api: ApiConfig = field(default_factory=_section("actions.api", "ApiConfig"))
    sink: SinkConfig = field(default_factory=SinkConfig)
    detectors: dict[str, Any] = field(default_factory=dict)
    agent: AgentConfig = field(default_factory=AgentConfig)
    notify: NotifyConfig = field(default_factory=_section("rocewatch.notify.base", "NotifyConfig"))
    gnmi: dict[str, Any] = field(default_factory=dict)  # collector/gnmi/config.py reads it
    # top-level ``inhibit_rules`` (Alertmanager's syntax) and ``inhibit_wait_s``: docs/alerting.md
    inhibit: InhibitConfig = field(
        default_factory=_section("rocewatch.alerting.inhibit", "InhibitConfig")
    )
    # victims and aggressors of congestion between tenants: docs/alerting.md
    interference: InterferenceConfig = field(
        default_factory=_section("rocewatch.alerting.interference", "InterferenceConfig")
    )


# top-level keys config_from_dict reads by hand (not fields of Config)
_HAND_READ = ("storage", "actions", "executors", "notify", "inhibit_rules", "inhibit_wait_s")


@dataclass(frozen=True)
class AgentFileConfig:
    """What the node agent reads of a config file (:func:`load_agent_config`)."""

    kafka: KafkaConfig = field(default_factory=KafkaConfig)
    agent: AgentConfig = field(default_factory=AgentConfig)
    metrics_port: int | None = None


# dataclass name (a field's annotation) -> the module that defines it; ``build`` recurses into
# these. Imported on first use (see the module docstring).
_SECTION_MODULES: dict[str, str] = {
    "TopicsConfig": "rocewatch.bus.config",
    "KafkaConfig": "rocewatch.bus.config",
    "SinkConfig": __name__,
    "StateSigningConfig": "rocewatch.bus.config",
    "StateKeyConfig": "rocewatch.bus.config",
    "WindowConfig": "detectors.windows",
    "LifecycleConfig": "detectors.lifecycle",
    "PolicyConfig": "actions.policy",
    "MembershipConfig": "actions.membership",
    "ApiConfig": "actions.api",
    "AgentConfig": "collector.nic.config",
    "RetryConfig": "rocewatch.notify.base",
    "InterferenceConfig": "rocewatch.alerting.interference",
    "TlsConfig": "rocewatch.notify.base",
}


class _Sections(Mapping[str, type[Any]]):
    """``_SECTION_MODULES`` as a mapping of name -> class, each module imported when asked."""

    def __getitem__(self, name: str) -> type[Any]:
        cls: type[Any] = getattr(importlib.import_module(_SECTION_MODULES[name]), name)
        return cls

    def __iter__(self) -> Iterator[str]:
        return iter(_SECTION_MODULES)

    def __len__(self) -> int:
        return len(_SECTION_MODULES)


_DATACLASSES: Mapping[str, type[Any]] = _Sections()


def build(cls: type[T], data: Any, where: str) -> T:
    """``rocewatch.core.config.build`` knowing the product's sections."""
    return _build(cls, data, where, _DATACLASSES)


def _notify(data: Any, where: str) -> NotifyConfig:
    """The ``notify`` section: a list of sinks per kind the sink registry has (webhooks,
    alertmanagers), retry settings."""
    from rocewatch.notify.base import NotifyConfig
    from rocewatch.notify.registry import SINKS

    if data is None:
        return NotifyConfig()
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: must be a mapping")
    data = dict(data)
    if "sinks" in data:  # (not a key of the file: the lists are under their kinds' names)
        raise ConfigError(f"{where}.sinks: unknown setting (sinks go under {', '.join(SINKS)})")
    sinks: dict[str, tuple[Any, ...]] = {}
    for key, entry in SINKS.items():
        items = data.pop(key, None) or []
        if not isinstance(items, list):
            raise ConfigError(f"{where}.{key}: must be a list")
        sinks[key] = tuple(
            build(entry.config, d, f"{where}.{key}[{i}]") for i, d in enumerate(items)
        )
    cfg = dataclasses.replace(build(NotifyConfig, data, where), sinks=sinks)
    cfg.validate()
    return cfg


def load_config(path: str | Path | None) -> Config:
    if path is None:
        return Config()
    return config_from_dict(read_yaml(path), str(path))


def load_agent_config(path: str | Path | None) -> AgentFileConfig:
    """The node agent's sections of a config file: ``kafka``, ``agent`` and ``metrics_port``.

    They are read and validated as :func:`load_config` reads them. The file may be the services'
    own config: its other sections are left to the services (an unknown top-level key is still
    an error), and ``${ENV_VAR}`` is expanded only in the agent's sections, so a node need not
    hold the services' secrets.
    """
    if path is None:
        return AgentFileConfig()
    return agent_config_from_dict(read_yaml(path), str(path))


def agent_config_from_dict(doc: Any, where: str = "config") -> AgentFileConfig:
    if not isinstance(doc, dict):
        raise ConfigError(f"{where}: must be a mapping")
    known = {f.name for f in dataclasses.fields(Config) if f.name != "inhibit"}
    known.update(_HAND_READ)
    for k in doc:
        if k not in known:
            raise ConfigError(f"{where}.{k}: unknown setting (known: {', '.join(sorted(known))})")
    mine = {f.name for f in dataclasses.fields(AgentFileConfig)}
    return build(AgentFileConfig, expand_env({k: v for k, v in doc.items() if k in mine}), where)


def config_from_dict(doc: dict[str, Any], where: str = "config") -> Config:
    from actions.policy import PolicyConfig
    from actions.routing import ExecutorsConfig
    from collector.registry import validate_sections
    from detectors.registry import DETECTORS
    from rocewatch.alerting.inhibit import inhibit_config

    if not isinstance(doc, dict):
        raise ConfigError(f"{where}: must be a mapping")
    doc = expand_env(doc)
    doc = dict(doc)
    storage = doc.pop("storage", None) or {}
    actions = doc.pop("actions", None)
    executors = ExecutorsConfig.from_dict(doc.pop("executors", None), build, f"{where}.executors")
    notify = _notify(doc.pop("notify", None), f"{where}.notify")
    if "inhibit" in doc:
        raise ConfigError(f"{where}.inhibit: unknown setting (use inhibit_rules, inhibit_wait_s)")
    inhibit = inhibit_config(doc.pop("inhibit_rules", None), doc.pop("inhibit_wait_s", None), where)
    dets = doc.pop("detectors", None) or {}
    if not isinstance(dets, dict):
        raise ConfigError(f"{where}.detectors: must be a mapping")
    built: dict[str, Any] = {}
    for name, d in dets.items():
        if name not in DETECTORS:
            raise ConfigError(
                f"{where}.detectors.{name}: unknown detector "
                f"(known: {', '.join(sorted(DETECTORS))})"
            )
        built[name] = build(DETECTORS[name].config, d, f"{where}.detectors.{name}")
    validate_sections(doc, where)  # each collector's own section (collector/registry.py)
    cfg = build(Config, doc, where)
    policy = build(PolicyConfig, actions, f"{where}.actions")
    if not isinstance(storage, dict):
        raise ConfigError(f"{where}.storage: must be a mapping")
    unknown = set(storage) - {"url", "retention_days"}
    if unknown:
        raise ConfigError(f"{where}.storage.{sorted(unknown)[0]}: unknown setting")
    url = storage.get("url")
    keep = storage.get("retention_days")
    if keep is not None and (not isinstance(keep, int | float) or keep <= 0):
        raise ConfigError(f"{where}.storage.retention_days: must be a positive number of days")
    return dataclasses.replace(
        cfg,
        policy=policy,
        executors=executors,
        detectors=built,
        storage_url=url,
        storage_retention_days=keep,
        notify=notify,
        inhibit=inhibit,
    )
