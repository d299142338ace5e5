#!/usr/bin/env bash
# The install test: builds the .deb and .rpm, boots real systemd (PID 1) in a
# container made from a debootstrapped Debian 12 rootfs, installs the .deb
# with apt and checks that berth installs, runs, upgrades and purges like a
# Linux service should. The .rpm is checked with rpm's own tools.
#
#   scripts/install-test.sh            (as root; scripts/test.sh runs it)
#
# The rootfs comes from Debian's packages through the apt mirror this machine
# is configured with, and is cached in /var/cache/berth-install-test (and as
# a local Docker image) between runs; the first run takes about a minute
# longer. BERTH_INSTALL_TEST_KEEP=1 keeps the container for a look inside.
#
# Its last step before the purge installs berth-cockpit with Debian's Cockpit
# (downloaded on the host with apt-get download into the same cache: the
# container has no network), hands the container the host's Docker engine
# (mounted from the start, linked to /run/docker.sock only then) and drives
# the host's Chromium, headless, in the container's network namespace
# through Cockpit's login and berth's page (installprobe cockpit). The
# screenshots land in $BERTH_INSTALL_TEST_ARTIFACTS (default
# /var/tmp/berth-install-test-artifacts). BERTH_INSTALL_TEST_ONLY=cockpit
# installs berth and runs only that step; BERTH_INSTALL_TEST_ONLY=schedules
# the step of scheduled jobs (systemd timers), BERTH_INSTALL_TEST_ONLY=sandboxes
# that of conversation sandboxes (berth-sandbox units), both just before the purge.
#
# After it, with the host's engine still the container's, an agent with
# image_config packages = ["jq"] gets its image through `berthctl container
# build` (the installed berth-imaged, D-Bus-activated by the container's
# systemd) and a message runs `jq --version` in its container. The
# container has no network, as a server without Debian's mirror: its apt
# points at a local flat mirror (copy:) that the host fills with exactly
# the .debs jq needs beyond berth-base:bookworm, and berth-imaged fetches
# from it with that apt, as it would through any mirror or proxy. The
# engine is the host's, so the paths it binds into a run's container must be
# the host's too: one host directory is bound at the same path into the
# systemd container and holds that agent's workspace. berth-base:bookworm
# comes from scripts/base-image.sh (run here when missing; it is cached).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib.sh

if [ "$(id -u)" -ne 0 ]; then
  echo "scripts/install-test.sh must run as root (debootstrap, docker)" >&2
  exit 1
fi
started=$SECONDS
ensure_packages debootstrap:debootstrap rpm:rpm dpkg-deb:dpkg chromium:chromium nsenter:util-linux dpkg-scanpackages:dpkg-dev
ensure_docker
bash scripts/base-image.sh >/dev/null

cache=/var/cache/berth-install-test
suite=bookworm
include=systemd,systemd-sysv,dbus,procps,apt
image=berth-install-test:$suite-$(printf '%s' "$include" | sha256sum | cut -c1-12)
work=$(mktemp -d /tmp/berth-install-test.XXXXXX)
container=berth-install-test-$$
artifacts=${BERTH_INSTALL_TEST_ARTIFACTS:-/var/tmp/berth-install-test-artifacts}
# engine_dir is bound at the same path into the container: what a container
# run binds from it (its workspace) is where the host's engine looks. No
# "berth" in its name: the purge check looks for such names.
engine_dir=/var/lib/install-test-engine/$$
# The images the jq step builds on the host's engine, removed at the end.
built_images=()

step() { echo "==> $*"; }
fail() {
  echo "FAIL: $*" >&2
  if docker inspect "$container" >/dev/null 2>&1; then
    echo "--- journal (last 80 lines) ---" >&2
    docker exec "$container" journalctl --no-pager -n 80 >&2 || true
  fi
  exit 1
}
cleanup() {
  if [ -z "${BERTH_INSTALL_TEST_KEEP:-}" ]; then
    docker rm -f "$container" >/dev/null 2>&1 || true
  else
    echo "kept container $container (docker exec -it $container bash)"
  fi
  if ((${#built_images[@]})); then
    docker rmi "${built_images[@]}" >/dev/null 2>&1 || true
  fi
  [ -n "${BERTH_INSTALL_TEST_KEEP:-}" ] || rm -rf "$engine_dir"
  rmdir /var/lib/install-test-engine 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

# inside CMD: run a shell command line in the container.
inside() { docker exec "$container" bash -c "$*"; }

apt_mirror() {
  local uri
  uri=$(awk '/^URIs:/ && !done { print $2; done=1 }' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)
  if [ -z "$uri" ]; then
    uri=$(awk '$1 == "deb" && $3 ~ /^bookworm$/ { print $2; exit }' /etc/apt/sources.list 2>/dev/null || true)
  fi
  [ -n "$uri" ] || { echo "cannot find a Debian mirror in /etc/apt/sources.list*" >&2; return 1; }
  printf '%s\n' "$uri"
}

ensure_image() {
  if docker image inspect "$image" >/dev/null 2>&1; then
    return 0
  fi
  mkdir -p "$cache"
  local tarball=$cache/$suite-$(printf '%s' "$include" | sha256sum | cut -c1-12).tar
  if [ ! -s "$tarball" ]; then
    local mirror rootfs=$cache/rootfs.tmp
    mirror=$(apt_mirror)
    step "debootstrap $suite ($include) from the configured mirror"
    rm -rf "$rootfs"
    debootstrap --variant=minbase --include="$include" "$suite" "$rootfs" "$mirror" >"$cache/debootstrap.log" 2>&1 ||
      { tail -20 "$cache/debootstrap.log" >&2; return 1; }
    tar -C "$rootfs" -cf "$tarball.tmp" . && mv "$tarball.tmp" "$tarball"
    rm -rf "$rootfs"
  fi
  step "docker import $image"
  docker import "$tarball" "$image" >/dev/null
}

step "build packages"
version=$(cd packaging && go run . --out "$work/dist" | tee "$work/built" | sed -n 's/.*berth_\(.*\)-1_.*\.deb$/\1/p')
deb=$(grep '/berth_[^/]*\.deb$' "$work/built")
cockpit_deb=$(grep '/berth-cockpit_[^/]*\.deb$' "$work/built")
rpm=$(grep '/berth-[0-9][^/]*\.rpm$' "$work/built")
cockpit_rpm=$(grep '/berth-cockpit-[0-9][^/]*\.rpm$' "$work/built")
# The same binaries as an older version, to test the upgrade.
(cd packaging && go run . --out "$work/old" --version 0.0.0~installtest --formats deb >/dev/null)
olddeb=$(ls "$work"/old/berth_*.deb)
CGO_ENABLED=0 go build -o "$work/installprobe" ./scripts/installprobe
echo "    berth $version"

step "rpm: contents, config files, dependencies and scripts"
rpm_list=$(rpm -qlp "$rpm" 2>/dev/null)
for f in /usr/bin/berthctl /usr/libexec/berth/berth-agent /usr/libexec/berth/berth-intake /usr/libexec/berth/berth-scheduler \
  /usr/lib/systemd/system/berth-intake.socket /usr/lib/systemd/system/berth-scheduler.service \
  /usr/share/dbus-1/system.d/dev.berth.Scheduler1.conf /usr/share/dbus-1/system-services/dev.berth.Intake1.service \
  /usr/share/dbus-1/interfaces/dev.berth.Scheduler1.xml /usr/lib/sysusers.d/berth.conf /usr/lib/tmpfiles.d/berth.conf \
  /usr/lib/systemd/system-preset/80-berth.preset /usr/share/man/man1/berthctl.1 /usr/share/man/man5/berth.toml.5 \
  /etc/berth/berth.toml; do
  grep -qx "$f" <<<"$rpm_list" || fail "rpm does not contain $f"
done
[ "$(rpm -qcp "$rpm" 2>/dev/null)" = /etc/berth/berth.toml ] || fail "rpm config files: $(rpm -qcp "$rpm")"
grep -q '^cn /etc/berth/berth.toml$' <<<"$(rpm -qp --qf '[%{FILEFLAGS:fflags} %{FILENAMES}\n]' "$rpm" 2>/dev/null)" ||
  fail "berth.toml is not %config(noreplace) in the rpm"
rpm_requires=$(rpm -qpR "$rpm" 2>/dev/null)
grep -qx dbus <<<"$rpm_requires" && grep -qx systemd <<<"$rpm_requires" || fail "rpm requires: $rpm_requires"
grep -q docker-ce <<<"$(rpm -qp --recommends "$rpm" 2>/dev/null)" || fail "rpm does not recommend docker"
grep -qx /usr/share/cockpit/berth/manifest.json <<<"$(rpm -qlp "$cockpit_rpm" 2>/dev/null)" || fail "berth-cockpit.rpm has no page"
grep -q cockpit <<<"$(rpm -qpR "$rpm" 2>/dev/null)" && fail "berth.rpm requires Cockpit"
rpm_scripts=$(rpm --scripts -qp "$rpm" 2>/dev/null)
for want in 'preinstall scriptlet' 'systemd-sysusers --replace=/usr/lib/sysusers.d/berth.conf' 'u berth-agent' \
  'systemctl --no-reload preset berth-intake.socket berth-scheduler.service' \
  'preuninstall scriptlet' 'disable --now' 'postuninstall scriptlet' 'try-restart berth-intake.service berth-scheduler.service'; do
  grep -qF -- "$want" <<<"$rpm_scripts" || fail "rpm scripts lack: $want"
done

# cockpit_debs: puts the .debs that berth-cockpit needs (Debian's
# cockpit-ws, cockpit-bridge, cockpit-system and what they pull in; and
# busybox-static, which berth-imaged puts into the default image) into the
# container's apt archive cache, so that apt installs them with no network.
# apt in the container resolves them against the host's package lists; the
# host downloads what its cache lacks.
cockpit_debs() {
  local debs=$cache/debs want missing=() pkg file attempt
  mkdir -p "$debs"
  [ -n "$(ls /var/lib/apt/lists/*_Packages* 2>/dev/null)" ] || apt-get update -qq
  for attempt in 1 2; do
    inside 'rm -f /etc/apt/sources.list && rm -rf /etc/apt/sources.list.d && mkdir -p /etc/apt/sources.list.d'
    for file in /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources; do
      [ -f "$file" ] && docker cp "$file" "$container:$file"
    done
    tar -C /var/lib/apt/lists --exclude=./lock --exclude=./partial --exclude=./auxfiles -cf - . | docker exec -i "$container" tar -C /var/lib/apt/lists -xf -
    want=$(inside 'apt-get install -s -q --no-install-recommends cockpit-ws cockpit-bridge cockpit-system busybox-static /root/berth-cockpit.deb' |
      awk '/^Inst / && $2 != "berth-cockpit" { v = $3; if (v ~ /^\[/) v = $4; sub(/^\(/, "", v); print $2 "=" v }') ||
      return 1
    [ -n "$want" ] || { echo "apt resolves no Cockpit packages" >&2; return 1; }
    missing=()
    for pkg in $want; do
      ls "$debs/${pkg%%=*}_$(sed 's/:/%3a/' <<<"${pkg#*=}")"_*.deb >/dev/null 2>&1 || missing+=("$pkg")
    done
    ((${#missing[@]})) || break
    (cd "$debs" && apt-get download -q "${missing[@]}" >"$work/download.log" 2>&1) && break
    # The host's lists are older than the mirror: refresh them and resolve again.
    [ "$attempt" = 1 ] || { cat "$work/download.log" >&2; return 1; }
    apt-get update -qq
  done
  for pkg in $want; do
    (cd "$debs" && ls "${pkg%%=*}_$(sed 's/:/%3a/' <<<"${pkg#*=}")"_*.deb)
  done | tar -C "$debs" -cf - -T - | docker exec -i "$container" tar -C /var/cache/apt/archives -xf -
}

# cockpit_step: Cockpit from Debian's packages under real systemd (the
# socket on the container's loopback), berth-cockpit, an admin in
# berth-admin and a plain user; then the host's Chromium through Cockpit's
# login and berth's page, in the container's network namespace.
cockpit_step() {
  local t0=$SECONDS
  cockpit_debs || fail "cannot get Debian's Cockpit packages"
  inside 'DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends cockpit-ws cockpit-bridge cockpit-system busybox-static /root/berth-cockpit.deb' >"$work/apt.log" 2>&1 ||
    { cat "$work/apt.log"; fail "apt-get install berth-cockpit with Cockpit"; }
  inside 'test -f /usr/share/cockpit/berth/manifest.json' || fail "berth-cockpit did not install the page"
  # The host's engine becomes the container's only now, so that everything
  # before ran without Docker; an activated berth-imaged ran without it and
  # without busybox-static: it starts afresh.
  inside 'ln -sfn /run/host-docker.sock /run/docker.sock && systemctl stop berth-imaged.service' || fail "cannot hand the container the host's Docker engine"
  inside 'set -e
mkdir -p /etc/systemd/system/cockpit.socket.d /etc/cockpit
printf "[Socket]\nListenStream=\nListenStream=127.0.0.1:9090\n" >/etc/systemd/system/cockpit.socket.d/loopback.conf
printf "[WebService]\nAllowUnencrypted = true\n" >/etc/cockpit/cockpit.conf
systemctl daemon-reload
systemctl enable -q cockpit.socket
systemctl restart cockpit.socket
id cockpit-admin >/dev/null 2>&1 || useradd -m -s /bin/bash -G berth-admin cockpit-admin
id cockpit-viewer >/dev/null 2>&1 || useradd -m -s /bin/bash cockpit-viewer' || fail "cannot set up Cockpit and its users"
  local pw
  for u in cockpit-admin cockpit-viewer; do
    pw=$(head -c 18 /dev/urandom | base64 | tr -d '/+=')
    printf '%s' "$pw" >"$work/$u.password"
    printf '%s:%s\n' "$u" "$pw" | docker exec -i "$container" chpasswd || fail "cannot set $u's password"
  done
  inside 'systemctl is-active -q cockpit.socket' || fail "cockpit.socket is not active"
  local pid
  pid=$(docker inspect -f '{{.State.Pid}}' "$container")
  rm -rf "$artifacts" && mkdir -p "$artifacts"
  nsenter --net="/proc/$pid/ns/net" "$work/installprobe" cockpit --url http://127.0.0.1:9090 --container "$container" \
    --admin cockpit-admin --admin-password-file "$work/cockpit-admin.password" \
    --user cockpit-viewer --user-password-file "$work/cockpit-viewer.password" --out "$artifacts" --docker ||
    { inside 'journalctl --no-pager -n 40 -u cockpit.service -u "cockpit-session*"' >&2 || true; fail "the Cockpit page in Chromium"; }
  echo "    Cockpit step took $((SECONDS - t0))s"
}

# local_mirror: a flat apt repository in $cache/jq-mirror with the .debs
# that jq needs beyond berth-base:bookworm — resolved against the base's
# dpkg status and downloaded by the host's apt, as berth-imaged does it —
# and its Packages index. The container's apt gets it as its only source.
local_mirror() {
  local mirror=$cache/jq-mirror status=$work/base-status cid
  mkdir -p "$mirror/partial"
  cid=$(docker create berth-base:bookworm /nonexistent) || return 1
  docker cp "$cid:/var/lib/dpkg/status" "$status" >/dev/null && docker rm "$cid" >/dev/null || return 1
  fetch_jq() {
    apt-get -q -y --download-only --no-install-recommends -o Dir::State::status="$status" \
      -o Dir::Cache::archives="$mirror" -o Debug::NoLocking=1 install jq >"$work/jq-download.log" 2>&1
  }
  # The host's lists may be older than the mirror: refresh them once.
  fetch_jq || { apt-get update -qq && fetch_jq; } || { cat "$work/jq-download.log" >&2; return 1; }
  ls "$mirror"/jq_*.deb >/dev/null || { echo "apt fetched no jq" >&2; return 1; }
  (cd "$mirror" && dpkg-scanpackages --multiversion . /dev/null >Packages 2>"$work/scan.log") || { cat "$work/scan.log" >&2; return 1; }
  inside 'rm -rf /etc/apt/sources.list /etc/apt/sources.list.d /var/lib/apt/lists/* /srv/local-mirror && mkdir -p /etc/apt/sources.list.d /srv/local-mirror'
  tar -C "$mirror" --exclude=./partial --exclude=./lock -cf - . | docker exec -i "$container" tar -C /srv/local-mirror -xf -
  inside 'echo "deb [trusted=yes] copy:/srv/local-mirror ./" >/etc/apt/sources.list.d/local-mirror.list && apt-get update -q' >"$work/apt-update.log" 2>&1 ||
    { cat "$work/apt-update.log" >&2; return 1; }
}

# ensure_receiver makes the webhook secret and starts the reply receiver on
# 127.0.0.1:9999 where an earlier step has not (a step run alone).
ensure_receiver() {
  inside 'set -e
if [ ! -f /etc/berth/hooks.secret ]; then
  head -c 32 /dev/urandom | od -An -tx1 | tr -d " \n" >/etc/berth/hooks.secret
  chgrp berth /etc/berth/hooks.secret && chmod 0640 /etc/berth/hooks.secret
fi
systemctl is-active -q install-test-receiver ||
  systemd-run --quiet --unit=install-test-receiver /usr/local/bin/installprobe receive --secret-file /etc/berth/hooks.secret
for i in $(seq 50); do (exec 3<>/dev/tcp/127.0.0.1/9999) 2>/dev/null && break; sleep 0.1; done
' || fail "cannot start the webhook receiver"
}

# schedules_step: a [[schedules]] job becomes a systemd timer that
# `systemctl list-timers` shows; a firing is a run whose reply reaches the
# webhook receiver; removing the job removes its timer; a job missed while
# the scheduler and its timer were down runs once after. It brings its own
# connector and agent, and the secret and receiver when it runs alone
# (BERTH_INSTALL_TEST_ONLY=schedules).
schedules_step() {
  ensure_receiver
  inside 'set -e
cat >/etc/berth/berth.d/70-install-test-schedules.toml <<EOF
[[connectors]]
id = "ticks"
type = "webhook"
secret_file = "/etc/berth/hooks.secret"
reply_url = "http://127.0.0.1:9999/replies"

[[agents]]
id = "ticker"
[agents.file_access]
unrestricted = true
allow_network = false

[[schedules]]
id = "tick"
agent = "ticker"
on_calendar = "*:*:00/10"
prompt = "/sh echo scheduled-tick"
deliver_to = { connector = "ticks", channel = "CTICK" }
EOF
berthctl config check >/dev/null
systemctl reload-or-restart berth-scheduler
# A running intake learns of the new connector too (the reply goes out through it).
systemctl try-reload-or-restart berth-intake' || fail "cannot configure a schedule"
  local timers="" reply_file=""
  for _ in $(seq 1 100); do
    timers=$(inside "systemctl list-timers --all --no-legend 'berth-schedule-*'" || true)
    grep -q 'berth-schedule-tick\.timer' <<<"$timers" && break
    sleep 0.1
  done
  grep -q 'berth-schedule-tick\.timer' <<<"$timers" ||
    fail "systemctl list-timers does not show the schedule's timer: $timers $(inside 'journalctl --no-pager -u berth-scheduler -n 20')"
  grep -q '\*-\*-\* \*:\*:00/10' <<<"$(inside 'systemctl show -p TimersCalendar berth-schedule-tick.timer')" ||
    fail "the timer's calendar: $(inside 'systemctl show -p TimersCalendar berth-schedule-tick.timer')"
  # Fired by the timer every 10 s: its service calls FireSchedule over D-Bus.
  for _ in $(seq 1 300); do
    reply_file=$(inside 'ls /var/tmp/replies/schedule:tick:*.json 2>/dev/null | head -1' || true)
    [ -n "$reply_file" ] && break
    sleep 0.1
  done
  [ -n "$reply_file" ] || fail "no reply of the scheduled job within 30s: $(inside 'journalctl --no-pager -u berth-scheduler -u berth-schedule-tick.service -n 30; journalctl --no-pager -u berth-scheduler -u berth-intake -n 20 -o verbose | grep -E "^ *(MESSAGE|ERR|CONNECTOR)="')"
  grep -qx scheduled-tick <<<"$(inside "installprobe wait --id $(basename "$reply_file" .json) --timeout 5s --field text")" || fail "the scheduled job's reply: $(inside "cat $reply_file")"
  grep -q '^tick  *ticker ' <<<"$(inside 'berthctl schedules')" || fail "berthctl schedules: $(inside 'berthctl schedules')"
  inside 'rm /etc/berth/berth.d/70-install-test-schedules.toml && systemctl reload berth-scheduler && systemctl try-reload-or-restart berth-intake' || fail "cannot remove the schedule"
  local removed=""
  for _ in $(seq 1 100); do
    grep -q 'berth-schedule-tick' <<<"$(inside "systemctl list-timers --all --no-legend 'berth-schedule-*'")" || { removed=1; break; }
    sleep 0.1
  done
  [ -n "$removed" ] || fail "the removed schedule's timer is still there: $(inside "systemctl list-timers --all --no-legend 'berth-schedule-*'")"
  missed_schedule_catches_up
}

# missed_schedule_catches_up: a job missed while berth-scheduler and its
# timer were down (a reboot loses transient units) fires once, at once, when
# the scheduler comes back and re-creates the timer: Persistent=true reads
# the stamp of the timer's last elapse. The job elapses every 30 s, at
# seconds picked a few seconds ahead, so the step takes about 45 s.
missed_schedule_catches_up() {
  local t0=$SECONDS
  inside 'set -e
s=$(( ($(date +%s) + 8) % 60 )); s2=$(( (s + 30) % 60 ))
cat >/etc/berth/berth.d/71-install-test-missed.toml <<EOF
[[connectors]]
id = "misses"
type = "webhook"
secret_file = "/etc/berth/hooks.secret"
reply_url = "http://127.0.0.1:9999/replies"

[[agents]]
id = "misser"
[agents.file_access]
unrestricted = true
allow_network = false

[[schedules]]
id = "missed"
agent = "misser"
on_calendar = "*:*:$(printf "%02d,%02d" $(printf "%s\n" $s $s2 | sort -n))"
prompt = "/sh echo missed-tick"
deliver_to = { connector = "misses", channel = "CMISS" }
EOF
berthctl config check >/dev/null
systemctl reload-or-restart berth-scheduler
systemctl try-reload-or-restart berth-intake' || fail "cannot configure the job to be missed"
  local replies='ls /var/tmp/replies/schedule:missed:*.json 2>/dev/null' stamp=/var/lib/systemd/timers/stamp-berth-schedule-missed.timer
  local first="" elapsed missed next restarted fired="" late
  for _ in $(seq 1 600); do
    first=$(inside "$replies | head -1" || true)
    [ -n "$first" ] && break
    sleep 0.1
  done
  [ -n "$first" ] || fail "no reply of the job to be missed within 60s: $(inside 'journalctl --no-pager -u berth-scheduler -u berth-schedule-missed.service -n 30')"
  elapsed=$(inside "stat -c %Y $stamp") || fail "its timer fired but wrote no stamp $stamp"
  missed=$((elapsed + 30)) next=$((elapsed + 60))
  # As at a shutdown: the scheduler stops and its transient units are gone.
  # (Its finished service may be unloaded already: that stop may fail.)
  inside 'systemctl stop berth-schedule-missed.timer berth-scheduler.service && { systemctl stop berth-schedule-missed.service 2>/dev/null || true; }' || fail "cannot stop the scheduler and the job's timer"
  [ "$(inside 'date +%s')" -lt "$missed" ] || fail "too slow: the scheduler stopped after the elapse it was to miss ($(date -d "@$missed" +%T))"
  grep -q . <<<"$(inside "systemctl list-units --all --no-legend 'berth-schedule-missed*'")" && fail "the job's units outlived the stop: $(inside "systemctl list-units --all --no-legend 'berth-schedule-missed*'")"
  inside "for i in \$(seq 400); do [ \$(date +%s) -gt $missed ] && exit 0; sleep 0.1; done; exit 1" || fail "the clock did not pass the missed elapse"
  [ "$(inside "$replies | wc -l")" -eq 1 ] || fail "replies of the job while the scheduler was down: $(inside "$replies")"
  restarted=$(inside 'date +%s && systemctl start berth-scheduler.service') || fail "cannot start the scheduler again"
  for _ in $(seq 1 300); do
    fired=$(inside "journalctl --no-pager -q --since @$restarted SCHEDULE=missed MESSAGE='schedule fired'" || true)
    [ -n "$fired" ] && break
    sleep 0.1
  done
  [ -n "$fired" ] || fail "the re-created timer did not fire the missed job within 30s: $(inside "systemctl list-timers --all --no-legend 'berth-schedule-*'; journalctl --no-pager -u berth-scheduler -u berth-schedule-missed.service -n 20")"
  # The catch-up's reply is the one of a firing after the restart and before
  # the next elapse: the message id carries the firing's unix time.
  late="$replies | sed -n 's/.*schedule:missed:\([0-9]*\)\.json/\1/p' | awk '\$1 >= $restarted && \$1 < $next'"
  for _ in $(seq 1 600); do
    grep -q . <<<"$(inside "$late")" && break
    sleep 0.1
  done
  [ "$(inside "$late" | wc -l)" -eq 1 ] || fail "want exactly one reply of the missed job after the restart, before $(date -d "@$next" +%T): $(inside "$replies")"
  [ "$(inside "journalctl --no-pager -q --since @$restarted --until @$next SCHEDULE=missed MESSAGE='schedule fired'" | wc -l)" -eq 1 ] ||
    fail "the missed job fired more than once after the restart: $(inside "journalctl --no-pager -q --since @$restarted SCHEDULE=missed")"
  grep -qx missed-tick <<<"$(inside "installprobe wait --id schedule:missed:$(inside "$late") --timeout 5s --field text")" || fail "the caught-up job's reply: $(inside "$replies")"
  inside 'rm /etc/berth/berth.d/71-install-test-missed.toml && systemctl reload berth-scheduler && systemctl try-reload-or-restart berth-intake' || fail "cannot remove the missed job"
  for _ in $(seq 1 100); do
    grep -q 'berth-schedule-missed' <<<"$(inside "systemctl list-timers --all --no-legend 'berth-schedule-*'")" || { echo "    the missed job ran once after the restart; that part took $((SECONDS - t0))s"; return 0; }
    sleep 0.1
  done
  fail "the removed job's timer is still there: $(inside "systemctl list-timers --all --no-legend 'berth-schedule-*'")"
}

# sandboxes_step: a conversation agent on the landlock backend keeps its
# sandbox between messages as a transient unit berth-sandbox-<id>.service:
# the second message of the conversation reads what the first left in the
# sandbox's /tmp, berthctl sandboxes lists it, and berthctl sandboxes stop
# removes its unit. It brings its own connector, agent, secret and receiver
# (BERTH_INSTALL_TEST_ONLY=sandboxes runs it alone).
sandboxes_step() {
  ensure_receiver
  inside 'set -e
cat >/etc/berth/berth.d/75-install-test-sandboxes.toml <<EOF
[[connectors]]
id = "convs"
type = "webhook"
secret_file = "/etc/berth/hooks.secret"
reply_url = "http://127.0.0.1:9999/replies"

[[agents]]
id = "keeper"
[agents.sandbox]
scope = "conversation"
idle_stop = "5m"

[[bindings]]
connector = "convs"
channel_id = "CSBX"
agent = "keeper"
EOF
berthctl config check >/dev/null
systemctl reload-or-restart berth-scheduler
systemctl stop berth-intake.service' || fail "cannot configure a conversation agent"
  local id reply units sandbox
  id=$(inside "installprobe post --url http://127.0.0.1:8470/hooks/convs --secret-file /etc/berth/hooks.secret --channel CSBX '/sh echo kept-between-messages >/tmp/sbx-mark && echo first'") || fail "POST to the convs connector"
  reply=$(inside "installprobe wait --id $id --timeout 60s --field text") || fail "no reply to the conversation's first message: $(inside 'journalctl --no-pager -u berth-scheduler -n 30')"
  grep -qx first <<<"$reply" || fail "the first message's reply: $reply"
  units=$(inside "systemctl list-units --no-legend --plain 'berth-sandbox-*.service'")
  grep -q '^berth-sandbox-.*\.service  *loaded  *active  *running' <<<"$units" || fail "no running berth-sandbox unit after the first message: $units $(inside "berthctl runs show \$(installprobe wait --id $id --timeout 1s --field run_id)")"
  id=$(inside "installprobe post --url http://127.0.0.1:8470/hooks/convs --secret-file /etc/berth/hooks.secret --channel CSBX '/sh cat /tmp/sbx-mark'") || fail "POST to the convs connector"
  reply=$(inside "installprobe wait --id $id --timeout 60s --field text") || fail "no reply to the conversation's second message"
  grep -qx kept-between-messages <<<"$reply" || fail "the second message did not find the first one's /tmp: $reply"
  sandbox=$(inside 'berthctl sandboxes --agent keeper' | awk 'NR > 1 { print $1; exit }')
  [ -n "$sandbox" ] || fail "berthctl sandboxes lists no sandbox of keeper: $(inside 'berthctl sandboxes')"
  grep -q "berth-sandbox-$sandbox\.service" <<<"$units" || fail "sandbox $sandbox is not the unit: $units"
  inside "berthctl sandboxes stop $sandbox" >/dev/null || fail "berthctl sandboxes stop $sandbox"
  for _ in $(seq 1 100); do
    grep -q . <<<"$(inside "systemctl list-units --all --no-legend --plain 'berth-sandbox-*'")" || break
    sleep 0.1
  done
  units=$(inside "systemctl list-units --all --no-legend --plain 'berth-sandbox-*'")
  [ -z "$units" ] || fail "the stopped sandbox's unit is still there: $units"
  inside 'rm /etc/berth/berth.d/75-install-test-sandboxes.toml && systemctl reload berth-scheduler && systemctl stop berth-intake.service' || fail "cannot remove the conversation agent"
}

# prometheus_mirror: a flat apt repository in $cache/prometheus-mirror with
# the .debs Debian's prometheus needs beyond the container's own packages
# (resolved against its dpkg status by the host's apt, as local_mirror does
# for jq), given to the container's apt as one more source.
prometheus_mirror() {
  local mirror=$cache/prometheus-mirror status=$work/container-status
  mkdir -p "$mirror/partial"
  docker cp "$container:/var/lib/dpkg/status" "$status" >/dev/null || return 1
  fetch_prometheus() {
    apt-get -q -y --download-only --no-install-recommends -o Dir::State::status="$status" \
      -o Dir::Cache::archives="$mirror" -o Debug::NoLocking=1 install prometheus curl >"$work/prometheus-download.log" 2>&1
  }
  fetch_prometheus || { apt-get update -qq && fetch_prometheus; } || { cat "$work/prometheus-download.log" >&2; return 1; }
  ls "$mirror"/prometheus_*.deb >/dev/null || { echo "apt fetched no prometheus" >&2; return 1; }
  (cd "$mirror" && dpkg-scanpackages --multiversion . /dev/null >Packages 2>"$work/scan.log") || { cat "$work/scan.log" >&2; return 1; }
  inside 'rm -rf /srv/prometheus-mirror && mkdir -p /srv/prometheus-mirror /etc/apt/sources.list.d'
  tar -C "$mirror" --exclude=./partial --exclude=./lock -cf - . | docker exec -i "$container" tar -C /srv/prometheus-mirror -xf -
  inside 'echo "deb [trusted=yes] copy:/srv/prometheus-mirror ./" >/etc/apt/sources.list.d/prometheus-mirror.list && apt-get update -q' >"$work/apt-update.log" 2>&1 ||
    { cat "$work/apt-update.log" >&2; return 1; }
}

# metrics_step: Debian's prometheus scrapes berth-metrics.socket
# (127.0.0.1:9477) on real systemd; after a webhook message's run, whose
# agent asks a model (installprobe model: OpenAI's wire, with usage) through
# its egress proxy, its HTTP API (promtool query instant) has the run, the
# accepted message, the run's queue stage, berth_up, scheduler.db's size,
# the provider's calls, tokens, cost and call time by agent, provider and
# model, and the run's egress decisions and bytes; intake's listener serves
# no /metrics (BERTH_INSTALL_TEST_ONLY=metrics runs it alone).
metrics_step() {
  local t0=$SECONDS id reply q out
  ensure_receiver
  prometheus_mirror || fail "cannot give the container a local Debian mirror with prometheus"
  inside 'DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends prometheus curl' >"$work/prometheus-apt.log" 2>&1 ||
    { cat "$work/prometheus-apt.log"; fail "apt-get install prometheus"; }
  inside 'set -e
getent passwd berth-metrics >/dev/null
systemctl is-enabled -q berth-metrics.socket
systemctl start berth-metrics.socket
printf "%s\n" "global:" "  scrape_interval: 1s" "scrape_configs:" "  - job_name: berth" "    static_configs:" "      - targets: [\"127.0.0.1:9477\"]" >/etc/prometheus/prometheus.yml
systemctl is-active -q install-test-model ||
  systemd-run --quiet --unit=install-test-model /usr/local/bin/installprobe model --addr 127.0.0.1:9998 --answer metered-reply
for i in $(seq 50); do (exec 3<>/dev/tcp/127.0.0.1/9998) 2>/dev/null && break; sleep 0.1; done
# A token costs 1 (input) or 2 (output): the cost series counts whole units.
cat >/etc/berth/berth.d/76-install-test-metrics.toml <<EOF
[providers.metered]
kind = "openai"
base_url = "http://127.0.0.1:9998/v1"
model = "gpt-install"
[providers.metered.prices."gpt-install"]
input = 1000000
output = 2000000

[[connectors]]
id = "metered"
type = "webhook"
secret_file = "/etc/berth/hooks.secret"
reply_url = "http://127.0.0.1:9999/replies"

[[agents]]
id = "metered"
provider = "metered"

[[bindings]]
connector = "metered"
channel_id = "CMET"
agent = "metered"
EOF
berthctl config check >/dev/null
systemctl reload-or-restart berth-scheduler
systemctl stop berth-intake.service
# Not on 9090: that is cockpit.socket in the full run.
printf "%s\n" "ARGS=\"--web.listen-address=127.0.0.1:9091\"" >/etc/default/prometheus
systemctl restart prometheus' || fail "cannot configure prometheus and a metered agent"
  id=$(inside "installprobe post --url http://127.0.0.1:8470/hooks/metered --secret-file /etc/berth/hooks.secret --channel CMET 'hello, model'") || fail "POST to the metered connector"
  reply=$(inside "installprobe wait --id $id --timeout 60s --field text") || fail "no reply to the metered message"
  grep -qx metered-reply <<<"$reply" || fail "the metered message's reply: $reply"
  # Each series as Prometheus scraped it (every second).
  for q in 'berth_scheduler_runs_total{agent="metered",state="succeeded",daemon="scheduler"}' \
    'berth_intake_messages_accepted_total{connector="metered",daemon="intake"}' \
    'berth_scheduler_run_stage_seconds_count{agent="metered",stage="queue"}' \
    'berth_up{daemon="scheduler"}' 'berth_bolt_file_size_bytes{db="scheduler.db"}' \
    'berth_provider_calls_total{agent="metered",provider="metered",model="gpt-install"}' \
    'berth_provider_tokens_total{agent="metered",provider="metered",model="gpt-install",kind="input"} >= 12' \
    'berth_provider_tokens_total{agent="metered",provider="metered",model="gpt-install",kind="output"} >= 5' \
    'berth_provider_cost_total{agent="metered",provider="metered",model="gpt-install"} >= 22' \
    'berth_provider_call_duration_seconds_count{agent="metered",provider="metered",model="gpt-install"}' \
    'berth_egress_requests_total{agent="metered",host="127.0.0.1",verdict="allowed"}' \
    'berth_egress_bytes_total{agent="metered",direction="up"}' \
    'berth_egress_bytes_total{agent="metered",direction="down"}'; do
    out=""
    for _ in $(seq 1 60); do
      out=$(inside "promtool query instant http://127.0.0.1:9091 '$q'" 2>&1) || true
      grep -q '=> [1-9]' <<<"$out" && break
      sleep 1
    done
    grep -q '=> [1-9]' <<<"$out" || fail "prometheus has no $q: $out $(inside 'curl -s http://127.0.0.1:9477/metrics | grep ^berth_ | head -40; journalctl --no-pager -u berth-metrics -n 20')"
  done
  # The exporter listens on loopback only; intake's public listener serves
  # no metrics.
  out=$(inside 'systemctl show -p Listen berth-metrics.socket')
  [ "$out" = "Listen=127.0.0.1:9477 (Stream)" ] || fail "berth-metrics.socket listens on: $out"
  [ "$(inside 'curl -s -o /dev/null -w %{http_code} http://127.0.0.1:8470/metrics')" != 200 ] || fail "intake's webhook listener serves /metrics"
  inside 'rm /etc/berth/berth.d/76-install-test-metrics.toml && systemctl reload berth-scheduler && systemctl stop berth-intake.service prometheus install-test-model' || fail "cannot remove the metered agent"
  echo "    metrics step took $((SECONDS - t0))s"
}

# jq_step: berthctl container build --agent jq through the installed
# berth-imaged (D-Bus-activated by systemd) on the host's engine, with the
# .debs from the container's apt; then a message whose shell command runs
# jq in that agent's container.
jq_step() {
  local t0=$SECONDS build tag images sandbox
  local_mirror || fail "cannot give the container a local Debian mirror with jq"
  # berth-imaged reads apt's lists at each build; the scheduler starts afresh
  # with the engine (the cockpit step gave it) and its drop-in.
  inside 'systemctl restart berth-scheduler.service' || fail "cannot restart the scheduler"
  build=$(inside 'berthctl container build --agent jq' 2>&1) || fail "berthctl container build --agent jq: $build"
  tag=$(tail -1 <<<"$build")
  images=$(inside 'berthctl container images')
  sandbox=$(awk '$2 == "sandbox" && $NF ~ /(^|,)jq(,|$)/ { print $1 }' <<<"$images")
  built_images+=("$tag" $sandbox)
  # The package version reaches the tag ('+' and '~' become '_').
  [[ $tag == "berth-isolated:${version//[^A-Za-z0-9._-]/_}-"* ]] || fail "the isolation image is $tag, want berth-isolated:${version//[^A-Za-z0-9._-]/_}-<hash>: $build"
  grep -q 'fetching jq' <<<"$build" || fail "the build did not fetch jq with apt: $build"
  [ -n "$sandbox" ] || fail "berthctl container images shows no container image for jq: $images"
  docker image inspect "$tag" "$sandbox" >/dev/null || fail "the host's engine has no $tag or $sandbox"
  id=$(post '/sh jq --version && echo "{\"in\": \"$PWD\"}" | jq -r .in' CJQ)
  reply=$(await "$id" 120s)
  grep -qx 'jq-1\.[0-9.]*' <<<"$reply" && grep -qx /workspace <<<"$reply" || fail "the jq run's reply: $reply $(inside "berthctl runs show $(await "$id" 1s run_id)")"
  jq_run=$(await "$id" 1s run_id)
  [ "$(run_field "$jq_run" backend)" = container ] || fail "the jq run did not use the container backend: $(inside "berthctl runs show $jq_run")"
  awk -v tag="$tag" '$1 == tag && $5 != "never" { found = 1 } END { exit !found }' <<<"$(inside 'berthctl container images')" ||
    fail "the run did not use $tag: $(inside 'berthctl container images')"
  echo "    $tag (container image $sandbox); jq step took $((SECONDS - t0))s"
}

# container_limits: what this container cannot give berth, in a drop-in of
# its own (both the full test and the cockpit-only one write it after the
# first install).
container_limits() {
  inside 'cat >/etc/berth/berth.d/40-install-test-container.toml <<EOF
# Small workspace images (a quota of 64m each): loop devices of the host are
# passed in, and systemd mounts each image as a transient .mount unit.
[agent_defaults]
workspace_quota = "64m"
EOF'
}

ensure_image
mkdir -p "$engine_dir"
# Workspace images need loop devices inside the container: the host's nodes
# are passed in (at least 16 of them, made where the host has fewer).
for i in $(seq 0 15); do [ -e "/dev/loop$i" ] || mknod -m 660 "/dev/loop$i" b 7 "$i"; done
step "boot systemd in $image"
# NET_ADMIN: systemd as PID 1 brings up the loopback of a unit's
# PrivateNetwork= namespace, where a run's in-sandbox egress proxy listens.
docker run -d --name "$container" --network none --hostname berth-install-test \
  --cap-add SYS_ADMIN --cap-add NET_ADMIN --security-opt seccomp=unconfined --cgroupns=host \
  --device-cgroup-rule 'b 7:* rmw' --device /dev/loop-control $(for d in /dev/loop[0-9]*; do printf -- '--device %s ' "$d"; done) \
  -v /sys/fs/cgroup:/sys/fs/cgroup:rw --tmpfs /run --tmpfs /run/lock -v /var/run/docker.sock:/run/host-docker.sock \
  -v "$engine_dir:$engine_dir" \
  "$image" /lib/systemd/systemd >/dev/null
for _ in $(seq 1 60); do
  state=$(inside 'systemctl is-system-running 2>/dev/null' || true)
  case $state in running | degraded) break ;; esac
  sleep 0.5
done
case $state in running | degraded) ;; *) fail "systemd did not come up (state: $state)" ;; esac
[ "$(inside 'cat /proc/1/comm')" = systemd ] || fail "PID 1 is not systemd"
# systemd leaves / private in a container (on a host it makes it shared at
# boot): services' own mount namespaces would not see the workspace images
# systemd mounts later, and berth-scheduler fails such runs closed.
inside 'mount --make-rshared /' || fail "cannot make / a shared mount"
docker cp "$deb" "$container:/root/pkg.deb"
docker cp "$olddeb" "$container:/root/old.deb"
docker cp "$cockpit_deb" "$container:/root/berth-cockpit.deb"
docker cp "$work/installprobe" "$container:/usr/local/bin/installprobe"
docker cp scripts/check-unit-security.sh "$container:/usr/local/bin/check-unit-security"

# BERTH_INSTALL_TEST_ONLY=schedules|sandboxes|cockpit|metrics runs one step alone
# on a fresh install, for working on it.
only_title=""
case "${BERTH_INSTALL_TEST_ONLY:-}" in
"") ;;
schedules) only_title="schedules: a job's systemd timer is listed, fires, and its reply reaches the webhook; a job missed while the scheduler was down runs once when it is back" ;;
sandboxes) only_title="sandboxes: a conversation's landlock sandbox is a berth-sandbox unit that keeps its /tmp and stops" ;;
cockpit) only_title="Cockpit: berth-cockpit with Debian's Cockpit; the page in Chromium as an admin and as a plain user" ;;
metrics) only_title="metrics: Debian's prometheus scrapes berth-metrics.socket and has a run's series" ;;
*) fail "BERTH_INSTALL_TEST_ONLY=$BERTH_INSTALL_TEST_ONLY: want schedules, sandboxes, cockpit or metrics" ;;
esac
if [ -n "$only_title" ]; then
  step "apt install berth"
  inside 'DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends /root/pkg.deb' >"$work/apt.log" 2>&1 ||
    { cat "$work/apt.log"; fail "apt-get install"; }
  container_limits || fail "cannot write the container's limits drop-in"
  step "$only_title"
  "${BERTH_INSTALL_TEST_ONLY}_step"
  echo "install test ($BERTH_INSTALL_TEST_ONLY step only) passed in $((SECONDS - started))s"
  exit 0
fi

step "apt install (the older version first; the upgrade comes later)"
inside 'DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends /root/old.deb' >"$work/apt.log" 2>&1 ||
  { cat "$work/apt.log"; fail "apt-get install"; }
container_limits || fail "cannot write the container's limits drop-in"

step "users, files and units enabled per preset; only the socket runs"
inside 'getent passwd berth && getent passwd berth-agent && getent group berth-admin' >/dev/null || fail "users or groups missing"
[ "$(inside 'stat -c %U:%G:%a /etc/berth/berth.toml')" = root:berth:640 ] || fail "berth.toml: $(inside 'stat -c %U:%G:%a /etc/berth/berth.toml')"
inside 'berthctl config check' >/dev/null || fail "the shipped config does not pass berthctl config check"
[ "$(inside 'systemctl is-enabled berth-intake.socket berth-scheduler.service' | sort -u)" = enabled ] || fail "units not enabled"
inside 'systemctl is-active -q berth-intake.socket' || fail "berth-intake.socket is not active after install"
inside 'systemctl is-active -q berth-intake.service berth-scheduler.service' && fail "a service runs before anyone asked for it"
inside 'man -w berthctl >/dev/null 2>&1 || test -f /usr/share/man/man1/berthctl.1' || fail "no man page"

step "configure a webhook connector and a reply receiver"
inside 'set -e
head -c 32 /dev/urandom | od -An -tx1 | tr -d " \n" >/etc/berth/hooks.secret
chgrp berth /etc/berth/hooks.secret && chmod 0640 /etc/berth/hooks.secret
cat >/etc/berth/berth.d/50-install-test.toml <<EOF
[[connectors]]
id = "hooks"
type = "webhook"
secret_file = "/etc/berth/hooks.secret"
reply_url = "http://127.0.0.1:9999/replies"

# A landlock agent with a short timeout (container_mode.timeout_seconds is
# the run timeout of every backend) and an unrestricted one without network.
[[agents]]
id = "brief"
[agents.container_mode]
timeout_seconds = 2

[[agents]]
id = "open"
[agents.file_access]
unrestricted = true
allow_network = false

[[bindings]]
connector = "hooks"
channel_id = "CBRIEF"
agent = "brief"

[[bindings]]
connector = "hooks"
channel_id = "COPEN"
agent = "open"
EOF
berthctl config check >/dev/null
systemd-run --quiet --unit=install-test-receiver /usr/local/bin/installprobe receive --secret-file /etc/berth/hooks.secret
for i in $(seq 50); do (exec 3<>/dev/tcp/127.0.0.1/9999) 2>/dev/null && exit 0; sleep 0.1; done; exit 1' ||
  fail "cannot set up the connector or the receiver"

# jq: a container agent with one real Debian package; its image is built in
# the jq step, once the container has an engine. Its workspace is on the
# directory the host's engine shares (ReadWritePaths= in a drop-in, as the
# unit says a workspace elsewhere needs), without a quota: the quota's loop
# mount would be made in this container, where the host's engine cannot see
# it. fenced: a landlock agent whose egress rules refuse what it asks for.
inside "set -e
cat >/etc/berth/berth.d/60-install-test-images.toml <<EOF
[[agents]]
id = \"jq\"
workspace = \"$engine_dir/jq\"
workspace_quota = \"0\"
[agents.container_mode]
enabled = true
[agents.image_config]
enabled = true
packages = [\"jq\"]
env_vars = { INSTALL_TEST = \"$$\" }

[[agents]]
id = \"fenced\"
[agents.egress]
allow = [\"allowed.invalid\", \"127.0.0.1:9999\"]

[[bindings]]
connector = \"hooks\"
channel_id = \"CJQ\"
agent = \"jq\"

[[bindings]]
connector = \"hooks\"
channel_id = \"CFENCED\"
agent = \"fenced\"
EOF
mkdir -p /etc/systemd/system/berth-scheduler.service.d
printf '[Service]\nReadWritePaths=$engine_dir\n' >/etc/systemd/system/berth-scheduler.service.d/install-test-engine.conf
systemctl daemon-reload
berthctl config check >/dev/null" || fail "cannot configure the jq and fenced agents"

# Agents run as uids of their own from [scheduler] agent_uids, the lowest
# first: the first 32 of the default range cover every agent here (pgrep -u
# takes the list).
agent_uids=$(seq -s, 1879048192 1879048223)
# post TEXT [CHANNEL]: prints the message id.
post() { inside "installprobe post --secret-file /etc/berth/hooks.secret --channel ${2:-C1} $(printf '%q' "$1")"; }
await() { inside "installprobe wait --id $1 --timeout ${2:-60s} --field ${3:-text}"; }

step "a signed webhook starts intake by socket activation; the scheduler is D-Bus-activated; the reply arrives"
id=$(post '/sh id -u') || fail "POST to the socket"
reply=$(await "$id") || fail "no reply"
# The agent's own uid, without a passwd entry: started by setpriv, since
# systemd's User= needs one.
grep -qE '^18790(4[89]|5[0-9])[0-9]{3}$' <<<"$reply" || fail "reply: want a uid of [scheduler] agent_uids: $reply"
inside 'systemctl is-active -q berth-intake.service' || fail "intake did not start"
inside "journalctl -u dbus --no-pager | grep -q \"Activating via systemd: service name='dev.berth.Scheduler1' unit='berth-scheduler.service'\"" ||
  fail "berth-scheduler was not D-Bus-activated"
run_id=$(await "$id" 5s run_id)

step "busctl: root introspects; an unprivileged user reads status but may not change state"
grep -q '\.Submit' <<<"$(inside 'busctl introspect dev.berth.Scheduler1 /dev/berth/Scheduler1')" || fail "busctl introspect as root"
inside 'useradd -M -s /bin/bash tester'
inside 'runuser -u tester -- busctl get-property dev.berth.Scheduler1 /dev/berth/Scheduler1 dev.berth.Scheduler1 QueueDepth' >/dev/null ||
  fail "an unprivileged user cannot read QueueDepth"
grep -q 'scheduler: *running' <<<"$(inside 'runuser -u tester -- berthctl status')" || fail "berthctl status as an unprivileged user"
denied=$(inside "runuser -u tester -- busctl call dev.berth.Scheduler1 /dev/berth/Scheduler1 dev.berth.Scheduler1 CancelRun s $run_id 2>&1" || true)
grep -qi 'denied' <<<"$denied" || fail "an unprivileged CancelRun was not refused: $denied"

# journal_has MATCH...: waits (5 s at most) until `journalctl MATCH...`, as an
# admin would type it, finds an entry; on failure it prints the unit's tail.
journal_has() {
  inside "for _ in \$(seq 50); do [ -n \"\$(journalctl --no-pager -q -o cat $*)\" ] && exit 0; sleep 0.1; done; exit 1" && return 0
  echo "journalctl $* finds nothing" >&2
  return 1
}

step "journal fields: a webhook message is found by RUN_ID, MESSAGE_ID and CONNECTOR in intake, by RUN_ID, AGENT and BACKEND in the scheduler"
journal_has -u berth-intake "RUN_ID=$run_id" || fail "journalctl -u berth-intake RUN_ID=$run_id finds nothing"
journal_has -u berth-intake "MESSAGE_ID=$id" || fail "journalctl -u berth-intake MESSAGE_ID=$id finds nothing"
journal_has -u berth-intake CONNECTOR=hooks "MESSAGE_ID=$id" || fail "journalctl -u berth-intake CONNECTOR=hooks finds nothing of message $id"
journal_has -u berth-scheduler "RUN_ID=$run_id" AGENT=ops BACKEND=landlock ||
  fail "journalctl -u berth-scheduler RUN_ID=$run_id AGENT=ops BACKEND=landlock finds nothing: $(inside "journalctl --no-pager -o verbose -u berth-scheduler -n 3")"

step "journal fields: a berthctl send run, which never passes intake, is found by RUN_ID, AGENT and BACKEND"
sent=$(inside 'berthctl send --timeout 60s ops "/sh echo sent-by-berthctl" 2>&1') || fail "berthctl send: $sent"
grep -qx sent-by-berthctl <<<"$sent" || fail "berthctl send's reply: $sent"
send_run=$(sed -n 's/^run \([^ ]*\) queued for agent ops$/\1/p' <<<"$sent")
[ -n "$send_run" ] || fail "berthctl send did not name its run: $sent"
journal_has -u berth-scheduler "RUN_ID=$send_run" || fail "journalctl -u berth-scheduler RUN_ID=$send_run finds nothing"
journal_has -u berth-scheduler "RUN_ID=$send_run" AGENT=ops BACKEND=landlock ||
  fail "journalctl -u berth-scheduler RUN_ID=$send_run AGENT=ops BACKEND=landlock finds nothing"

step "egress: a request the agent's rules refuse gets a 403 through HTTP_PROXY, and the decision is in the journal with the run's RUN_ID"
# bash's /dev/tcp plays the client: the proxy address comes from HTTP_PROXY,
# as curl would take it.
id=$(post '/sh bash -c '\''p=${HTTP_PROXY#http://}; p=${p%/}; exec 3<>/dev/tcp/${p%:*}/${p##*:} && printf "GET http://refused.invalid/ HTTP/1.1\r\nHost: refused.invalid\r\nConnection: close\r\n\r\n" >&3 && head -1 <&3'\''' CFENCED)
reply=$(await "$id" 30s)
grep -q '^HTTP/1\.[01] 403' <<<"$reply" || fail "the refused request's answer: $reply"
fenced_run=$(await "$id" 1s run_id)
journal_has "RUN_ID=$fenced_run" HOST=refused.invalid ALLOWED=false ||
  fail "journalctl RUN_ID=$fenced_run finds no refused egress decision: $(inside "journalctl --no-pager -o verbose RUN_ID=$fenced_run | tail -60")"
decision=$(inside "journalctl --no-pager -q -o cat --output-fields=MESSAGE,REASON,AGENT RUN_ID=$fenced_run HOST=refused.invalid ALLOWED=false")
grep -qx 'egress decision' <<<"$decision" && grep -qx fenced <<<"$decision" && grep -qi 'rule' <<<"$decision" ||
  fail "the egress decision's journal entry lacks its message, agent or reason: $decision"

step "egress: a request the rules allow leaves through berth-egress (a child of the hardened scheduler unit)"
# 401: the reply receiver refuses the unsigned GET, which proves the dial
# went out.
id=$(post '/sh bash -c '\''p=${HTTP_PROXY#http://}; p=${p%/}; exec 3<>/dev/tcp/${p%:*}/${p##*:} && printf "GET http://127.0.0.1:9999/ HTTP/1.1\r\nHost: 127.0.0.1:9999\r\nConnection: close\r\n\r\n" >&3 && head -1 <&3'\''' CFENCED)
reply=$(await "$id" 30s)
grep -q '^HTTP/1\.[01] 401' <<<"$reply" || fail "an allowed request did not reach the receiver: $reply"

step "egress: each run's berth-egress runs in a transient scope of its own in berth-runs.slice, with its own limits, gone with the run"
id=$(post '/sh sleep 5; echo slept' CFENCED)
scope=
for _ in $(seq 1 100); do
  scope=$(inside "systemctl list-units --no-legend --plain --type=scope 'berth-egress-*' | awk '{print \$1}' | head -1")
  [ -n "$scope" ] && break
  sleep 0.1
done
[ -n "$scope" ] || fail "no berth-egress-* scope while an egress run is running"
props=$(inside "systemctl show -p MemoryMax -p TasksMax -p Slice '$scope'")
for want in MemoryMax=134217728 TasksMax=128 Slice=berth-runs.slice; do
  grep -qx "$want" <<<"$props" || fail "$scope lacks $want: $props"
done
inside "systemctl show -p ControlGroup --value '$scope'" | grep -q . || fail "$scope has no cgroup"
grep -qx slept <<<"$(await "$id" 30s)" || fail "the egress run in its scope did not answer"
left=
for _ in $(seq 1 50); do
  left=$(inside "systemctl list-units --no-legend --plain --all '$scope'")
  [ -z "$left" ] && break
  sleep 0.1
done
[ -z "$left" ] || fail "the egress scope outlived its run: $left"

step "workspace_quota: the agent's workspace is its own ext4 image, mounted by a transient .mount unit; writes stop at the quota"
mount_unit=$(inside "systemd-escape --path --suffix=mount /var/lib/berth/scheduler/agents/ops")
inside "systemctl is-active -q $mount_unit" || fail "$mount_unit is not active: $(inside "systemctl status --no-pager $mount_unit 2>&1 | tail -20")"
inside "findmnt -n -o FSTYPE /var/lib/berth/scheduler/agents/ops" | grep -qx ext4 || fail "the ops workspace is not an ext4 mount"
id=$(post '/sh dd if=/dev/zero of=fill bs=1M count=100 2>&1 | grep -i "no space"; rm -f fill; echo after-fill')
reply=$(await "$id" 60s)
grep -qi 'no space left' <<<"$reply" && grep -q after-fill <<<"$reply" || fail "a write past the quota: $reply"

step "a Landlock run is a transient unit with MemoryMax and TasksMax"
id=$(post '/sh sleep 4; echo slept')
unit=
for _ in $(seq 1 60); do
  unit=$(inside "systemctl list-units --no-legend --plain --type=service 'berth-run-*' | awk '{print \$1}' | head -1")
  [ -n "$unit" ] && break
  sleep 0.1
done
[ -n "$unit" ] || fail "no berth-run-* unit while a run is running"
props=$(inside "systemctl show -p MemoryMax -p TasksMax -p PrivateNetwork -p ProtectSystem -p NoNewPrivileges -p Slice '$unit'")
for want in MemoryMax=536870912 TasksMax=256 PrivateNetwork=yes ProtectSystem=strict NoNewPrivileges=yes Slice=berth-runs.slice; do
  grep -qx "$want" <<<"$props" || fail "$unit lacks $want: $props"
done
# /tmp and /var/tmp are the run's own, bounded (PrivateTmp is not).
tmpfs=$(inside "systemctl show -p TemporaryFileSystem '$unit'")
for want in /tmp:mode=1777,size=256m /var/tmp:mode=1777,size=256m; do
  grep -qF "$want" <<<"$tmpfs" || fail "$unit lacks TemporaryFileSystem=$want: $tmpfs"
done
exec_start=$(inside "systemctl show -p ExecStart '$unit'")
grep -q 'setpriv.*--reuid=18790' <<<"$exec_start" || fail "$unit does not switch to the agent's own uid: $exec_start"
grep -q '^slept$' <<<"$(await "$id")" || fail "the long run's reply"
grep -q . <<<"$(inside "systemctl list-units --no-legend --all 'berth-run-*'")" && fail "a run unit outlived its run"

step "runs yield the CPU: berth-runs.slice weighs [scheduler] runs_cpu_weight (unit default 20; a reload to 35 holds for the next run)"
w=$(inside 'systemctl show -p CPUWeight --value berth-runs.slice')
[ "$w" = 20 ] || fail "berth-runs.slice has CPUWeight=$w after runs, want the default 20"
reloads=$(inside "journalctl --no-pager -u berth-scheduler | grep -c 'config reloaded' || true")
inside 'printf "[scheduler]\nruns_cpu_weight = 35\n" >/etc/berth/berth.d/50-weight.toml && systemctl reload berth-scheduler'
for _ in $(seq 1 50); do
  [ "$(inside "journalctl --no-pager -u berth-scheduler | grep -c 'config reloaded' || true")" -gt "$reloads" ] && break
  sleep 0.1
done
id=$(post '/sh echo weighed')
grep -qx weighed <<<"$(await "$id")" || fail "no reply after the weight's reload"
w=$(inside 'systemctl show -p CPUWeight --value berth-runs.slice')
[ "$w" = 35 ] || fail "berth-runs.slice has CPUWeight=$w after a run with runs_cpu_weight = 35 (the scheduler sets it at run time)"
inside 'rm /etc/berth/berth.d/50-weight.toml && systemctl reload berth-scheduler'

step "a Landlock run's /tmp and /var/tmp are tmpfs of 256 MiB of its own, writable; the host's /tmp is not there"
inside 'touch /tmp/berth-install-test-host-file'
id=$(post '/sh stat -f -c "%n %T %b %S" /tmp /var/tmp; echo x > /tmp/own && echo wrote /tmp; ls /tmp/berth-install-test-host-file 2>&1 | grep -c "No such file"')
reply=$(await "$id")
grep -qx '/tmp tmpfs 65536 4096' <<<"$reply" && grep -qx '/var/tmp tmpfs 65536 4096' <<<"$reply" && grep -qx 'wrote /tmp' <<<"$reply" && grep -qx 1 <<<"$reply" ||
  fail "the run's /tmp and /var/tmp: $reply"
inside '[ ! -e /tmp/own ]' || fail "a file the run wrote to its /tmp is in the host's"
inside 'rm -f /tmp/berth-install-test-host-file'

# running_run AGENT PATTERN: waits until AGENT's running run has an active
# transient unit and a berth-agent process matching PATTERN; prints the run id.
running_run() {
  inside "for _ in \$(seq 150); do
    rid=\$(berthctl runs list --agent $1 --state running | awk 'NR == 2 { print \$1 }')
    if [ -n \"\$rid\" ] && systemctl list-units --no-legend --plain --state=active \"berth-run-\$rid-*.service\" | grep -q . && pgrep -u $agent_uids -f '$2' >/dev/null; then
      echo \$rid; exit 0
    fi
    sleep 0.1
  done; exit 1"
}
# run_field RUN_ID FIELD: one field of berthctl runs show.
run_field() { inside "berthctl runs show $1 | awk -F': *' '\$1 == \"$2\" { print \$2 }'"; }
# gone RUN_ID PATTERN: fails unless the run's unit and every process of it are gone.
gone() {
  local left
  left=$(inside "systemctl list-units --all --no-legend --plain 'berth-run-$1-*.service'
    pgrep -a -u $agent_uids -f '$2'
    grep -l 'berth-run-$1-' /proc/[0-9]*/cgroup 2>/dev/null" || true)
  [ -z "$left" ] || fail "run $1 left behind: $left"
}
nothing_left() {
  local left
  left=$(inside "systemctl list-units --all --no-legend --plain 'berth-run-*'; pgrep -a -u $agent_uids" || true)
  [ -z "$left" ] || fail "left after the runs ended: $left"
}

step "a run past its timeout fails with reason timeout; a canceled run ends canceled; nothing of either is left"
timeout_id=$(post '/sh sleep 600' CBRIEF)
cancel_id=$(post '/sh sleep 601')
timeout_run=$(running_run brief 'sleep 600') || fail "the run to time out did not start its unit and command"
cancel_run=$(running_run ops 'sleep 601') || fail "the run to cancel did not start its unit and command"
inside "berthctl runs cancel $cancel_run" >/dev/null || fail "berthctl runs cancel $cancel_run"
[ "$(run_field "$cancel_run" state)" = canceled ] || fail "canceled run: $(inside "berthctl runs show $cancel_run")"
gone "$cancel_run" 'sleep 601'
[ "$(await "$cancel_id" 10s state)" = canceled ] || fail "the canceled run's reply"
[ "$(await "$timeout_id" 20s state)" = failed ] || fail "the run with a 2 s timeout did not fail"
[ "$(run_field "$timeout_run" reason)" = timeout ] || fail "timed-out run: $(inside "berthctl runs show $timeout_run")"
gone "$timeout_run" 'sleep 600'
nothing_left

step "a scheduler killed during a run: the new one stops the left-over unit, re-queues the run once, one reply"
restart_id=$(post '/sh if [ -e restart.mark ]; then rm restart.mark; echo second-attempt; else touch restart.mark; sleep 602; fi')
restart_run=$(running_run ops 'sleep 602') || fail "the run to interrupt did not start its unit and command"
pid_before=$(inside 'systemctl show -p MainPID --value berth-scheduler')
inside 'systemctl kill -s KILL berth-scheduler'
grep -qx second-attempt <<<"$(await "$restart_id" 30s)" || fail "the interrupted run's reply: $(inside "berthctl runs show $restart_run")"
[ "$(inside 'systemctl show -p MainPID --value berth-scheduler')" != "$pid_before" ] || fail "the scheduler was not restarted"
[ "$(run_field "$restart_run" state)" = succeeded ] && [ "$(run_field "$restart_run" attempts)" = 2 ] ||
  fail "interrupted run: $(inside "berthctl runs show $restart_run")"
gone "$restart_run" 'sleep 602'
# The new scheduler stops the first attempt's unit through the handle it
# recorded (unit:berth-run-<id>-1.service, the first attempt's) while it reconciles, before it logs
# the interruption and starts the second attempt (which would stop a unit of
# the same name too, but only after "run was interrupted").
sched_log=$(inside "journalctl --no-pager -o cat -u berth-scheduler RUN_ID=$restart_run")
grep -q 'cannot kill sandbox' <<<"$sched_log" && fail "the scheduler could not stop the left-over unit: $sched_log"
inside "journalctl --no-pager -o cat UNIT=berth-run-$restart_run-1.service + RUN_ID=$restart_run" |
  awk -v stop="Stopped berth-run-$restart_run-1.service" '
    index($0, stop) == 1 && !stopped { stopped = NR }
    /^run was interrupted by a scheduler restart/ { interrupted = NR }
    END { exit !(stopped && interrupted && stopped < interrupted) }' ||
  fail "the restarted scheduler did not stop the left-over unit while reconciling: $(inside "journalctl --no-pager -o cat UNIT=berth-run-$restart_run-1.service + RUN_ID=$restart_run")"

step "landlock and unrestricted agents without allow_network get a network namespace other than PID 1's"
host_ns=$(inside 'readlink /proc/1/ns/net')
ns_ids=("$(post '/sh readlink /proc/self/ns/net')" "$(post '/sh readlink /proc/self/ns/net' COPEN)")
backends=(landlock unrestricted)
for i in 0 1; do
  reply=$(await "${ns_ids[$i]}" 20s)
  ns=$(grep -o 'net:\[[0-9]*\]' <<<"$reply") || fail "no network namespace in the ${backends[$i]} run's reply: $reply"
  [ "$ns" != "$host_ns" ] || fail "the ${backends[$i]} run without allow_network shares PID 1's network namespace $host_ns"
  [ "$(run_field "$(await "${ns_ids[$i]}" 1s run_id)" backend)" = "${backends[$i]}" ] || fail "the run did not use the ${backends[$i]} backend"
done
[ "$(inside "wc -l </var/tmp/replies/$restart_id.deliveries")" = 1 ] || fail "the interrupted run was replied to more than once"

step "systemctl reload with a backlog loses nothing"
ids=()
for i in 1 2 3 4; do ids+=("$(post "/sh sleep 0.5; echo backlog-$i")"); done
pids_before=$(inside 'systemctl show -p MainPID --value berth-intake berth-scheduler')
inside 'systemctl reload berth-intake berth-scheduler' || fail "reload"
for i in 1 2 3 4; do grep -qx "backlog-$i" <<<"$(await "${ids[$((i - 1))]}" 90s)" || fail "backlog message $i lost after reload"; done
[ "$(inside 'systemctl show -p MainPID --value berth-intake berth-scheduler')" = "$pids_before" ] || fail "reload restarted a service"

step "a bad config on reload is refused, named by file, line and key in plain journalctl and systemctl status; the old one keeps serving"
inside 'printf "[scheduler]\nbogus_key = 1\n" >/etc/berth/berth.d/99-bad.toml'
inside 'systemctl reload berth-intake berth-scheduler'
refused='config refused, the running one keeps serving: /etc/berth/berth.d/99-bad.toml:2: scheduler.bogus_key: unknown key'
for u in berth-intake berth-scheduler; do
  for _ in $(seq 1 50); do
    inside "journalctl --no-pager -u $u | grep -qF '$refused'" && break
    sleep 0.1
  done
  inside "journalctl --no-pager -u $u | grep -qF '$refused'" ||
    fail "journalctl -u $u does not say what is wrong: $(inside "journalctl --no-pager -u $u -n 5")"
  for _ in $(seq 1 50); do
    status=$(inside "systemctl status --no-pager $u" || true)
    grep -qF '99-bad.toml:2: scheduler.bogus_key' <<<"$status" && break
    sleep 0.1
  done
  grep -qF '99-bad.toml:2: scheduler.bogus_key' <<<"$status" || fail "systemctl status $u does not name the refused config: $status"
done
id=$(post '/sh echo still-serving')
grep -qx still-serving <<<"$(await "$id")" || fail "no reply with the old config"
inside 'rm /etc/berth/berth.d/99-bad.toml && systemctl reload berth-intake berth-scheduler'
for u in berth-intake berth-scheduler; do
  for _ in $(seq 1 50); do
    grep -q 'last reload refused' <<<"$(inside "systemctl show -p StatusText --value $u")" || continue 2
    sleep 0.1
  done
  fail "$u still reports the refused config after a good reload: $(inside "systemctl show -p StatusText --value $u")"
done

step "systemd-analyze security thresholds hold on the installed units"
inside 'check-unit-security /usr/lib/systemd/system' || fail "unit exposure above threshold"

step "upgrade with queued work: services restart, nothing is lost, the admin's config stays"
inside 'echo "# admin was here" >>/etc/berth/berth.toml'
ids=()
for i in 1 2 3; do ids+=("$(post "/sh sleep 1; echo upgrade-$i")"); done
pids_before=$(inside 'systemctl show -p MainPID --value berth-scheduler')
inside 'DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends -o Dpkg::Options::=--force-confold /root/pkg.deb' >"$work/apt.log" 2>&1 ||
  { cat "$work/apt.log"; fail "upgrade"; }
[ "$(inside "dpkg-query -W -f '\${Version}' berth")" = "$version-1" ] || fail "upgrade did not install $version"
[ "$(inside 'systemctl show -p MainPID --value berth-scheduler')" != "$pids_before" ] || fail "the scheduler was not restarted on upgrade"
for i in 1 2 3; do grep -qx "upgrade-$i" <<<"$(await "${ids[$((i - 1))]}" 120s)" || fail "message $i lost in the upgrade"; done
inside 'grep -q "admin was here" /etc/berth/berth.toml' || fail "the upgrade replaced the admin's berth.toml"

step "idle intake exits with status 75 (a success); the next request starts it again; the watchdog never fired"
inside 'mkdir -p /etc/systemd/system/berth-intake.service.d && printf "[Service]\nExecStart=\nExecStart=/usr/libexec/berth/berth-intake --idle-exit=2s\n" >/etc/systemd/system/berth-intake.service.d/idle.conf && systemctl daemon-reload && systemctl restart berth-intake.service'
for _ in $(seq 1 100); do
  [ "$(inside 'systemctl show -p ActiveState --value berth-intake.service')" = inactive ] && break
  sleep 0.1
done
idle=$(inside 'systemctl show -p ActiveState -p Result -p ExecMainStatus berth-intake.service')
grep -qx ActiveState=inactive <<<"$idle" && grep -qx Result=success <<<"$idle" && grep -qx ExecMainStatus=75 <<<"$idle" ||
  fail "intake did not exit idle with status 75: $idle"
inside 'systemctl is-active -q berth-intake.socket' || fail "the socket stopped with the idle service"
id=$(post '/sh echo woke-up')
grep -qx woke-up <<<"$(await "$id")" || fail "no reply after an idle exit"
inside 'rm -r /etc/systemd/system/berth-intake.service.d && systemctl daemon-reload'
grep -q "Watchdog timeout" <<<"$(inside 'journalctl --no-pager -u berth-intake -u berth-scheduler')" && fail "a watchdog timeout killed a service"
grep -qx WatchdogUSec=30s <<<"$(inside 'systemctl show -p WatchdogUSec berth-intake.service')" || fail "berth-intake has no watchdog"

step "Cockpit: berth-cockpit with Debian's Cockpit; the page in Chromium as an admin and as a plain user"
cockpit_step

step "image_config: a jq image built with berthctl through the installed berth-imaged and the container's apt; a container run uses it"
jq_step
inside 'rm -r /etc/systemd/system/berth-scheduler.service.d && systemctl daemon-reload'

step "schedules: a job's systemd timer is listed, fires, and its reply reaches the webhook; a job missed while the scheduler was down runs once when it is back"
schedules_step

step "sandboxes: a conversation's landlock sandbox is a berth-sandbox unit that keeps its /tmp and stops"
sandboxes_step

step "metrics: Debian's prometheus scrapes berth-metrics.socket and has a run's series"
metrics_step

step "apt-get purge leaves no berth files, units or users behind"
inside 'DEBIAN_FRONTEND=noninteractive apt-get purge -y -q berth berth-cockpit' >"$work/apt.log" 2>&1 || { cat "$work/apt.log"; fail "purge"; }
inside 'systemctl stop install-test-receiver' || true
left=$(inside 'find / -xdev \( -path /proc -o -path /sys -o -path /var/log/journal -o -path /root \) -prune -o \( -name "*berth*" -o -name "dev.berth.*" \) -print' || true)
[ -z "$left" ] || fail "files left after purge: $left"
for u in berth berth-agent berth-metrics; do inside "getent passwd $u" >/dev/null && fail "user $u left after purge"; done
for g in berth berth-agent berth-admin; do inside "getent group $g" >/dev/null && fail "group $g left after purge"; done
grep -q . <<<"$(inside "systemctl list-units --no-legend --all 'berth*'")" && fail "units left after purge: $(inside "systemctl list-units --no-legend --all 'berth*'")"

echo "install test passed in $((SECONDS - started))s"
