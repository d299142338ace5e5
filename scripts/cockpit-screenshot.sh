#!/usr/bin/env bash
# Remakes the README's screenshots of berth's Cockpit page with the machinery
# of its browser test: the suite on a private bus, Debian's cockpit-ws with a
# local cockpit-bridge session, Chromium headless (e2e/cockpit_test.go). The
# tests save their screenshots as artifacts; this copies the two the README
# shows, and the Approvals view the admin manual shows, into docs/img/.
#
#   scripts/cockpit-screenshot.sh
#
# As root (the test runs agents as nobody); installs cockpit-ws,
# cockpit-bridge, cockpit-system and chromium where missing.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib.sh
ensure_packages dbus-daemon:dbus systemd-socket-activate:systemd chromium:chromium cockpit-bridge:cockpit-bridge
missing=()
[ -x /usr/lib/cockpit/cockpit-ws ] || missing+=(cockpit-ws)
[ -e /usr/share/cockpit/shell/manifest.json ] || missing+=(cockpit-system)
if ((${#missing[@]})); then
  echo "==> installing ${missing[*]}" >&2
  DEBIAN_FRONTEND=noninteractive apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
CI=true go test -count=1 -run 'TestCockpitPageAsAnAdmin|TestCockpitApprovalsAsAnAdmin' -artifacts -outputdir "$out" ./e2e/
mkdir -p docs/img
for name in cockpit-overview.png cockpit-runs.png cockpit-approvals.png; do
  shot=$(find "$out" -name "$name" | head -1)
  [ -n "$shot" ] || { echo "the test saved no $name" >&2; exit 1; }
  cp "$shot" "docs/img/$name"
  echo "docs/img/$name"
done
