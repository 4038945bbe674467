#!/usr/bin/env bash
# What the JS clients and the docs-rendering test need (make test-clients): the locked npm packages
# (package-lock.json: the OpenAI Node SDK, the Vercel AI SDK, zod, playwright-core) and a Chromium for
# playwright-core to drive (Debian's package, /usr/bin/chromium; playwright's own browser download is not used).
set -euo pipefail
cd "$(dirname "$0")"
npm ci --no-audit --no-fund --loglevel=error
if [ ! -x /usr/bin/chromium ]; then
  export DEBIAN_FRONTEND=noninteractive
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  # A fresh machine (or container) has no package lists yet: fetch them when the package is unknown.
  if ! apt-cache show chromium >/dev/null 2>&1; then
    $sudo apt-get update -qq
  fi
  $sudo apt-get install -y -qq --no-install-recommends chromium >/dev/null || {
    $sudo apt-get update -qq && $sudo apt-get install -y -qq --no-install-recommends chromium >/dev/null
  }
fi
