#!/usr/bin/env bash
# berth's test command: installs what the tests need on Debian 12, then runs
# vet, a gofmt check and every test against real components (a private
# dbus-daemon, real BoltDB files, real Landlock, real processes).
#
#   scripts/test.sh [go test flags...]     e.g. scripts/test.sh -run E2E -v
#   scripts/test.sh --install-only         only install what the tests use
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
if ! command -v go >/dev/null; then
  echo "scripts/test.sh needs Go $(sed -n 's/^go //p' go.mod) or later on PATH (Debian 12's golang is too old)" >&2
  exit 1
fi
# Everything the tests, scripts/check-unit-security.sh and
# scripts/install-test.sh use, installed in one go before any of them runs:
# a tool that arrives halfway (rpm did, with the install test) fails the
# tests before it. NEED:PACKAGE as ensure_packages takes them.
test_needs=(
  git:git /etc/ssl/certs/ca-certificates.crt:ca-certificates # go stamps builds from git; modules come over TLS
  dbus-daemon:dbus busctl:systemd systemd-socket-activate:systemd systemd-analyze:systemd # private buses, activation, unit hardening
  curl:curl /bin/ip:iproute2 pgrep:procps sleep:coreutils yes:coreutils # what agents run in tests (through the egress proxy, the network probes), a CPU hog
  mkfs.ext4:e2fsprogs losetup:mount mount:mount umount:mount # workspace images, a full disk
  prlimit:util-linux setpriv:util-linux ipcmk:util-linux unshare:util-linux nsenter:util-linux # rlimits, uids, SysV IPC, namespaces
  "${docker_needs[@]}" :busybox-static # container tests: the engine, and the static busybox of the agent image
  chromium:chromium cockpit-bridge:cockpit-bridge /usr/lib/cockpit/cockpit-ws:cockpit-ws # Cockpit page tests
  /usr/share/cockpit/shell/manifest.json:cockpit-system
  dpkg-deb:dpkg rpm:rpm # packaging tests inspect the .deb and the .rpm
  debootstrap:debootstrap dpkg-scanpackages:dpkg-dev # base image and install test: rootfs, local apt mirror
  ctr:containerd containerd:containerd runc:runc /usr/lib/cni/bridge:containernetworking-plugins # the test cluster (scripts/kube-cluster.sh)
  /usr/lib/cni/host-local:containernetworking-plugins /bin/busybox:busybox-static openssl:openssl jq:jq iptables:iptables flock:util-linux
)
ensure_packages "${test_needs[@]}"
if [ "${1:-}" = --install-only ]; then
  exit 0
fi
ensure_docker
echo "==> base image (berth-base:bookworm, debootstrapped once and cached)"
scripts/base-image.sh

echo "==> Kubernetes test cluster (binaries built once, cached under /var/cache/berth/kubernetes)"
scripts/kube-cluster.sh build
scripts/kube-cluster.sh up
trap 'scripts/kube-cluster.sh down' EXIT
export "$(scripts/kube-cluster.sh env)"

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
