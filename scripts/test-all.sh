#!/usr/bin/env bash
# Install what the tests need, start the real services they use, run the whole suite.
# This is README command (b) and what CI runs (.ci/run).
set -euo pipefail
cd "$(dirname "$0")/.."

step() { printf '\n== %s\n' "$*"; }

step "python dependencies"
python3 -m pip install --quiet --disable-pip-version-check -e '.[test]'

step "PostgreSQL, slurmctld, slurmd, munge, etcd (Debian packages; installed only when missing)"
bash scripts/services.sh install

step "Apache Kafka broker jars (Maven Central, cached under ~/.cache/rocewatch)"
python3 scripts/kafka_broker.py fetch

step "Go tools: openconfig fake_server and gnmi_cli, kube-apiserver (built once, cached under ~/.cache/rocewatch/go)"
bash scripts/go_tools.sh

step "lint and types"
python3 -m ruff check .
python3 -m mypy
lint-imports --no-cache  # the layers contract (.importlinter): imports only go down

step "start PostgreSQL, munged and slurmctld (private, under ${ROCEWATCH_SERVICES_DIR:-/tmp/rocewatch-services})"
trap 'bash scripts/services.sh stop || true' EXIT
bash scripts/services.sh start
# shellcheck disable=SC1091  # ROCEWATCH_TEST_PG_URL, SLURM_CONF, ROCEWATCH_TEST_SLURM_NODES
source "${ROCEWATCH_SERVICES_DIR:-/tmp/rocewatch-services}/env.sh"

step "tests (the Kafka fixture starts a real KRaft broker on 127.0.0.1)"
# with CI set, a skipped test fails the run (tests/support/tiers.py): this command runs everything
export CI="${CI:-1}"
# --durations: the slowest tests named in every CI log (where the CI budget goes)
python3 -m pytest -p no:cacheprovider --durations=40 "$@"
