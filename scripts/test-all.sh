#!/usr/bin/env bash
# Install what the tests need, start the real services they use, run the whole suite.
# This is README command (b) and what CI runs (.ci/run).
set -euo pipefail
cd "$(dirname "$0")/.."

step() { printf '\n== %s\n' "$*"; }

step "python dependencies"
python3 -m pip install --quiet --disable-pip-version-check -e '.[test]'

step "Apache Kafka broker jars (Maven Central, cached under ~/.cache/rocewatch)"
python3 scripts/kafka_broker.py fetch

step "lint and types"
python3 -m ruff check .
python3 -m mypy

step "tests (the Kafka fixture starts a real KRaft broker on 127.0.0.1)"
python3 -m pytest -p no:cacheprovider "$@"
