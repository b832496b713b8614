#!/usr/bin/env bash
# Regenerate the Python code of the Kafka wire format from proto/.
set -euo pipefail
cd "$(dirname "$0")/.."
tmp=$(mktemp -d)
python -m grpc_tools.protoc -Iproto --python_out="$tmp" --pyi_out="$tmp" proto/rocewatch/v1/telemetry.proto
cp "$tmp"/rocewatch/v1/telemetry_pb2.py "$tmp"/rocewatch/v1/telemetry_pb2.pyi rocewatch/wire/
rm -rf "$tmp"
