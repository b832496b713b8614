"""The state topic's MAC: every state record carries an HMAC-SHA256 made with a key the operator
provides (``kafka.state_signing``), and a record whose MAC is missing or wrong is refused.

The MAC travels in the record's Kafka header ``rocewatch-mac``; the value is the checkpoint
itself (docs/formats/checkpoint.md), unchanged, so signing copies nothing. The header is ASCII::

    v1 <key id> <HMAC-SHA256, 64 hex digits>

and the MAC is made over the record's key as well as its value, so a record cannot be replayed
under another key (one domain's detect state as another's)::

    HMAC-SHA256(secret, "rocewatch-state-mac/v1" 0x00 | u32 BE len(key id) | key id
                        | u32 BE len(record key) | record key | value)

The key id says which key made the MAC: an instance writes with its ``key`` and reads records
of that key and of its ``read_keys``, so keys rotate without a record becoming unreadable.

>>> keys = StateKeys("k2", {"k2": b"n" * 32, "k1": b"o" * 32})
>>> headers = keys.sign(b"agg-0", b"state")
>>> keys.verify(b"agg-0", b"state", headers)
>>> keys.verify(b"agg-1", b"state", headers)
Traceback (most recent call last):
...
rocewatch.bus.signing.SignatureError: MAC does not match (key id 'k2')
>>> StateKeys("k1", {"k1": b"o" * 32}).verify(b"agg-0", b"state", headers)
Traceback (most recent call last):
...
rocewatch.bus.signing.SignatureError: signed with key id 'k2', which this instance does not read
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import re
import stat
import struct
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Protocol

from rocewatch.core.errors import BadInput, ConfigError

log = logging.getLogger(__name__)

HEADER = "rocewatch-mac"
VERSION = b"v1"
_DOMAIN = b"rocewatch-state-mac/v1\x00"
_LEN = struct.Struct(">I")
MIN_KEY_BYTES = 32  # HMAC-SHA256's own output size: a shorter key is the weak link
MAX_KEY_FILE_BYTES = 64 << 10  # a bigger file is not a key (a certificate bundle, say)
_HEADER_RE = re.compile(rb"v1 ([A-Za-z0-9._-]{1,64}) ([0-9a-f]{64})")


class KeyConfig(Protocol):
    """Where one key is (``rocewatch.config.StateKeyConfig``)."""

    @property
    def id(self) -> str: ...
    @property
    def file(self) -> str | None: ...
    @property
    def env(self) -> str | None: ...
    @property
    def given(self) -> bool: ...


class SigningConfig(Protocol):
    """The keys of the state topic's MAC (``rocewatch.config.StateSigningConfig``, the
    ``kafka.state_signing`` section)."""

    @property
    def key(self) -> KeyConfig: ...
    @property
    def read_keys(self) -> tuple[KeyConfig, ...]: ...


class SignatureError(BadInput):
    """A state record whose MAC is missing, malformed, made with a key this instance does not
    read, or wrong: nothing of it is used (the stage counts it and starts from its committed
    offsets, as for a damaged checkpoint)."""


class StateKeys:
    """The keys of the state topic's MAC: one that writes (``write_id``), every one that reads.

    The secrets stay in here: ``repr`` and ``str`` show the key ids only."""

    __slots__ = ("_secrets", "write_id")

    def __init__(self, write_id: str, secrets: Mapping[str, bytes]) -> None:
        if write_id not in secrets:
            raise ValueError(f"no secret for the write key {write_id!r}")
        self.write_id = write_id
        self._secrets = dict(secrets)

    @property
    def read_ids(self) -> list[str]:
        return sorted(self._secrets)

    def __repr__(self) -> str:
        return f"StateKeys(write={self.write_id!r}, read={self.read_ids!r})"

    __str__ = __repr__

    def __reduce__(self) -> tuple[object, ...]:  # never written anywhere, least of all pickled
        raise TypeError("StateKeys holds secrets and is not serialisable")

    @staticmethod
    def _mac(secret: bytes, key_id: bytes, record_key: bytes, value: bytes | memoryview) -> str:
        h = hmac.new(secret, digestmod=hashlib.sha256)
        h.update(_DOMAIN + _LEN.pack(len(key_id)) + key_id + _LEN.pack(len(record_key)))
        h.update(record_key)
        h.update(value)  # (hashlib leaves the GIL to other threads over a large value)
        return h.hexdigest()

    def sign(self, record_key: bytes, value: bytes | memoryview) -> list[tuple[str, bytes]]:
        """The Kafka headers that carry the record's MAC (made with the write key)."""
        kid = self.write_id.encode()
        mac = self._mac(self._secrets[self.write_id], kid, record_key, value)
        return [(HEADER, b"%s %s %s" % (VERSION, kid, mac.encode()))]

    def verify(
        self,
        record_key: bytes | None,
        value: bytes | memoryview,
        headers: Iterable[tuple[str, bytes | None]] | None,
    ) -> None:
        """Nothing if the record's MAC is right; ``SignatureError`` saying why if not."""
        macs = [v for k, v in headers or () if k == HEADER]
        if not macs:
            raise SignatureError("no MAC (an unsigned record)")
        if len(macs) > 1 or macs[0] is None:
            raise SignatureError("a malformed MAC header")
        m = _HEADER_RE.fullmatch(bytes(macs[0]))
        if m is None:
            raise SignatureError("a malformed MAC header")
        kid = m.group(1).decode()
        secret = self._secrets.get(kid)
        if secret is None:
            raise SignatureError(f"signed with key id {kid!r}, which this instance does not read")
        want = self._mac(secret, m.group(1), record_key or b"", value)
        if not hmac.compare_digest(want.encode(), m.group(2)):
            raise SignatureError(f"MAC does not match (key id {kid!r})")


def load_state_keys(cfg: SigningConfig, where: str = "kafka.state_signing") -> StateKeys:
    """The keys ``cfg`` names, read and checked (``ConfigError`` with one line if one cannot
    be used). ``rocewatch detect`` calls it before it touches Kafka: without a key it does
    not start."""
    if not cfg.key.given:
        raise ConfigError(
            f"{where}.key is not set: rocewatch detect signs its state records and reads only "
            "signed ones; give it a key of at least 32 bytes in a file or an environment "
            "variable (docs/operations.md, State topic keys)"
        )
    secrets: dict[str, bytes] = {}
    named = [(cfg.key, f"{where}.key")]
    named += [(k, f"{where}.read_keys[{i}]") for i, k in enumerate(cfg.read_keys)]
    for k, at in named:
        if k.id in secrets:
            raise ConfigError(f"{at}.id: {k.id!r} names two keys")
        secrets[k.id] = _secret(k, at)
    if len(set(secrets.values())) < len(secrets):  # harmless, but likely a copy-paste slip
        log.warning("%s: two key ids have the same key", where)
    return StateKeys(cfg.key.id, secrets)


def _secret(k: KeyConfig, at: str) -> bytes:
    """One key's bytes (never in a message: only its length)."""
    if k.env is not None:
        text = os.environ.get(k.env)
        if text is None:
            raise ConfigError(f"{at}.env: environment variable {_shown(k.env)} is not set")
        secret = text.encode()
        what = f"{at}.env ({_shown(k.env)})"
    else:
        assert k.file is not None
        path = Path(k.file)
        try:
            st = path.stat()
            if not stat.S_ISREG(st.st_mode):
                raise ConfigError(f"{at}.file: {path} is not a file")
            if st.st_size > MAX_KEY_FILE_BYTES:
                raise ConfigError(f"{at}.file: {path} is {st.st_size} bytes, not a key file")
            secret = path.read_bytes()
        except OSError as e:
            raise ConfigError(f"{at}.file: cannot read {path}: {e.strerror}") from e
        if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            log.warning("%s.file: %s is writable by others: they could replace the key", at, path)
        what = f"{at}.file ({path})"
    secret = secret.removesuffix(b"\n").removesuffix(b"\r")
    if len(secret) < MIN_KEY_BYTES:
        raise ConfigError(
            f"{what}: the key is {len(secret)} bytes, at least {MIN_KEY_BYTES} needed "
            "(openssl rand -hex 32 makes one)"
        )
    return secret


def _shown(name: str) -> str:
    """An environment variable's name for a message, unless it may be a key given by mistake
    (``env: ${NAME}`` puts the value where the name goes)."""
    if len(name) < MIN_KEY_BYTES:
        return name
    return "(a name of 32 characters or more: the key itself, given as ${NAME}?)"
