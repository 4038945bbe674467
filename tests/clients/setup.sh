#!/usr/bin/env bash
# What make test-clients needs beyond the locked Python environment (the Python clients are in uv.lock's
# "clients" group): each part's own setup script, in order.
set -euo pipefail
cd "$(dirname "$0")"
for part in js; do
  [ -x "$part/setup.sh" ] && "$part/setup.sh"
done
