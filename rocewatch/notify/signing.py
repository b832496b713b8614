"""HMAC-SHA256 request signatures over a timestamp and the body.

The sender sets ``X-Rocewatch-Timestamp: <unix seconds>`` and
``X-Rocewatch-Signature: sha256=<hex>`` where the hex is
``HMAC-SHA256(secret, timestamp + "." + body)``. A receiver recomputes it with the shared secret,
compares in constant time and rejects timestamps far from its own clock (replays).

>>> ts, sig = sign(b"secret", b'{"a":1}', 1700000000)
>>> verify(b"secret", b'{"a":1}', ts, sig, now=1700000010)
True
>>> verify(b"secret", b'{"a":2}', ts, sig, now=1700000010)
False
"""

from __future__ import annotations

import hashlib
import hmac
import time


def signature(secret: bytes, body: bytes, timestamp: str) -> str:
    mac = hmac.new(secret, timestamp.encode() + b"." + body, hashlib.sha256)
    return "sha256=" + mac.hexdigest()


def sign(secret: bytes, body: bytes, now: float | None = None) -> tuple[str, str]:
    """(timestamp header value, signature header value) for a request body."""
    ts = str(int(time.time() if now is None else now))
    return ts, signature(secret, body, ts)


def verify(
    secret: bytes,
    body: bytes,
    timestamp: str,
    sig: str,
    now: float | None = None,
    tolerance_s: float = 300.0,
) -> bool:
    """True when ``sig`` signs ``timestamp`` + body and the timestamp is within tolerance."""
    try:
        ts = int(timestamp)
    except ValueError:
        return False
    if abs((time.time() if now is None else now) - ts) > tolerance_s:
        return False
    return hmac.compare_digest(signature(secret, body, timestamp), sig)
