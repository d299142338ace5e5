#!/usr/bin/env bash
# fresh-machine-check.sh: does the README's test command work on a machine
# where nothing was installed by hand? A container of berth-base:bookworm
# (debootstrap minbase: Debian 12's essential set and apt; built by
# scripts/base-image.sh) gets a clone of this repository's HEAD and this
# machine's Go (bind-mounted read-only: Debian's golang is too old), runs
# `scripts/test.sh --install-only` against Debian's archive through this
# machine's apt sources, and then, with CI=true so that a missing tool fails
# a test instead of skipping it, the tests that use those tools and can run
# in a container (Go's modules come from this machine's module cache):
#
#   packaging (dpkg-deb, rpm; git for the version), internal/version (git),
#   internal/testkit/testbus, services/intake's busctl test and internal/ctl's bus
#   tests (dbus-daemon, busctl), agent/tools (sh, pgrep), the unit hardening
#   check (systemd-analyze security --offline).
#
# With --privileged the container gets CAP_SYS_ADMIN and CAP_NET_ADMIN and
# no seccomp or AppArmor profile (not docker's --privileged: an engine that
# itself runs in a container may not grant every capability), so Landlock,
# namespaces and seccomp filters work, and agent/egress (curl through the
# proxy) runs too.
#
# Never here: e2e (its runs need a writable cgroup or systemd: "confinement
# failed"; its Cockpit page tests do get cockpit-ws, the bridge and Chromium
# working), isolation/workspace (loop devices are the host's), the tests
# that need a Docker engine (isolation/container, imagectl, services/images,
# the container tests of agent, internal/ctl, packaging and e2e; a nested
# dockerd is not what the test command meets) or systemd as PID 1 (scripts/install-test.sh, the systemd-unit tests of
# isolation/hostrun). scripts/test.sh runs those on the machine itself.
#
#   scripts/fresh-machine-check.sh [--worktree] [--privileged] [--keep]
#
# --worktree copies the working tree's files over the clone (uncommitted
# edits included); --keep keeps the container (docker exec -it NAME bash).
# Go's build cache is kept in /var/cache/berth-fresh-machine/go-build
# between runs (it holds no tools; remove it for a cold run). Needs root and
# Docker; takes about 10 minutes on a quiet machine with that cache (apt's
# install about 4 of them), 20 more with a cold cache under load. Not part
# of CI (too slow); rerun it when scripts/test.sh's package list or a
# test's tools change.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib.sh

worktree= privileged= keep=
while (($#)); do
  case $1 in
    --worktree) worktree=1 ;;
    --privileged) privileged=1 ;;
    --keep) keep=1 ;;
    -h | --help) sed -n '2,40p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "unknown argument: $1" >&2; exit 2 ;;
  esac
  shift
done

if [ "$(id -u)" -ne 0 ]; then
  echo "scripts/fresh-machine-check.sh must run as root (docker, the base image)" >&2
  exit 1
fi
goroot=$(go env GOROOT) || { echo "cannot find Go: it is bind-mounted into the container" >&2; exit 1; }
# The container gets Go's modules from this machine's module cache, as a
# file proxy: the tools are the question here, and not every network lets a
# container reach the module proxy.
modules=$(go env GOMODCACHE)/cache/download
go mod download >/dev/null 2>&1 || { echo "cannot download the modules into $modules" >&2; exit 1; }
ensure_docker
scripts/base-image.sh >/dev/null

started=$SECONDS
go_cache=/var/cache/berth-fresh-machine/go-build
mkdir -p "$go_cache"
work=$(mktemp -d /tmp/berth-fresh-machine.XXXXXX)
container=berth-fresh-machine-$$
cleanup() {
  if [ -n "$keep" ]; then
    echo "kept container $container (docker exec -it $container bash); remove it with: docker rm -f $container; rm -rf $work"
    return
  fi
  docker rm -f "$container" >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT

echo "==> clone $(git rev-parse --short HEAD)${worktree:+ with the files of the working tree}"
git clone -q --no-hardlinks . "$work/berth"
if [ -n "$worktree" ]; then
  git ls-files -z --cached --others --exclude-standard | while IFS= read -r -d '' f; do
    [ -e "$f" ] && printf '%s\0' "$f"
  done | tar --null -T - -cf - | tar -C "$work/berth" -xf -
fi

# The base image knows only bookworm's main suite; this machine's sources
# (with updates and security) are what a fresh install would be set up with.
mkdir -p "$work/apt"
for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources; do
  [ -f "$f" ] && cp "$f" "$work/apt/"
done

# The tests that can run here; see the comment at the top.
tests=(
  "./packaging -run ^(TestPackages|TestCockpitPackage|TestThePackageVersionIsTheCheckoutsGitVersion)$"
  "./internal/version ./internal/testkit/testbus ./agent/tools"
  "./services/intake -run ^TestBusctlIntrospect"
  "./internal/ctl -run ^(TestRuns|TestStatus|TestSandboxExplainShowsTheSchedulersOwnPlanAndWhy|TestSandboxExplainJSON)"
)
if [ -n "$privileged" ]; then
  tests+=(
    "./agent/egress"
  )
fi
printf '%s\n' "${tests[@]}" >"$work/tests"

cat >"$work/inside.sh" <<'EOF'
set -euo pipefail
if [ -n "$(ls /run/host-apt)" ]; then
  rm -rf /etc/apt/sources.list /etc/apt/sources.list.d
  mkdir -p /etc/apt/sources.list.d
  for f in /run/host-apt/*; do
    case $f in
      */sources.list) cp "$f" /etc/apt/sources.list ;;
      *) cp "$f" /etc/apt/sources.list.d/ ;;
    esac
  done
fi
cd /src/berth
t0=$SECONDS
echo "==> scripts/test.sh --install-only"
scripts/test.sh --install-only
echo "    installed in $((SECONDS - t0))s"
t0=$SECONDS
echo "==> unit hardening (systemd-analyze security --offline)"
scripts/check-unit-security.sh
failed=()
while IFS= read -r line; do
  echo "==> CI=true go test $line"
  t1=$SECONDS
  # shellcheck disable=SC2086 # each line is package paths and flags
  CI=true go test -count=1 -timeout 30m $line || failed+=("$line")
  echo "    $((SECONDS - t1))s"
done </run/tests
echo "    tests took $((SECONDS - t0))s"
if ((${#failed[@]})); then
  printf 'FAIL: %s\n' "${failed[@]}" >&2
  exit 1
fi
EOF

privileged_flags=()
[ -z "$privileged" ] || privileged_flags=(--cap-add SYS_ADMIN --cap-add NET_ADMIN
  --security-opt seccomp=unconfined --security-opt apparmor=unconfined --cgroupns=private)
echo "==> fresh Debian 12 container $container (berth-base:bookworm${privileged:+, privileged})"
status=0
docker run --name "$container" "${privileged_flags[@]}" \
  -v "$work/berth:/src/berth" -v "$work/apt:/run/host-apt:ro" -v "$work/tests:/run/tests:ro" \
  -v "$work/inside.sh:/run/inside.sh:ro" -v "$goroot:/usr/local/go:ro" -v "$modules:/run/host-modules:ro" \
  -e GOPROXY=file:///run/host-modules -e GOSUMDB=off -v "$go_cache:/root/.cache/go-build" \
  -e PATH=/usr/local/go/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
  berth-base:bookworm bash /run/inside.sh || status=$?
if ((status)); then
  echo "FAIL: the fresh machine check failed after $((SECONDS - started))s" >&2
  exit "$status"
fi
echo "fresh machine check passed in $((SECONDS - started))s"
