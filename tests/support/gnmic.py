"""gnmic (openconfig/gnmic) as a peer for tests and benchmarks: where the binary is, and gnmic
subscribing from a config file we write, with its log and outputs to read back.

Where gnmic comes from, in order (scripts/go_tools.sh looks the same way):

1. ``../shared/bin/gnmic`` beside the repository (gnmic 0.47.0 built from source, since the Go
   module proxy refuses the gnmic module); used only when its sha256 equals the one
   ``../shared/bin/README.md`` records, so a test never runs against an unknown binary;
2. ``gnmic`` on ``PATH``.

``need_gnmic()`` skips a test when neither is there, and fails it under CI (``CI`` set), where a
test that does not run must not pass for one that did.
"""

from __future__ import annotations

import functools
import hashlib
import os
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import yaml

ROOT = Path(__file__).resolve().parents[2]
SHARED_BIN = ROOT.parent / "shared" / "bin"


@dataclass(frozen=True)
class Found:
    path: Path | None
    why: str  # where it came from, or why there is none


def _recorded_sha256(readme: Path) -> str | None:
    """The sha256 that shared/bin/README.md records for gnmic (its ``## gnmic`` section)."""
    try:
        text = readme.read_text()
    except OSError:
        return None
    section = text.split("## gnmic", 1)[1] if "## gnmic" in text else text
    m = re.search(r"sha256:\s*`?([0-9a-f]{64})`?", section)
    return m.group(1) if m else None


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


@functools.lru_cache(maxsize=1)
def find_gnmic() -> Found:
    """The gnmic to run (see the module docstring), checked once per process."""
    shared = SHARED_BIN / "gnmic"
    problem = ""
    if shared.exists():
        want = _recorded_sha256(SHARED_BIN / "README.md")
        if want is None:
            problem = f"{shared}: no sha256 recorded in {SHARED_BIN / 'README.md'}"
        elif _sha256(shared) != want:
            problem = f"{shared}: sha256 differs from {SHARED_BIN / 'README.md'}; not used"
        elif not os.access(shared, os.X_OK):
            problem = f"{shared}: not executable"
        else:
            return Found(shared, f"{shared} (sha256 checked)")
    on_path = shutil.which("gnmic")
    if on_path:
        return Found(Path(on_path), f"{on_path} (PATH)")
    why = problem or f"no {shared} and no gnmic on PATH"
    return Found(None, why + " (see scripts/go_tools.sh)")


def ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def need_gnmic() -> Path:
    """The gnmic binary; skips the calling test without one (fails it under CI)."""
    import pytest

    found = find_gnmic()
    if found.path is None:
        msg = f"gnmic is not available: {found.why}"
        if ci():
            pytest.fail(f"{msg}; a CI run needs it", pytrace=False)
        pytest.skip(msg)
    return found.path


# --- gnmic subscribing ----------------------------------------------------------------------------


@dataclass
class Tls:
    ca: Path
    cert: Path | None = None
    key: Path | None = None


def subscriber_config(
    targets: Sequence[str],
    address: str,
    *,
    stream_mode: str = "sample",
    sample_interval_s: float = 1.0,
    paths: Sequence[str] = ("/",),
    events_file: Path | None = None,
    kafka: tuple[str, str] | None = None,
    tls: Tls | None = None,
    username: str | None = None,
    password: str | None = None,
    log_file: Path | None = None,
) -> dict[str, Any]:
    """A gnmic config: one subscription per target, event format to a file and/or Kafka.

    gnmic copies a subscription's ``target`` into the request's ``prefix.target`` as written (a
    template such as ``{{ .Name }}`` is not expanded there), and a gNMI gateway serving many
    switches answers a request naming none of them with nothing: so each target gets its own
    subscription naming it. ``kafka`` is (bootstrap, topic).
    """
    cfg: dict[str, Any] = {"encoding": "proto", "log": True}
    if log_file is not None:
        cfg["log-file"] = str(log_file)
    if tls is None:
        cfg["insecure"] = True
    else:
        cfg["tls-ca"] = str(tls.ca)
        if tls.cert is not None and tls.key is not None:
            cfg["tls-cert"], cfg["tls-key"] = str(tls.cert), str(tls.key)
    if username is not None:
        cfg["username"], cfg["password"] = username, password or ""
    # a stream the target ended is not taken again while a test reads what came (it would start
    # over and send everything twice); gnmic 0.47 takes the global retry, not a target's own
    cfg["retry"] = "600s"
    cfg["targets"] = {t: {"address": address, "subscriptions": [f"sub-{t}"]} for t in targets}
    sub: dict[str, Any] = {"paths": list(paths), "mode": "stream", "stream-mode": stream_mode}
    if stream_mode == "sample":
        sub["sample-interval"] = f"{round(sample_interval_s * 1000)}ms"
    cfg["subscriptions"] = {f"sub-{t}": {**sub, "target": t} for t in targets}
    outputs: dict[str, Any] = {}
    if events_file is not None:
        outputs["file"] = {"type": "file", "filename": str(events_file), "format": "event"}
    if kafka is not None:
        outputs["kafka"] = {
            "type": "kafka",
            "address": kafka[0],
            "topic": kafka[1],
            "format": "event",
            # keyed by target and subscription: one target's messages stay in one partition, in
            # order (unkeyed, sarama spreads them over the partitions at random)
            "insert-key": True,
            "max-retry": 5,
            "timeout": "10s",
            "recovery-wait-time": "1s",
        }
    cfg["outputs"] = outputs
    return cfg


@dataclass
class Subscriber:
    """gnmic ``subscribe`` running from ``config`` (see ``subscriber_config``)."""

    gnmic: Path
    config: dict[str, Any]
    workdir: Path
    proc: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    @property
    def log_file(self) -> Path:
        return Path(self.config.get("log-file") or self.workdir / "gnmic.log")

    def start(self) -> Subscriber:
        self.config.setdefault("log-file", str(self.workdir / "gnmic.log"))
        conf = self.workdir / "gnmic.yaml"
        conf.write_text(yaml.safe_dump(self.config, sort_keys=False))
        self.proc = subprocess.Popen(
            [str(self.gnmic), "--config", str(conf), "subscribe"],
            stdin=subprocess.DEVNULL,  # never a password prompt
            stdout=subprocess.DEVNULL,
            stderr=(self.workdir / "gnmic.stderr").open("wb"),
        )
        return self

    def log(self) -> str:
        try:
            return self.log_file.read_text(errors="replace")
        except OSError:
            return ""

    def ended(self) -> set[str]:
        """The targets whose stream the target ended (gnmic logs "closed stream (EOF)")."""
        out = set()
        for line in self.log().splitlines():
            if "closed stream (EOF)" in line:
                m = re.search(r"target=(\S+)", line)
                if m:
                    out.add(m.group(1).strip('"'))
        return out

    def wait(self, cond: Callable[[], bool], timeout: float, what: str) -> None:
        """Wait for ``cond``; an AssertionError with gnmic's log tail when it does not come."""
        end = time.monotonic() + timeout
        while not cond():
            if self.proc is not None and self.proc.poll() is not None:
                raise AssertionError(f"gnmic exited ({self.proc.returncode}):\n{self.tail()}")
            if time.monotonic() > end:
                raise AssertionError(f"gnmic: no {what} after {timeout:.0f} s:\n{self.tail()}")
            time.sleep(0.05)

    def tail(self, n: int = 25) -> str:
        err = (self.workdir / "gnmic.stderr").read_text(errors="replace")
        return "\n".join([*self.log().splitlines()[-n:], *err.splitlines()[-5:]])

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)

    def __enter__(self) -> Subscriber:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def event_lines(path: Path) -> list[bytes]:
    """The complete lines of a gnmic event file (a line still being written is left out)."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return []
    return data[: data.rfind(b"\n") + 1].splitlines()


def count_values(lines: Sequence[bytes]) -> int:
    """Updates in gnmic event lines: each line one JSON array of events (or one event)."""
    n = 0
    for line in lines:
        doc = orjson.loads(line)
        for ev in doc if isinstance(doc, list) else [doc]:
            n += len(ev.get("values") or {})
    return n
