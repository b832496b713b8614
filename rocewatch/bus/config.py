"""The Kafka section of the config (``kafka``): brokers, security, topics, the state topic's
MAC keys. The bus owns it; the product config (rocewatch/config.py) holds it."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rocewatch.core.config import Secret
from rocewatch.core.errors import ConfigError

SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER", "GSSAPI")


@dataclass(frozen=True)
class TopicsConfig:
    telemetry: str = "rocewatch.telemetry"
    alerts: str = "rocewatch.alerts"
    actions: str = "rocewatch.actions"
    dead_letter: str = "rocewatch.dlq"
    steps: str = "rocewatch.steps"  # detect: closed steps per telemetry partition
    state: str = "rocewatch.state"  # detect: compacted per-partition and detect-stage state
    rollups: str = "rocewatch.rollups"  # detect with storage: metric rollups for the sink
    # RoCE configuration records (CONTRACTS.md section 5: nic_config.jsonl snapshots from the
    # agents, switch_config.jsonl events from the gNMI collector or gnmic), keyed by device
    config: str = "rocewatch.config"


_KEY_ID = re.compile(r"[A-Za-z0-9._-]{1,64}")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@dataclass(frozen=True)
class StateKeyConfig:
    """One key of the state topic's MAC (``rocewatch.bus.signing``): its id and where its bytes
    are. The config holds where, never the key, so no repr or log line of it shows one."""

    # the key's name in every record it signs, so a reader picks the key by it (A-Z a-z 0-9 . _ -)
    id: str = ""
    # a file holding the key (a mounted secret): its bytes (a final newline is not part of it)
    file: str | None = None
    # or the name of an environment variable holding it (the name, not ${NAME})
    env: str | None = None

    @property
    def given(self) -> bool:
        return bool(self.id or self.file or self.env)

    def validate(self) -> None:
        # ValueError: ``build`` names the key's path in front of it
        if not self.given:
            return
        if not _KEY_ID.fullmatch(self.id):
            raise ValueError("id: 1 to 64 of A-Z a-z 0-9 . _ - (it names the key in each record)")
        if (self.file is None) == (self.env is None):
            raise ValueError(f"key {self.id!r}: give file or env (one of them)")
        if self.env is not None and not _ENV_NAME.fullmatch(self.env):
            # not echoed: a key given as ${NAME} by mistake would be the value
            raise ValueError(f"key {self.id!r}: env must be an environment variable's name")


@dataclass(frozen=True)
class StateSigningConfig:
    """The state topic's MAC keys: ``key`` signs what this instance writes, and the records of
    ``key`` and of ``read_keys`` are read. Rotation: the new key as ``key``, the old one in
    ``read_keys`` until every instance writes with the new one (docs/operations.md)."""

    # signs the state records this instance writes (and reads those); `rocewatch detect` does
    # not start without one
    key: StateKeyConfig = field(default_factory=StateKeyConfig)
    # older keys whose records are still read (they sign nothing): rotation
    read_keys: tuple[StateKeyConfig, ...] = ()

    def validate(self) -> None:
        if self.read_keys and not self.key.given:
            raise ValueError("read_keys without a key to write with")
        ids = [k.id for k in (self.key, *self.read_keys) if k.given]
        if len(ids) != len(set(ids)):
            raise ValueError("two keys with one id (a reader picks the key by its id)")
        if not all(k.given for k in self.read_keys):
            raise ValueError("read_keys: an empty entry")


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
    # the MAC of the detector's state records (HMAC-SHA256; docs/operations.md, "State topic
    # keys"): `rocewatch detect` needs a key, other commands ignore it
    state_signing: StateSigningConfig = field(default_factory=StateSigningConfig)

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
