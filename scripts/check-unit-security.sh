#!/usr/bin/env bash
# Checks the hardening of berth's units with `systemd-analyze security`:
# the overall exposure must stay at or below each unit's threshold.
#
#   scripts/check-unit-security.sh [UNIT_DIR]
#
# UNIT_DIR defaults to units/systemd; the install test passes
# /usr/lib/systemd/system to check the installed units.
set -euo pipefail
cd "$(dirname "$0")/.."

dir=${1:-units/systemd}
# unit:threshold. The scheduler (and berth-imaged when it exists) run as
# root; see the comments in the units for why.
checks=(berth-intake.service:2.0 berth-scheduler.service:4.0)
[ -e "$dir/berth-imaged.service" ] && checks+=(berth-imaged.service:4.0)
[ -e "$dir/berth-metrics.service" ] && checks+=(berth-metrics.service:2.0)

failed=0
for check in "${checks[@]}"; do
  unit=${check%%:*} max=${check#*:}
  out=$(systemd-analyze security --offline=true --no-pager "$dir/$unit" 2>&1) || {
    # A non-zero status alone means "above the tool's own threshold"; the
    # exposure line decides.
    :
  }
  exposure=$(printf '%s\n' "$out" | sed -n 's/.*Overall exposure level for [^:]*: \([0-9.]*\).*/\1/p' | tail -1)
  if [ -z "$exposure" ]; then
    echo "FAIL $unit: systemd-analyze printed no exposure:" >&2
    printf '%s\n' "$out" | tail -20 >&2
    failed=1
    continue
  fi
  if awk -v e="$exposure" -v m="$max" 'BEGIN { exit !(e <= m) }'; then
    echo "ok   $unit: exposure $exposure (≤ $max)"
  else
    echo "FAIL $unit: exposure $exposure > $max" >&2
    printf '%s\n' "$out" | grep '✗' >&2 || true
    failed=1
  fi
done
exit $failed
