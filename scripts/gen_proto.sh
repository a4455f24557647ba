#!/usr/bin/env bash
# Regenerates the checked-in gRPC stubs from client/tidemq/rpc/tidemq.proto.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-python3}
out=${1:-client}
$PY -m grpc_tools.protoc -Iclient --python_out="$out" --grpc_python_out="$out" client/tidemq/rpc/tidemq.proto
