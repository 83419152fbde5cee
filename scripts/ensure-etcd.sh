#!/usr/bin/env bash
# Installs etcd (Debian's etcd-server) when this machine has none: controller-mode replication tests and
# benchmarks start their own etcd on loopback ports in a temporary directory (broker/ha/etcd_process.py).
set -euo pipefail
if command -v etcd >/dev/null 2>&1; then
  exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
  echo "etcd is not installed and this user cannot install it: run 'apt-get install -y etcd-server' as root" >&2
  exit 1
fi
cd "$(dirname "$0")/.."
# shellcheck source=scripts/debian-pins.sh
. scripts/debian-pins.sh
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq "$(debian_pinned etcd-server)" >/dev/null
# The package may start a system etcd on the default ports; the tests use their own, on other ports.
command -v etcd >/dev/null
