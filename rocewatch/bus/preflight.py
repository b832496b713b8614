"""A start-up check of the connection to Kafka: TLS and SASL problems as one clear error.

kafka-python retries a failed TLS handshake or a rejected password until its bootstrap timeout
and then reports only "Unable to bootstrap". Before rocewatch's clients start, :func:`preflight`
opens one connection to a bootstrap server the way they will (TLS with the configured CA and
hostname check; SASL PLAIN or SCRAM with the configured user) and raises at once, naming the
broker, when the broker's certificate is not trusted or the credentials are refused.
A broker that cannot be reached at all is not an error here: the clients retry it.

The password is sent only inside the SCRAM proof (or PLAIN over TLS) and never appears in an
error message or log line.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import logging
import secrets
import socket
import ssl
import struct
from typing import Any

from rocewatch.bus.config import KafkaConfig
from rocewatch.core.errors import PermanentError

log = logging.getLogger(__name__)

_SASL_HANDSHAKE = 17
_SASL_AUTHENTICATE = 36
_UNSUPPORTED_SASL_MECHANISM = 33
_SCRAM_HASHES = {"SCRAM-SHA-256": "sha256", "SCRAM-SHA-512": "sha512"}


class KafkaTlsError(PermanentError):
    """The TLS handshake with a broker failed (untrusted certificate, wrong name, not TLS)."""


class KafkaAuthError(PermanentError):
    """The broker refused the SASL mechanism or the credentials."""


def tls_context(k: KafkaConfig) -> ssl.SSLContext:
    """The client TLS context kafka-python builds from the same settings."""
    ctx = ssl.create_default_context(cafile=k.ssl_cafile)
    ctx.check_hostname = k.ssl_check_hostname
    if k.ssl_certfile:
        ctx.load_cert_chain(k.ssl_certfile, k.ssl_keyfile)
    return ctx


def preflight(k: KafkaConfig, timeout: float = 10.0) -> None:
    """Check TLS and SASL against the first reachable bootstrap server.

    Raises KafkaTlsError or KafkaAuthError with the broker's address and the reason; returns
    quietly for PLAINTEXT, for mechanisms it cannot try (GSSAPI, OAUTHBEARER) and when no
    server answers.
    """
    proto = k.security_protocol
    if proto == "PLAINTEXT":
        return
    for server in k.bootstrap_servers.split(","):
        host, _, port_s = server.strip().rpartition(":")
        host = host.strip("[]") or "localhost"
        try:
            port = int(port_s)
        except ValueError:
            continue
        try:
            sock = socket.create_connection((host, port), timeout=timeout)
        except OSError as e:
            log.info("kafka preflight: %s:%d not reachable (%s)", host, port, e.strerror or e)
            continue
        try:
            sock.settimeout(timeout)
            if proto in ("SSL", "SASL_SSL"):
                sock = _tls(sock, k, host, port)
            if proto.startswith("SASL"):
                _sasl(sock, k, host, port)
        except (OSError, EOFError, struct.error) as e:  # reset, timeout: not a verdict
            log.info("kafka preflight: %s:%d: %s", host, port, e)
            continue
        finally:
            sock.close()
        log.info("kafka preflight: %s:%d accepts this client (%s)", host, port, proto)
        return


def _tls(sock: socket.socket, k: KafkaConfig, host: str, port: int) -> ssl.SSLSocket:
    try:
        ctx = tls_context(k)
    except (OSError, ssl.SSLError) as e:
        raise KafkaTlsError(f"cannot load the Kafka TLS files (kafka.ssl_*): {e}") from e
    try:
        return ctx.wrap_socket(sock, server_hostname=host)
    except ssl.SSLCertVerificationError as e:
        ca = k.ssl_cafile or "the system's CA store"
        raise KafkaTlsError(
            f"TLS handshake with Kafka broker {host}:{port} failed: the broker's certificate "
            f"is not trusted ({e.verify_message}); kafka.ssl_cafile: {ca}"
        ) from e
    except ssl.SSLError as e:
        raise KafkaTlsError(
            f"TLS handshake with Kafka broker {host}:{port} failed: {e.reason or e} "
            f"(is {host}:{port} a TLS listener?)"
        ) from e


def _request(sock: socket.socket, api_key: int, version: int, corr: int, body: bytes) -> bytes:
    client_id = b"rocewatch-preflight"
    header = struct.pack(">hhih", api_key, version, corr, len(client_id)) + client_id
    msg = header + body
    sock.sendall(struct.pack(">i", len(msg)) + msg)
    (size,) = struct.unpack(">i", _recv(sock, 4))
    resp = _recv(sock, size)
    (got,) = struct.unpack(">i", resp[:4])
    if got != corr:
        raise EOFError(f"correlation id {got}, expected {corr}")
    return resp[4:]


def _recv(sock: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise EOFError("connection closed by the broker")
        buf += chunk
    return buf


def _str(s: str) -> bytes:
    b = s.encode()
    return struct.pack(">h", len(b)) + b


def _sasl(sock: socket.socket, k: KafkaConfig, host: str, port: int) -> None:
    mech = (k.sasl_mechanism or "").upper()
    if mech not in ("PLAIN", *_SCRAM_HASHES):
        return
    resp = _request(sock, _SASL_HANDSHAKE, 1, 1, _str(mech))
    (err,) = struct.unpack(">h", resp[:2])
    if err == _UNSUPPORTED_SASL_MECHANISM:
        (n,) = struct.unpack(">i", resp[2:6])
        enabled, off = [], 6
        for _ in range(max(0, n)):
            (ln,) = struct.unpack(">h", resp[off : off + 2])
            enabled.append(resp[off + 2 : off + 2 + ln].decode())
            off += 2 + ln
        raise KafkaAuthError(
            f"Kafka broker {host}:{port} does not enable SASL mechanism {mech} "
            f"(it offers: {', '.join(enabled) or 'none'}); set kafka.sasl_mechanism"
        )
    if err:
        raise KafkaAuthError(f"Kafka broker {host}:{port}: SASL handshake failed (error {err})")
    user = k.sasl_plain_username or ""
    password = k.password() or ""
    if mech == "PLAIN":
        _authenticate(sock, 2, f"\0{user}\0{password}".encode(), host, port, mech, user)
        return
    scram = _Scram(user, password, _SCRAM_HASHES[mech])
    server_first = _authenticate(sock, 2, scram.client_first(), host, port, mech, user)
    server_final = _authenticate(sock, 3, scram.client_final(server_first), host, port, mech, user)
    if not scram.verify_server(server_final):
        raise KafkaAuthError(
            f"Kafka broker {host}:{port} answered SCRAM with a wrong server signature "
            "(not the broker that holds this user's credentials?)"
        )


def _authenticate(
    sock: socket.socket, corr: int, data: bytes, host: str, port: int, mech: str, user: str
) -> bytes:
    resp = _request(sock, _SASL_AUTHENTICATE, 1, corr, struct.pack(">i", len(data)) + data)
    (err, mlen) = struct.unpack(">hh", resp[:4])
    off = 4
    message = ""
    if mlen >= 0:
        message = resp[off : off + mlen].decode(errors="replace")
        off += mlen
    if err:
        raise KafkaAuthError(
            f"Kafka broker {host}:{port} refused SASL {mech} authentication for user "
            f"{user!r}: {message or f'error {err}'}"
        )
    (alen,) = struct.unpack(">i", resp[off : off + 4])
    return resp[off + 4 : off + 4 + max(0, alen)]


class _Scram:
    """The client side of SCRAM (RFC 5802 / RFC 7677), no channel binding."""

    def __init__(self, user: str, password: str, hash_name: str) -> None:
        self.user = user.replace("=", "=3D").replace(",", "=2C")
        self.password = password.encode()
        self.hash_name = hash_name
        self.nonce = secrets.token_urlsafe(24)
        self.first_bare = f"n={self.user},r={self.nonce}"
        self.server_signature = b""

    def _hmac(self, key: bytes, msg: bytes) -> bytes:
        return hmac.new(key, msg, self.hash_name).digest()

    def client_first(self) -> bytes:
        return f"n,,{self.first_bare}".encode()

    def client_final(self, server_first: bytes) -> bytes:
        text = server_first.decode()
        attrs: dict[str, Any] = dict(x.split("=", 1) for x in text.split(",") if "=" in x)
        nonce = attrs.get("r", "")
        if not nonce.startswith(self.nonce):
            raise EOFError("SCRAM server nonce does not extend the client's")
        salt = base64.b64decode(attrs["s"])
        iterations = int(attrs["i"])
        salted = hashlib.pbkdf2_hmac(self.hash_name, self.password, salt, iterations)
        client_key = self._hmac(salted, b"Client Key")
        stored_key = hashlib.new(self.hash_name, client_key).digest()
        without_proof = f"c=biws,r={nonce}"
        auth_message = f"{self.first_bare},{text},{without_proof}".encode()
        signature = self._hmac(stored_key, auth_message)
        proof = bytes(a ^ b for a, b in zip(client_key, signature, strict=True))
        self.server_signature = self._hmac(self._hmac(salted, b"Server Key"), auth_message)
        return f"{without_proof},p={base64.b64encode(proof).decode()}".encode()

    def verify_server(self, server_final: bytes) -> bool:
        attrs = dict(x.split("=", 1) for x in server_final.decode().split(",") if "=" in x)
        got = base64.b64decode(attrs.get("v", ""))
        return hmac.compare_digest(got, self.server_signature)
