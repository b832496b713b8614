"""`rocewatch alerts | actions | approve | undrain`: operators' handles on the store.

Reads come straight from the store; approve, reject and undrain queue a command there, which
the detect service carries out within a second (``--wait`` shows what became of it).
"""

from __future__ import annotations

import getpass
import json
import sys
import time
from pathlib import Path
from typing import Any

from rocewatch.core.errors import ConfigError
from rocewatch.core.model import rfc3339


def open_store(config: Path | None, db: str | None) -> Any:
    from storage.store import Store

    url = db
    if url is None and config is not None:
        from rocewatch.config import load_config

        url = load_config(config).storage_url
    if not url:
        raise ConfigError("no store: give --db URL or --config with storage.url")
    store = Store(url)
    store.create_schema()
    return store


def cmd_alerts(config: Path | None, db: str | None, status: str | None, as_json: bool) -> int:
    with open_store(config, db) as store:
        alerts = store.alerts(status=status)
    if as_json:
        for a in alerts:
            print(json.dumps(a.to_json()))
        return 0
    for a in alerts:
        where = " ".join(
            f"{k}={v}" for k, v in sorted(a.labels.items()) if k not in ("alertname", "severity")
        )
        ends = f" -> {rfc3339(a.ends_at)}" if a.ends_at else ""
        # kept, not notified: an inhibit rule's source (its fingerprint) explains it
        muted = a.annotations.get("inhibited_by")
        why = f"  (inhibited by {muted})" if muted else ""
        print(
            f"{rfc3339(a.starts_at)}{ends}  {a.status:8} {a.labels.get('alertname', '?')}  "
            f"{where}{why}"
        )
    muted_n = sum(1 for a in alerts if a.annotations.get("inhibited_by"))
    print(f"{len(alerts)} alerts ({muted_n} inhibited)", file=sys.stderr)
    return 0


def cmd_actions(config: Path | None, db: str | None, node: str | None, as_json: bool) -> int:
    with open_store(config, db) as store:
        acts = [a for a in store.actions() if node is None or a.node == node]
    for a in acts:
        if as_json:
            print(json.dumps(a.to_json()))
        else:
            print(f"{rfc3339(a.time)}  {a.action:6} {a.node:16} {a.outcome:28} {a.reason}")
    if not as_json:
        print(f"{len(acts)} actions", file=sys.stderr)
    return 0


def cmd_command(
    config: Path | None, db: str | None, command: str, node: str | None, wait_s: float
) -> int:
    from actions.operator import pending_approvals

    with open_store(config, db) as store:
        if node is None:  # rocewatch approve: list what waits
            waiting = pending_approvals(store.actions())
            for a in waiting:
                print(f"{a.node:16} waiting since {rfc3339(a.time)}: {a.reason}")
            if not waiting:
                print("no drain waits for approval")
            return 0
        cid = store.add_command(command, node, f"cli:{_user()}")
        print(f"{command} {node}: queued as command {cid}")
        deadline = time.monotonic() + wait_s
        while wait_s > 0:
            row = store.commands(ids=[cid])[0]
            if row["status"] != "pending":
                print(f"{row['status']}: {row['result']}")
                return 0 if row["status"] == "done" else 1
            if time.monotonic() >= deadline:
                print(f"not carried out within {wait_s:g} s: is `rocewatch detect` running?")
                return 3
            time.sleep(0.2)
    return 0


def _user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return "unknown"
