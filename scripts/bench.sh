#!/usr/bin/env bash
# Every benchmark of berth, each figure beside its baseline from the same
# run, printed as one Markdown table (docs/benchmarks.md explains them):
#   container  scripts/bench-container.sh: Submit → agent has its request,
#              cold and warm, beside `docker run --rm -i`
#   scheduler  scripts/bench-scheduler.sh: the scheduler at 1k/10k/100k runs
#   intake     go test -bench in services/intake: durable accepts beside a
#              naive one-commit-per-message server, the hand-off of a
#              backlog (instant Submitter and the real scheduler over a
#              private bus) beside one Submit at a time, retries while the
#              scheduler is down
#
#   scripts/bench.sh [container] [scheduler] [intake]   (as root; default: all)
#
# Finishes within 10 minutes on a 2-core machine: each part has a time box
# (BENCH_CONTAINER_RUNS, default 20 runs per variant; BENCH_REPS, default 3
# repetitions of each intake figure, medians reported).
set -euo pipefail
cd "$(dirname "$0")/.."

parts=("$@")
[ ${#parts[@]} -gt 0 ] || parts=(container scheduler intake)
has() { local p; for p in "${parts[@]}"; do [ "$p" = "$1" ] && return 0; done; return 1; }

out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
rows=()
row() { rows+=("| $1 | $2 | $3 | $4 |"); }
trim() { echo "$1" | sed 's/^ *//; s/ *$//'; }

if has container; then
	echo "== container (scripts/bench-container.sh -n ${BENCH_CONTAINER_RUNS:-20})" >&2
	if timeout 240 scripts/bench-container.sh -n "${BENCH_CONTAINER_RUNS:-20}" >"$out/container" 2>"$out/container.err"; then
		# | path | median | p95 | median vs docker run |
		while IFS='|' read -r _ path median p95 ratio _; do
			median=$(trim "$median"); p95=$(trim "$p95"); ratio=$(trim "$ratio")
			case "$path" in
			*docker\ run*) row "container: \`docker run --rm -i\` → request read" "$median (p95 $p95)" "(the baseline)" "100 %" ;;
			*berth\ cold*) row "container: berth cold → request read" "$median (p95 $p95)" "docker run, same run" "$ratio (target ≤ 60 %)" ;;
			*berth\ warm*) row "container: berth warm → request read" "$median (p95 $p95)" "docker run, same run" "$ratio (target p50 ≤ 25 ms)" ;;
			esac
		done < <(grep '^| ' "$out/container" | grep -v '^| path')
	else
		row "container" "did not run: $(tail -n1 "$out/container.err")" "" ""
	fi
fi

if has scheduler; then
	if [ -x scripts/bench-scheduler.sh ] || [ -f scripts/bench-scheduler.sh ]; then
		echo "== scheduler (scripts/bench-scheduler.sh)" >&2
		if timeout 240 sh scripts/bench-scheduler.sh >"$out/scheduler" 2>&1; then
			# Go benchmark lines: name, iterations, then value unit pairs.
			while read -r name _ rest; do
				set -- $rest
				figures=""
				while [ $# -ge 2 ]; do figures="$figures${figures:+, }$1 $2"; shift 2; done
				row "scheduler: ${name#Benchmark}" "$figures" "" ""
			done < <(grep '^Benchmark' "$out/scheduler")
		else
			row "scheduler" "did not run: $(tail -n1 "$out/scheduler")" "" ""
		fi
	else
		row "scheduler" "scripts/bench-scheduler.sh is missing" "" ""
	fi
fi

if has intake; then
	echo "== intake (go test ./services/intake -bench .)" >&2
	if timeout 300 go test ./services/intake -run '^$' -bench '^Benchmark(Accept|HandOff|HandOffToTheScheduler|SchedulerDown)$' \
		-benchtime 1x -count 1 -timeout 5m >"$out/intake" 2>&1; then
		# metric NAME UNIT of a benchmark line of the intake output.
		metric() {
			awk -v name="$1" -v unit="$2" '$1 ~ "^"name"(-[0-9]+)?$" { for (i = 3; i < NF; i++) if ($(i+1) == unit) { v = $i; printf (v >= 100 ? "%.0f" : "%.3g"), v; exit } }' "$out/intake"
		}
		for s in 10 50; do
			b="BenchmarkAccept/senders=$s"
			row "intake: durable accepts, $s senders (POST → fsync → 202)" \
				"$(metric "$b" intake_msg/s) msg/s, $(metric "$b" commits/msg) commits/msg" \
				"naive one commit per message: $(metric "$b" naive_msg/s) msg/s" \
				"$(metric "$b" x_naive)× (target ≥ 3× and ≥ 10,000 msg/s at 50)"
		done
		row "intake: hand-off of 10,000, instant Submitter" \
			"$(metric BenchmarkHandOff/pipelined msg/s) msg/s, $(metric BenchmarkHandOff/pipelined commits/msg) commits/msg" \
			"one Submit at a time: $(metric BenchmarkHandOff/serial msg/s) msg/s" "target ≥ 2,000 msg/s"
		if grep -q '^BenchmarkHandOffToTheScheduler/pipelined' "$out/intake"; then
			row "intake: hand-off of 10,000 to the real scheduler over D-Bus" \
				"$(metric BenchmarkHandOffToTheScheduler/pipelined msg/s) msg/s, $(metric BenchmarkHandOffToTheScheduler/pipelined commits/msg) intake commits/msg" \
				"one Submit at a time: $(metric BenchmarkHandOffToTheScheduler/serial msg/s) msg/s" "target ≥ 2,000 msg/s"
		else
			row "intake: hand-off to the real scheduler" "skipped (needs root and dbus-daemon)" "" ""
		fi
		row "intake: 10,000 pending, scheduler down, 3 s of retries" \
			"$(metric BenchmarkSchedulerDown commits/msg) commits/msg (accept included), $(metric BenchmarkSchedulerDown submits/pass) Submits/pass" \
			"" "target ≤ 2 fsyncs/msg"
	else
		row "intake" "did not run: $(grep -m1 -E 'FAIL|panic|cannot' "$out/intake" || tail -n1 "$out/intake")" "" ""
	fi
fi

echo
echo "berth benchmarks, $(date -u +%Y-%m-%dT%H:%MZ), $(nproc) CPUs, $(uname -r)"
echo
echo "| benchmark | result | baseline (same run) | ratio / target |"
echo "|---|---|---|---|"
printf '%s\n' "${rows[@]}"
