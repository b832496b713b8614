"""Configuration of the gNMI collector: targets, TLS, credentials, subscriptions, backoff.

In the rocewatch config file, under ``gnmi:``::

    gnmi:
      port: 9339                    # for targets taken from the topology's addresses
      targets_from_topology: true
      subscription:
        mode: stream                # stream | once | poll
        stream_mode: sample         # sample | on_change | target_defined
        sample_interval_s: 0.1
        heartbeat_interval_s: 0     # 0: none
        suppress_redundant: false
        updates_only: false
      tls: {ca_file: ca.pem, cert_file: client.pem, key_file: client.key}
      username: ${GNMI_USER}
      password: ${GNMI_PASSWORD}
      targets:
        - {name: leaf-r0-p0, address: 10.0.0.11:9339}
        - {name: spine-0, address: 10.0.0.21:9339, tls: {skip_verify: true}}

A target's own ``tls``, ``username``, ``password`` and ``subscription`` replace the defaults.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from rocewatch.core.config import build
from rocewatch.core.errors import ConfigError
from rocewatch.core.topology import Topology

DEFAULT_PATHS = (
    "/interfaces/interface/state/counters",
    "/interfaces/interface/ethernet/state/counters",
    "/qos/interfaces/interface",
    "/lldp/interfaces/interface/neighbors",
)
MODES = ("stream", "once", "poll")
ENCODINGS = ("proto", "json_ietf", "json")
STREAM_MODES = ("sample", "on_change", "target_defined")


@dataclass(frozen=True)
class SubscriptionConfig:
    name: str = "fabric"
    paths: tuple[str, ...] = DEFAULT_PATHS
    mode: str = "stream"
    stream_mode: str = "sample"
    sample_interval_s: float = 1.0
    heartbeat_interval_s: float = 0.0
    suppress_redundant: bool = False
    updates_only: bool = False
    poll_interval_s: float = 1.0
    # the gNMI prefix target of this subscription (default: the target's own ``target``);
    # SONiC's tables: CONFIG_DB
    target: str | None = None
    encoding: str = "proto"  # proto | json_ietf (SONiC's CONFIG_DB) | json

    def validate(self) -> None:
        if self.encoding not in ENCODINGS:
            raise ConfigError(
                f"gnmi.subscription.encoding: {self.encoding!r} is not one of {ENCODINGS}"
            )
        if self.mode not in MODES:
            raise ConfigError(f"gnmi.subscription.mode: {self.mode!r} is not one of {MODES}")
        if self.stream_mode not in STREAM_MODES:
            raise ConfigError(
                f"gnmi.subscription.stream_mode: {self.stream_mode!r} is not one of {STREAM_MODES}"
            )
        if not self.paths:
            raise ConfigError("gnmi.subscription.paths: needs at least one path")
        if self.sample_interval_s < 0 or self.heartbeat_interval_s < 0:
            raise ConfigError("gnmi.subscription: intervals must be >= 0")
        if self.poll_interval_s <= 0:
            raise ConfigError("gnmi.subscription.poll_interval_s must be > 0")


@dataclass(frozen=True)
class TlsConfig:
    """``enabled`` is implied by any other setting. ``ca_file`` verifies the target;
    ``cert_file`` + ``key_file`` present a client certificate (mTLS); ``skip_verify`` trusts
    whatever certificate the target presents (it must be self-signed: grpc has no switch to turn
    verification off); ``server_name`` overrides the name checked against the certificate."""

    enabled: bool = False
    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    skip_verify: bool = False
    server_name: str | None = None

    @property
    def on(self) -> bool:
        return bool(self.enabled or self.ca_file or self.cert_file or self.skip_verify)

    def validate(self) -> None:
        if bool(self.cert_file) != bool(self.key_file):
            raise ConfigError("gnmi tls: cert_file and key_file go together")


@dataclass(frozen=True)
class TargetConfig:
    name: str
    address: str
    target: str | None = None  # gNMI prefix.target; default: none (the device itself)
    tls: TlsConfig | None = None
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    subscription: SubscriptionConfig | None = None

    def validate(self) -> None:
        host, _, port = self.address.rpartition(":")
        if not host or not port.isdigit():
            raise ConfigError(f"gnmi target {self.name}: address {self.address!r} needs host:port")


@dataclass(frozen=True)
class GnmiConfig:
    targets: tuple[TargetConfig, ...] = ()
    targets_from_topology: bool = False
    port: int = 9339
    subscription: SubscriptionConfig = field(default_factory=SubscriptionConfig)
    tls: TlsConfig = field(default_factory=TlsConfig)
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    backoff_initial_s: float = 0.5
    backoff_max_s: float = 30.0
    # the switches' RoCE configuration (docs/roce_config.md): a second subscription per target,
    # its notifications published as gnmic events on kafka.topics.config; none: not collected.
    # E.g. SONiC: {name: config, target: CONFIG_DB, encoding: json_ietf, stream_mode: sample,
    # sample_interval_s: 60, paths: [PORT_QOS_MAP, DSCP_TO_TC_MAP, WRED_PROFILE, PFC_WD, ...]}
    config_subscription: SubscriptionConfig | None = None
    batch_updates: int = 50_000  # flush a batch at this many samples...
    batch_interval_s: float = 0.2  # ...or after this long
    seed: int = 0

    def validate(self) -> None:
        if not 0 < self.backoff_initial_s <= self.backoff_max_s:
            raise ConfigError("gnmi: need 0 < backoff_initial_s <= backoff_max_s")
        names = [t.name for t in self.targets]
        dup = {n for n in names if names.count(n) > 1}
        if dup:
            raise ConfigError(f"gnmi.targets: duplicate names {sorted(dup)}")

    def resolved(self, t: TargetConfig) -> TargetConfig:
        """``t`` with the collector-wide defaults filled in."""
        return dataclasses.replace(
            t,
            tls=t.tls or self.tls,
            username=t.username if t.username is not None else self.username,
            password=t.password if t.password is not None else self.password,
            subscription=t.subscription or self.subscription,
        )

    def all_targets(self, topology: Topology | None = None) -> list[TargetConfig]:
        """The configured targets, plus the topology's switches that have an address."""
        out = {t.name: self.resolved(t) for t in self.targets}
        if self.targets_from_topology and topology is not None:
            for sw in topology.switches.values():
                if sw.address and sw.name not in out:
                    addr = sw.address if ":" in sw.address else f"{sw.address}:{self.port}"
                    out[sw.name] = self.resolved(TargetConfig(sw.name, addr))
        return list(out.values())


def _target(d: Any, i: int) -> TargetConfig:
    if not isinstance(d, dict):
        raise ConfigError(f"gnmi.targets[{i}]: must be a mapping")
    d = dict(d)
    tls = d.pop("tls", None)
    sub = d.pop("subscription", None)
    if "name" not in d or "address" not in d:
        raise ConfigError(f"gnmi.targets[{i}]: needs name and address")
    t = build(TargetConfig, d, f"gnmi.targets[{i}]")
    return dataclasses.replace(
        t,
        tls=build(TlsConfig, tls, f"gnmi.targets[{i}].tls") if tls is not None else None,
        subscription=_sub(sub, f"gnmi.targets[{i}].subscription") if sub is not None else None,
    )


def _sub(d: Any, where: str) -> SubscriptionConfig:
    if isinstance(d, dict) and isinstance(d.get("paths"), list):
        d = dict(d, paths=tuple(str(p) for p in d["paths"]))
    return build(SubscriptionConfig, d, where)


def gnmi_config(doc: Any) -> GnmiConfig:
    """The ``gnmi:`` section of a rocewatch config (a mapping) -> GnmiConfig."""
    if doc is None:
        return GnmiConfig()
    if not isinstance(doc, dict):
        raise ConfigError("gnmi: must be a mapping")
    d = dict(doc)
    targets = d.pop("targets", None) or []
    sub = d.pop("subscription", None)
    config_sub = d.pop("config_subscription", None)
    tls = d.pop("tls", None)
    if not isinstance(targets, list):
        raise ConfigError("gnmi.targets: must be a list")
    cfg = build(GnmiConfig, d, "gnmi")
    cfg = dataclasses.replace(
        cfg,
        targets=tuple(_target(t, i) for i, t in enumerate(targets)),
        subscription=_sub(sub, "gnmi.subscription"),
        tls=build(TlsConfig, tls, "gnmi.tls"),
        config_subscription=None
        if config_sub is None
        else _sub(config_sub, "gnmi.config_subscription"),
    )
    cfg.validate()
    return cfg
