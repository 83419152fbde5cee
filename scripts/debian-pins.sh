#!/usr/bin/env bash
# Sourced by the scripts that install Debian packages: the versions the suite was last run with, on Debian 12
# (bookworm). `debian_pinned NAME...` prints NAME=VERSION for apt-get install when the mirror still serves that
# version, else NAME alone with a warning on stderr naming the pin and the candidate: Debian's mirror keeps only the
# newest build of each package in a release, so a security update removes the pinned one, and the replacement
# stays within the same upstream version (20.10.x, 3.4.x, 1.0.128). Refresh these lines after such an update.
declare -A DEBIAN_PINS=(
  [docker.io]=20.10.24+dfsg1-1+deb12u1+b6 # with containerd 1.6.20~ds1-1+deb12u3, runc 1.1.5+ds1-1+deb12u1
  [debootstrap]=1.0.128+nmu2+deb12u2      # builds the local base image (scripts/ensure-docker.sh)
  [etcd-server]=3.4.23-4+b4               # controller mode's etcd in the replication and security tests
  [nodejs]=18.20.4+dfsg-1~deb12u3         # runs the RocketMQ 4 JavaScript client (scripts/ensure-rocketmq-js.sh)
  [npm]=9.2.0~ds1-1                       # installs it from tests/remoting_js/package-lock.json
)

debian_pinned() {
  local name pin candidate
  for name in "$@"; do
    pin=${DEBIAN_PINS[$name]:-}
    if [ -n "$pin" ] && apt-cache show "$name=$pin" >/dev/null 2>&1; then
      echo "$name=$pin"
    else
      candidate=$(apt-cache policy "$name" 2>/dev/null | awk '$1 == "Candidate:" { print $2 }')
      echo "debian-pins: $name=${pin:-(none)} is not on the mirror; installing its candidate ${candidate:-(unknown)}" >&2
      echo "$name"
    fi
  done
}
