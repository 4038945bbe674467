#!/usr/bin/env bash
# Regenerates the committed Python contracts under proto/src/horde from proto/horde/**/*.proto.
set -euo pipefail
cd "$(dirname "$0")"
find src/horde -name '*_pb2*.py*' -delete
python -m grpc_tools.protoc -I . --python_out=src --grpc_python_out=src --mypy_out=src \
  $(find horde -name '*.proto' | sort)
for d in $(find src/horde -mindepth 1 -type d -not -name __pycache__); do
  [ -f "$d/__init__.py" ] || : > "$d/__init__.py"
done
