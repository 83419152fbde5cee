#!/usr/bin/env bash
# Installs the third-party RocketMQ 4 client the remoting tests drive (tests/unit/remoting/test_rocketmq4_js_client.py):
# ali-ons, pure JavaScript, at the exact versions of tests/remoting_js/package-lock.json, into
# tests/remoting_js/node_modules (not committed). Node.js and npm come from Debian (scripts/debian-pins.sh) when
# this machine has none; any Node.js from 14 on runs the client.
set -euo pipefail
cd "$(dirname "$0")/.."
dir=tests/remoting_js
if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "node and npm are not installed and this user cannot install them: run 'apt-get install -y nodejs npm' as root" >&2
    exit 1
  fi
  # shellcheck source=scripts/debian-pins.sh
  . scripts/debian-pins.sh
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  # shellcheck disable=SC2046 # one word per package
  apt-get install -y -qq $(debian_pinned nodejs npm) >/dev/null
fi
# npm ci leaves a copy of the lock it installed in node_modules: the same file means nothing to do.
if cmp -s "$dir/package-lock.json" "$dir/node_modules/.package-lock.json.installed" 2>/dev/null; then
  exit 0
fi
(cd "$dir" && npm ci --no-audit --no-fund --loglevel=error >/dev/null)
cp "$dir/package-lock.json" "$dir/node_modules/.package-lock.json.installed"
