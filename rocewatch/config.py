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
import os
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from collector.nic.config import AgentConfig
from rocewatch.core.errors import ConfigError

if TYPE_CHECKING:
    from actions.api import ApiConfig
    from actions.membership import MembershipConfig
    from actions.policy import PolicyConfig
    from actions.routing import ExecutorsConfig
    from detectors.lifecycle import LifecycleConfig
    from detectors.windows import WindowConfig
    from rocewatch.alerting.inhibit import InhibitConfig
    from rocewatch.notify.base import NotifyConfig

T = TypeVar("T")
SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER", "GSSAPI")
_ENV = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


class Secret(str):
    """A string that never shows its value in a repr (kafka-python logs its config dicts)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "'***'"


@dataclass(frozen=True)
class TopicsConfig:
    telemetry: str = "rocewatch.telemetry"
    alerts: str = "rocewatch.alerts"
    actions: str = "rocewatch.actions"
    dead_letter: str = "rocewatch.dlq"
    steps: str = "rocewatch.steps"  # detect: closed steps per telemetry partition
    state: str = "rocewatch.state"  # detect: compacted per-partition and detect-stage state
    rollups: str = "rocewatch.rollups"  # detect with storage: metric rollups for the sink


@dataclass(frozen=True)
class KafkaConfig:
    bootstrap_servers: str = "127.0.0.1:9092"
    security_protocol: str = "PLAINTEXT"
    ssl_cafile: str | None = None
    ssl_certfile: str | None = None
    ssl_keyfile: str | None = None
    ssl_check_hostname: bool = True
    sasl_mechanism: str | None = None
    sasl_plain_username: str | None = None
    sasl_plain_password: str | None = field(default=None, repr=False)
    # a file holding the password (a mounted Kubernetes/Docker secret); one line, read at start-up
    sasl_plain_password_file: str | None = None
    topics: TopicsConfig = field(default_factory=TopicsConfig)
    group_id: str = "rocewatch-detect"
    client_id: str = "rocewatch"
    compression_type: str = "lz4"
    partitions: int = 4
    commit_interval_s: float = 5.0  # checkpoint + offset commit; a crash re-reads at most this
    session_timeout_ms: int = 10000  # how soon a dead detector's partitions move to another
    idle_flush_s: float = 2.0
    # a telemetry partition read to its end and silent this long stops holding back the
    # others' windows. Silence is not proof of idleness: after a broker restart a publisher may
    # take several seconds to resend one partition's backlog, and closing windows without it
    # would drop those samples as late. A partition that really fell silent delays alerts by
    # this much, once.
    partition_idle_s: float = 15.0
    # longest wait between reconnect attempts to a broker that went away (kafka-python: 30 s)
    reconnect_backoff_max_ms: int = 1000
    # the publisher's bound on telemetry not yet acknowledged by the broker, and what to do
    # when it is full: block (slow the collector down) or drop (count and skip new telemetry)
    publish_buffer_bytes: int = 64 << 20
    publish_when_full: str = "block"
    # accepted for old config files, without effect: `rocewatch detect` is always the two-stage
    # service (one instance is a group of one)
    scale_out: bool = False
    # the detect stage writes its alerts, actions and state in Kafka transactions
    # (transactional.id <group_id>-detect), so an instance that stalled past its session and
    # lost the stage is fenced: nothing it writes afterwards becomes visible, and it drains no
    # node. Needs the broker's transaction state log (and, with ACLs, Write on that id).
    fence_detect: bool = True

    def client_kwargs(self) -> dict[str, Any]:
        """Connection settings shared by kafka-python producers, consumers and admin clients."""
        kw: dict[str, Any] = {
            "bootstrap_servers": self.bootstrap_servers.split(","),
            "security_protocol": self.security_protocol,
            "client_id": self.client_id,
            "reconnect_backoff_max_ms": self.reconnect_backoff_max_ms,
        }
        # the certificate files are looked for when connecting, not when the config is read
        # (a config written for the deployment's hosts still parses elsewhere)
        for name in ("ssl_cafile", "ssl_certfile", "ssl_keyfile"):
            path = getattr(self, name)
            if path and self.security_protocol.endswith("SSL") and not Path(path).is_file():
                raise ConfigError(f"kafka.{name}: {path}: no such file")
        if self.security_protocol in ("SSL", "SASL_SSL"):
            kw.update(
                ssl_cafile=self.ssl_cafile,
                ssl_certfile=self.ssl_certfile,
                ssl_keyfile=self.ssl_keyfile,
                ssl_check_hostname=self.ssl_check_hostname,
            )
        if self.security_protocol.startswith("SASL"):
            pw = self.password()
            kw.update(
                sasl_mechanism=self.sasl_mechanism,
                sasl_plain_username=self.sasl_plain_username,
                sasl_plain_password=None if pw is None else Secret(pw),
            )
        return kw

    def password(self) -> str | None:
        """The SASL password: ``sasl_plain_password``, else the first line of the password file."""
        if self.sasl_plain_password is not None or not self.sasl_plain_password_file:
            return self.sasl_plain_password
        try:
            text = Path(self.sasl_plain_password_file).read_text()
        except OSError as e:
            raise ConfigError(
                f"kafka.sasl_plain_password_file: cannot read {self.sasl_plain_password_file}: "
                f"{e.strerror}"
            ) from e
        return text.splitlines()[0] if text.strip() else ""

    def validate(self) -> None:
        if self.security_protocol not in ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"):
            raise ConfigError(f"kafka.security_protocol: {self.security_protocol!r} is not valid")
        if self.security_protocol.startswith("SASL") and not self.sasl_mechanism:
            raise ConfigError("kafka.sasl_mechanism is required with a SASL security_protocol")
        if self.sasl_mechanism and self.sasl_mechanism not in SASL_MECHANISMS:
            raise ConfigError(
                f"kafka.sasl_mechanism: {self.sasl_mechanism!r} is not valid "
                f"(one of {', '.join(SASL_MECHANISMS)})"
            )
        if self.sasl_plain_password is not None and self.sasl_plain_password_file:
            raise ConfigError(
                "kafka: give sasl_plain_password or sasl_plain_password_file, not both"
            )
        if self.security_protocol.startswith("SASL") and self.sasl_mechanism in (
            "PLAIN",
            "SCRAM-SHA-256",
            "SCRAM-SHA-512",
        ):
            if not self.sasl_plain_username:
                raise ConfigError(
                    f"kafka.sasl_plain_username is required with {self.sasl_mechanism}"
                )
            if not self.password():
                raise ConfigError(
                    f"kafka: {self.sasl_mechanism} needs a password "
                    "(sasl_plain_password, e.g. ${ENV_VAR}, or sasl_plain_password_file)"
                )
        if self.publish_when_full not in ("block", "drop"):
            raise ConfigError(
                f"kafka.publish_when_full: {self.publish_when_full!r} is not valid (block, drop)"
            )
        if self.publish_buffer_bytes < 1 << 20:
            raise ConfigError("kafka.publish_buffer_bytes: must be at least 1048576 (1 MiB)")
        if self.compression_type not in ("none", "gzip", "lz4", "zstd", "snappy"):
            raise ConfigError(f"kafka.compression_type: {self.compression_type!r} is not valid")


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


# top-level keys config_from_dict reads by hand (not fields of Config)
_HAND_READ = ("storage", "actions", "executors", "notify", "inhibit_rules", "inhibit_wait_s")


@dataclass(frozen=True)
class AgentFileConfig:
    """What the node agent reads of a config file (:func:`load_agent_config`)."""

    kafka: KafkaConfig = field(default_factory=KafkaConfig)
    agent: AgentConfig = field(default_factory=AgentConfig)
    metrics_port: int | None = None


def _expand(v: Any) -> Any:
    if isinstance(v, str):

        def sub(m: re.Match[str]) -> str:
            if m.group(1) not in os.environ:
                raise ConfigError(f"environment variable {m.group(1)} is not set")
            return os.environ[m.group(1)]

        return _ENV.sub(sub, v)
    if isinstance(v, dict):
        return {k: _expand(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_expand(x) for x in v]
    return v


def build(cls: type[T], data: Any, where: str) -> T:
    """A frozen dataclass from a mapping, recursing into nested dataclass fields."""
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
        sub = _DATACLASSES.get(ftype if isinstance(ftype, str) else getattr(ftype, "__name__", ""))
        if sub is not None:
            kw[k] = build(sub, v, f"{where}.{k}")
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


# dataclass name (a field's annotation) -> the module that defines it; ``build`` recurses into
# these. Imported on first use (see the module docstring).
_SECTION_MODULES: dict[str, str] = {
    "TopicsConfig": __name__,
    "KafkaConfig": __name__,
    "SinkConfig": __name__,
    "WindowConfig": "detectors.windows",
    "LifecycleConfig": "detectors.lifecycle",
    "PolicyConfig": "actions.policy",
    "MembershipConfig": "actions.membership",
    "ApiConfig": "actions.api",
    "AgentConfig": "collector.nic.config",
    "RetryConfig": "rocewatch.notify.base",
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


def _notify(data: Any, where: str) -> NotifyConfig:
    """The ``notify`` section: lists of webhooks and alertmanagers, retry settings."""
    from rocewatch.notify.base import AlertmanagerConfig, NotifyConfig, WebhookConfig

    if data is None:
        return NotifyConfig()
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: must be a mapping")
    data = dict(data)
    lists: dict[str, Any] = {}
    for key, cls in (("webhooks", WebhookConfig), ("alertmanagers", AlertmanagerConfig)):
        items = data.pop(key, None) or []
        if not isinstance(items, list):
            raise ConfigError(f"{where}.{key}: must be a list")
        lists[key] = tuple(build(cls, d, f"{where}.{key}[{i}]") for i, d in enumerate(items))
    cfg = dataclasses.replace(build(NotifyConfig, data, where), **lists)
    cfg.validate()
    return cfg


def _read(path: str | Path) -> Any:
    import yaml  # here: `rocewatch agent --once` without a file never needs it

    try:
        return yaml.safe_load(Path(path).read_text()) or {}
    except OSError as e:
        raise ConfigError(f"{path}: cannot read config: {e.strerror}") from e
    except UnicodeDecodeError as e:  # a binary file given by mistake
        raise ConfigError(f"{path}: not UTF-8 text (byte {e.start})") from e
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML: {e}") from e


def load_config(path: str | Path | None) -> Config:
    if path is None:
        return Config()
    return config_from_dict(_read(path), str(path))


def load_agent_config(path: str | Path | None) -> AgentFileConfig:
    """The node agent's sections of a config file: ``kafka``, ``agent`` and ``metrics_port``.

    They are read and validated as :func:`load_config` reads them. The file may be the services'
    own config: its other sections are left to the services (an unknown top-level key is still
    an error), and ``${ENV_VAR}`` is expanded only in the agent's sections, so a node need not
    hold the services' secrets.
    """
    if path is None:
        return AgentFileConfig()
    return agent_config_from_dict(_read(path), str(path))


def agent_config_from_dict(doc: Any, where: str = "config") -> AgentFileConfig:
    if not isinstance(doc, dict):
        raise ConfigError(f"{where}: must be a mapping")
    known = {f.name for f in dataclasses.fields(Config) if f.name != "inhibit"}
    known.update(_HAND_READ)
    for k in doc:
        if k not in known:
            raise ConfigError(f"{where}.{k}: unknown setting (known: {', '.join(sorted(known))})")
    mine = {f.name for f in dataclasses.fields(AgentFileConfig)}
    return build(AgentFileConfig, _expand({k: v for k, v in doc.items() if k in mine}), where)


def config_from_dict(doc: dict[str, Any], where: str = "config") -> Config:
    from actions.policy import PolicyConfig
    from actions.routing import ExecutorsConfig
    from detectors.registry import DETECTORS
    from rocewatch.alerting.inhibit import inhibit_config

    if not isinstance(doc, dict):
        raise ConfigError(f"{where}: must be a mapping")
    doc = _expand(doc)
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
