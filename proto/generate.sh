#!/usr/bin/env bash
# Regenerates the committed Python contracts under proto/src/horde from proto/horde/**/*.proto: messages and
# gRPC stubs (*_pb2.py, *_pb2_grpc.py) with their mypy-protobuf type stubs (*_pb2.pyi, *_pb2_grpc.pyi).
set -euo pipefail
cd "$(dirname "$0")"
find src/horde -name '*_pb2*.py*' -delete
python -m grpc_tools.protoc -I . --python_out=src --grpc_python_out=src --mypy_out=quiet:src --mypy_grpc_out=quiet:src \
  $(find horde -name '*.proto' | sort)
for d in $(find src/horde -mindepth 1 -type d -not -name __pycache__); do
  [ -f "$d/__init__.py" ] || : > "$d/__init__.py"
done
# PEP 561: without the marker mypy reads the installed package as untyped and ignores the stubs.
: > src/horde/py.typed
