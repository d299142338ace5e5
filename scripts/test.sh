#!/usr/bin/env bash
# berth's test command: installs what the tests need on Debian 12, then runs
# vet, a gofmt check and every test against real components (a private
# dbus-daemon, real BoltDB files, real Landlock, real processes).
#
#   scripts/test.sh [go test flags...]     e.g. scripts/test.sh -run E2E -v
#
# Runs as root: the tests switch users (the agent runs as nobody) and create
# network namespaces.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib.sh

if [ "$(id -u)" -ne 0 ]; then
  echo "scripts/test.sh must run as root (tests run agents as their own uids, mount workspace images and make cgroups)" >&2
  exit 1
fi
ensure_packages dbus-daemon:dbus systemd-socket-activate:systemd busctl:systemd curl:curl  # curl: tools reach the egress proxy in tests
ensure_packages mkfs.ext4:e2fsprogs losetup:mount prlimit:util-linux setpriv:util-linux ipcmk:util-linux  # workspace images, rlimits, SysV IPC probes
ensure_docker; ensure_packages busybox:busybox-static  # container tests: engine + static busybox for the agent image
# Cockpit page tests: Debian's Cockpit and Chromium (cockpit-ws lives in /usr/lib/cockpit).
ensure_packages chromium:chromium cockpit-bridge:cockpit-bridge
cockpit_missing=()
[ -x /usr/lib/cockpit/cockpit-ws ] || cockpit_missing+=(cockpit-ws)
[ -e /usr/share/cockpit/shell/manifest.json ] || cockpit_missing+=(cockpit-system)
if ((${#cockpit_missing[@]})); then
  echo "==> installing ${cockpit_missing[*]}" >&2
  DEBIAN_FRONTEND=noninteractive apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${cockpit_missing[@]}" >/dev/null
fi
echo "==> base image (berth-base:bookworm, debootstrapped once and cached)"
scripts/base-image.sh

echo "==> go vet"
go vet ./...
echo "==> gofmt"
unformatted=$(gofmt -l .)
if [ -n "$unformatted" ]; then
  echo "gofmt would change: $unformatted" >&2
  exit 1
fi
echo "==> go test"
export CI="${CI:-}"
go test -count=1 -timeout 20m "$@" ./...
echo "==> unit hardening (systemd-analyze security)"
scripts/check-unit-security.sh
echo "==> install test (.deb on real systemd, .rpm with rpm tools)"
scripts/install-test.sh
