"""Test-time certificates (``cryptography``): CAs, server certificates for 127.0.0.1 and
localhost, client certificates; shared by the gNMI and Kafka TLS tests."""

from __future__ import annotations

import datetime as dt
import ipaddress

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

Issuer = tuple[x509.Certificate, ec.EllipticCurvePrivateKey]


def new_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def issue(
    subject: str,
    key: ec.EllipticCurvePrivateKey,
    issuer: Issuer | None = None,
    *,
    ca: bool = False,
    server: bool = False,
    client: bool = False,
    dns: tuple[str, ...] = (),
    days: int = 1,
) -> x509.Certificate:
    """A certificate for ``key``: self-signed when ``issuer`` is None. A CA may sign leaf
    certificates only; a server certificate names 127.0.0.1 and localhost; ``dns`` adds
    names."""
    now = dt.datetime.now(dt.UTC)
    name = x509.Name(
        [x509.NameAttribute(NameOID.ORGANIZATION_NAME, "rocewatch tests"),
         x509.NameAttribute(NameOID.COMMON_NAME, subject)]
    )  # fmt: skip
    signer = issuer[1] if issuer else key
    b = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(issuer[0].subject if issuer else name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=0 if ca else None), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(signer.public_key()),
            critical=False,
        )
    )
    if ca:
        b = b.add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
    usages = [ExtendedKeyUsageOID.SERVER_AUTH] * server + [ExtendedKeyUsageOID.CLIENT_AUTH] * client
    if usages:
        b = b.add_extension(x509.ExtendedKeyUsage(usages), critical=False)
    alt: list[x509.GeneralName] = [x509.DNSName(d) for d in dns]
    if server:
        alt += [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]
    if alt:
        b = b.add_extension(x509.SubjectAlternativeName(alt), critical=False)
    return b.sign(signer, hashes.SHA256())


def pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
