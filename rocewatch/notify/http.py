"""One JSON POST with the project's error classes (stdlib urllib: no extra dependency)."""

from __future__ import annotations

import datetime as dt
import email.utils
import time
import urllib.error
import urllib.request
from typing import Any

from rocewatch.core.errors import PermanentError, RetryableError
from rocewatch.notify.base import TlsConfig, redact_url

RETRYABLE_STATUS = {408, 425, 429}


class RetryLater(RetryableError):
    """A receiver that said when to come back (429 or 503 with ``Retry-After``)."""

    def __init__(self, message: str, retry_after_s: float) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


def retry_after_s(value: str | None, now: float) -> float | None:
    """Seconds a ``Retry-After`` header asks for (delay-seconds or an HTTP-date); None when
    absent or unreadable."""
    if not value:
        return None
    v = value.strip()
    if v.isdigit():
        return float(v)
    try:
        when = email.utils.parsedate_to_datetime(v)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:  # an HTTP-date is GMT
        when = when.replace(tzinfo=dt.UTC)
    return max(0.0, when.timestamp() - now)


def post_json(
    url: str,
    body: bytes,
    headers: dict[str, str],
    timeout_s: float,
    tls: TlsConfig | None = None,
) -> int:
    """POST ``body``; return the 2xx status or raise Retryable/PermanentError (no secrets in
    the message: the URL is redacted and headers are never echoed)."""
    req = urllib.request.Request(url, data=body, method="POST")
    req.add_header("Content-Type", "application/json")
    req.add_header("User-Agent", "rocewatch")
    for k, v in headers.items():
        req.add_header(k, v)
    kw: dict[str, Any] = {"timeout": timeout_s}
    if url.startswith("https:"):
        kw["context"] = (tls or TlsConfig()).context()
    where = redact_url(url)
    try:
        with urllib.request.urlopen(req, **kw) as resp:
            resp.read()
            return int(resp.status)
    except urllib.error.HTTPError as e:
        detail = e.read(300).decode("utf-8", "replace").strip().splitlines()
        msg = f"{where}: HTTP {e.code}" + (f": {detail[0]}" if detail else "")
        if e.code >= 500 or e.code in RETRYABLE_STATUS:
            after = retry_after_s(e.headers.get("Retry-After") if e.headers else None, time.time())
            if after is not None:
                raise RetryLater(f"{msg} (retry after {after:g} s)", after) from None
            raise RetryableError(msg) from None
        raise PermanentError(msg) from None
    except (urllib.error.URLError, OSError) as e:
        reason = getattr(e, "reason", e)
        raise RetryableError(f"{where}: {reason}") from None
