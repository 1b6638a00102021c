#!/usr/bin/env bash
# Regenerate the checked-in Python code from the .proto files (needs grpcio-tools: ./dev test installs it).
# Run from the repository root as include path, so the generated modules import each other as dra.api.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PY:-.venv/bin/python}
"$PY" -m grpc_tools.protoc -I. --python_out=. --pyi_out=. --grpc_python_out=. \
    dra/api/dra.proto dra/api/pluginregistration.proto
