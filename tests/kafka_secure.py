"""Test-time PKI and a real Kafka broker with SSL and SASL_SSL (SCRAM) listeners.

Used by the ``secure_kafka_broker`` fixture in conftest.py. Certificates come from the
``cryptography`` package: a CA, and a broker certificate for 127.0.0.1 / localhost signed by it.
The broker reads its key and chain as a PEM keystore (``ssl.keystore.type=PEM``); SCRAM users are
written into the metadata log when the storage is formatted (``kafka-storage format --add-scram``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.pki import issue, new_key, pem, pem_key

SCRAM_MECHANISMS = ("SCRAM-SHA-512", "SCRAM-SHA-256")


@dataclass
class Pki:
    ca_file: Path  # the CA certificate clients trust
    keystore_file: Path  # broker key (PKCS#8) + certificate chain, one PEM file


def make_pki(directory: Path, label: str = "rocewatch-test") -> Pki:
    """A fresh CA and a broker certificate (SAN 127.0.0.1, localhost) under ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    ca_key = new_key()
    ca_cert = issue(f"{label} CA", ca_key, ca=True, days=2)
    key = new_key()
    cert = issue("kafka broker", key, (ca_cert, ca_key), server=True)
    ca_file = directory / "ca.pem"
    ca_file.write_bytes(pem(ca_cert))
    keystore = directory / "broker-keystore.pem"
    keystore.write_bytes(pem_key(key) + pem(cert) + pem(ca_cert))
    keystore.chmod(0o600)
    return Pki(ca_file, keystore)


@dataclass
class SecureBroker:
    """A running broker plus what clients need to reach its secured listeners."""

    broker: Any  # kafka_broker.Broker
    pki: Pki
    ssl_port: int
    sasl_ssl_port: int
    users: dict[str, str] = field(default_factory=dict)  # SCRAM user -> password

    @property
    def plaintext_bootstrap(self) -> str:
        return str(self.broker.bootstrap)

    @property
    def ssl_bootstrap(self) -> str:
        return f"127.0.0.1:{self.ssl_port}"

    @property
    def sasl_ssl_bootstrap(self) -> str:
        return f"127.0.0.1:{self.sasl_ssl_port}"


def start_secure_broker(
    kb: Any, directory: Path, users: dict[str, str], timeout: float = 90.0
) -> SecureBroker:
    """Start ``kb`` (the kafka_broker module) with SSL and SASL_SSL listeners and SCRAM users.

    Both SCRAM mechanisms are enabled on SASL_SSL and every user gets credentials for both.
    """
    pki = make_pki(directory / "pki")
    tls = {"ssl.keystore.type": "PEM", "ssl.keystore.location": str(pki.keystore_file)}
    jaas = "org.apache.kafka.common.security.scram.ScramLoginModule required;"
    sasl = {
        **tls,
        "sasl.enabled.mechanisms": ",".join(SCRAM_MECHANISMS),
        **{f"{m.lower()}.sasl.jaas.config": jaas for m in SCRAM_MECHANISMS},
    }
    ssl_port = kb.free_port()
    sasl_port = kb.free_port()
    while sasl_port == ssl_port:
        sasl_port = kb.free_port()
    format_args: list[str] = []
    for user, password in users.items():
        for m in SCRAM_MECHANISMS:
            format_args += ["--add-scram", f"{m}=[name={user},password={password}]"]
    broker = kb.start(
        directory / "broker",
        port=0,
        extra_listeners=[
            kb.Listener("SSL", ssl_port, "SSL", tls),
            kb.Listener("SASL_SSL", sasl_port, "SASL_SSL", sasl),
        ],
        format_args=format_args,
        timeout=timeout,
    )
    return SecureBroker(broker, pki, ssl_port, sasl_port, dict(users))
