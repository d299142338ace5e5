#!/usr/bin/env bash
# Every benchmark of berth, each figure beside its baseline from the same
# run, printed as one Markdown table (docs/benchmarks.md explains them):
#   container  scripts/bench-container.sh: Submit → agent has its request
#              and → the run's end, cold and warm, beside `docker run --rm -i`
#              (to its log line and to its exit), and the engine calls
#   scheduler  scripts/bench-scheduler.sh: the scheduler at 1k/10k/100k runs
#   intake     go test -bench in services/intake: durable accepts beside a
#              naive one-commit-per-message server, the hand-off of a
#              backlog (instant Submitter and the real scheduler over a
#              private bus, one agent's and 64 agents', in batches beside
#              one Submit per message) beside one Submit at a time,
#              retries while the scheduler is down
#   e2e        go test -bench WholePath in e2e: signed POST → reply from a
#              fake platform through the real daemons (Landlock host runs,
#              local provider): p50 at one sender beside an unrestricted
#              agent's, runs/s of one agent and of 8 agents; and
#              (BenchmarkWarmContainer) POST → reply through a warm container
#              pool beside a Landlock agent of the same stack
#   beside     go test -bench AcceptBesideRuns in services/intake: durable
#              accepts at 50 senders beside the naive server while the real
#              suite runs 8 Landlock agents without end, the runs' group at
#              runs_cpu_weight 20 (ADR 30) and at full weight, and idle,
#              interleaved; the load average of the run
#   ownimage   go test -bench WarmContainerOwnImage in e2e: POST → reply
#              through a warm pool for an agent with an image of its own
#              (container_mode.image) beside berth's default image and a
#              Landlock agent, interleaved message by message
#   egress     scripts/bench-egress.sh, when it exists: the egress proxy
#              beside direct requests
#   sandboxes  go test -bench ConversationSandbox in e2e: a conversation's
#              later messages in its live sandbox beside scope "message",
#              Landlock and container (POST → reply, the run), idle memory,
#              per-message runs beside 50 idle sandboxes
#   kubernetes go test -bench Kubernetes in e2e, on the test cluster when it
#              is up (scripts/kube-cluster.sh; this script never starts it):
#              POST → reply through the real daemons from a warm pod and from
#              a cold one, and a hardened pod's create → running
#
#   scripts/bench.sh [container] [scheduler] [intake] [beside] [e2e] [ownimage]
#                    [egress] [sandboxes] [kubernetes]   (as root; default: all)
#
# Finishes within 10 minutes on a 2-core machine without beside and ownimage
# (each of those two builds a suite and has a box of 10 minutes of its own,
# 3–5 minutes when the build cache is warm): each part has a time box
# (BENCH_CONTAINER_RUNS, default 20 runs per variant; BENCH_REPS, default 3
# repetitions of each intake figure, medians reported; BENCH_E2E_RUNS,
# default 60 messages per figure of the whole path; BENCH_KUBE_RUNS, default
# 10 messages per Kubernetes figure).
set -euo pipefail
cd "$(dirname "$0")/.."

parts=("$@")
[ ${#parts[@]} -gt 0 ] || parts=(container scheduler intake beside e2e ownimage egress sandboxes kubernetes)
has() { local p; for p in "${parts[@]}"; do [ "$p" = "$1" ] && return 0; done; return 1; }

out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
rows=()
row() { rows+=("| $1 | $2 | $3 | $4 |"); }
trim() { echo "$1" | sed 's/^ *//; s/ *$//'; }

if has container; then
	echo "== container (scripts/bench-container.sh -n ${BENCH_CONTAINER_RUNS:-20})" >&2
	if timeout 240 scripts/bench-container.sh -n "${BENCH_CONTAINER_RUNS:-20}" >"$out/container" 2>"$out/container.err"; then
		# | path | read median | p95 | vs docker run | ended median | p95 | vs docker run |
		while IFS='|' read -r _ path rm rp rr fm fp fr _; do
			rm=$(trim "$rm"); rp=$(trim "$rp"); rr=$(trim "$rr"); fm=$(trim "$fm"); fp=$(trim "$fp"); fr=$(trim "$fr")
			case "$path" in
			*docker\ run*) row "container: \`docker run --rm -i\` → request read / → exit" "$rm (p95 $rp) / $fm (p95 $fp)" "(the baseline)" "100 %" ;;
			*berth\ cold,*) row "container: berth cold, removal after the run → run ended" "$fm (p95 $fp)" "docker run → exit, same run" "$fr" ;;
			*berth\ warm,*) row "container: berth warm, removal after the run → run ended" "$fm (p95 $fp)" "docker run → exit, same run" "$fr (target p50 ≤ 25 ms POST → reply)" ;;
			*berth\ cold*) row "container: berth cold → request read / → run ended" "$rm (p95 $rp) / $fm (p95 $fp)" "docker run, same run" "$rr / $fr (target ≤ 60 %)" ;;
			*berth\ warm*) row "container: berth warm → request read / → run ended" "$rm (p95 $rp) / $fm (p95 $fp)" "docker run, same run" "$rr / $fr (target p50 ≤ 25 ms POST → reply)" ;;
			esac
		done < <(grep '^| ' "$out/container" | grep -v -e '^| path' -e '^| step' -e '^|---' | grep -v -e '^| prepare' -e '^| create' -e '^| attach' -e '^| start' -e '^| total' -e '^| remove')
		steps=$(grep -E '^\| (prepare|create|attach|start|remove)' "$out/container" | awk -F'|' '{ gsub(/ /, "", $2); gsub(/^ +| +$/, "", $3); printf "%s%s %s", sep, $2, $3; sep=", " }')
		row "container: cold path engine calls (median ms)" "$steps" "" ""
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
		row "intake: hand-off of one agent's 10,000, instant Submitter (SubmitBatch)" \
			"$(metric BenchmarkHandOff/pipelined msg/s) msg/s, $(metric BenchmarkHandOff/pipelined commits/msg) commits/msg" \
			"one Submit at a time: $(metric BenchmarkHandOff/serial msg/s) msg/s" "target ≥ 2,000 msg/s"
		if grep -q '^BenchmarkHandOffToTheScheduler/one-agent/batched' "$out/intake"; then
			serial="one Submit at a time: $(metric BenchmarkHandOffToTheScheduler/serial msg/s) msg/s"
			row "intake: hand-off of one agent's 10,000 to the real scheduler over D-Bus (SubmitBatch)" \
				"$(metric BenchmarkHandOffToTheScheduler/one-agent/batched msg/s) msg/s, $(metric BenchmarkHandOffToTheScheduler/one-agent/batched commits/msg) intake commits/msg" \
				"one Submit per message, in order: $(metric BenchmarkHandOffToTheScheduler/one-agent/submit msg/s) msg/s; $serial" "target ≥ 2,000 msg/s"
			row "intake: hand-off of 64 agents' 10,000 to the real scheduler over D-Bus (SubmitBatch)" \
				"$(metric BenchmarkHandOffToTheScheduler/64-agents/batched msg/s) msg/s, $(metric BenchmarkHandOffToTheScheduler/64-agents/batched commits/msg) intake commits/msg" \
				"one Submit per message, 64 in flight: $(metric BenchmarkHandOffToTheScheduler/64-agents/submit msg/s) msg/s; $serial" "target ≥ 2,000 msg/s"
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

# value UNIT of the first line of benchmark NAME in FILE.
bench_metric() {
	awk -v name="$2" -v unit="$3" '$1 ~ "^"name"(-[0-9]+)?$" { for (i = 3; i < NF; i++) if ($(i+1) == unit) { v = $i; printf (v >= 100 ? "%.0f" : "%.3g"), v; exit } }' "$1"
}

if has beside; then
	echo "== beside (go test ./services/intake -bench AcceptBesideRuns)" >&2
	if timeout 600 go test ./services/intake -run '^$' -bench '^BenchmarkAcceptBesideRuns$' -benchtime 1x -count 1 -timeout 10m >"$out/beside" 2>&1; then
		m() { bench_metric "$out/beside" BenchmarkAcceptBesideRuns "$1"; }
		row "intake beside 8 running agents, runs at runs_cpu_weight 20 (50 senders)" \
			"$(m intake_low_msg/s) msg/s ($(m of_idle_low) of idle), $(m runs/s_low) runs/s" \
			"naive beside the same runs: $(m naive_low_msg/s) msg/s; idle: intake $(m intake_idle_msg/s), naive $(m naive_idle_msg/s)" \
			"$(m x_naive_low)× (target ≥ 3×)"
		row "intake beside 8 running agents, runs at full weight (100, cpu.shares 1024)" \
			"$(m intake_full_msg/s) msg/s ($(m of_idle_full) of idle), $(m runs/s_full) runs/s" \
			"naive beside the same runs: $(m naive_full_msg/s) msg/s" \
			"$(m x_naive_full)×; load average $(m load1_min)–$(m load1_max)"
	else
		row "beside" "did not run: $(grep -m1 -E 'FAIL|panic|cannot' "$out/beside" || tail -n1 "$out/beside")" "" ""
	fi
fi

if has e2e; then
	echo "== e2e (go test ./e2e -bench WholePath)" >&2
	if timeout 400 go test ./e2e -run '^$' -bench '^(BenchmarkWholePath|BenchmarkWarmContainer)$' -benchtime 1x -count 1 -timeout 6m >"$out/e2e" 2>&1; then
		# value UNIT of the first line of benchmark NAME.
		e2e() {
			awk -v name="$1" -v unit="$2" '$1 ~ "^"name"(-[0-9]+)?$" { for (i = 3; i < NF; i++) if ($(i+1) == unit) { printf "%.1f", $i; exit } }' "$out/e2e"
		}
		b=BenchmarkWholePath/latency
		row "landlock: POST → reply, one sender (p50)" "$(e2e $b landlock_p50_ms) ms (p95 $(e2e $b landlock_p95_ms) ms)" \
			"unrestricted agent, same path: $(e2e $b unrestricted_p50_ms) ms; POST → 202 alone: $(e2e $b accept_p50_ms) ms" "target p50 ≤ 25 ms"
		row "landlock: the run, split at the agent's \"confined\" line (p50)" "started → confined $(e2e $b start_to_confined_p50_ms) ms, confined → ended $(e2e $b confined_to_end_p50_ms) ms" "" ""
		row "landlock: one agent's backlog, POST → last reply" "$(e2e BenchmarkWholePath/one-agent runs/s) runs/s" "" "target ≥ 30 runs/s"
		row "landlock: 8 agents' backlog, POST → last reply" "$(e2e BenchmarkWholePath/8-agents runs/s) runs/s" "" "target ≥ 100 runs/s on 2 cores"
		b=BenchmarkWarmContainer
		row "container, warm pool: POST → reply, one sender (p50)" "$(e2e $b warm_p50_ms) ms (p95 $(e2e $b warm_p95_ms) ms); with one tool call (/sh true) $(e2e $b warm_tool_p50_ms) ms" \
			"Landlock agent, same stack: $(e2e $b landlock_p50_ms) ms" "target p50 ≤ 25 ms"
	else
		row "e2e" "did not run: $(grep -m1 -E 'FAIL|panic|cannot|did not' "$out/e2e" || tail -n1 "$out/e2e")" "" ""
	fi
fi

if has ownimage; then
	echo "== ownimage (go test ./e2e -bench WarmContainerOwnImage)" >&2
	if timeout 600 go test ./e2e -run '^$' -bench '^BenchmarkWarmContainerOwnImage$' -benchtime 1x -count 1 -timeout 10m >"$out/ownimage" 2>&1; then
		m() { bench_metric "$out/ownimage" BenchmarkWarmContainerOwnImage "$1"; }
		row "container, warm pool, the agent's own image (container_mode.image): POST → reply (p50)" \
			"$(m own_image_p50_ms) ms (p95 $(m own_image_p95_ms) ms); started → confined $(m own_image_start_to_confined_p50_ms) ms, confined → ended $(m own_image_confined_to_end_p50_ms) ms" \
			"berth's default image, same stack: $(m default_image_p50_ms) ms (p95 $(m default_image_p95_ms) ms; $(m default_image_start_to_confined_p50_ms) / $(m default_image_confined_to_end_p50_ms) ms); Landlock $(m landlock_p50_ms) ms" \
			"target p50 ≤ 25 ms both"
	else
		row "ownimage" "did not run: $(grep -m1 -E 'FAIL|panic|cannot|did not' "$out/ownimage" || tail -n1 "$out/ownimage")" "" ""
	fi
fi

if has egress && [ -f scripts/bench-egress.sh ]; then
	echo "== egress (scripts/bench-egress.sh)" >&2
	if timeout 180 bash scripts/bench-egress.sh >"$out/egress" 2>"$out/egress.err"; then
		# | path | direct | through the egress proxy | proxy vs direct |
		while IFS='|' read -r _ path direct proxy ratio _; do
			row "egress: $(trim "$path")" "$(trim "$proxy")" "direct: $(trim "$direct")" "$(trim "$ratio")"
		done < <(grep '^| ' "$out/egress" | grep -v -e '^| path' -e '^|---')
	else
		row "egress" "did not run: $(tail -n1 "$out/egress.err")" "" ""
	fi
fi

if has sandboxes; then
	echo "== sandboxes (go test ./e2e -bench ConversationSandbox)" >&2
	if timeout 300 go test ./e2e -run '^$' -bench '^BenchmarkConversationSandbox$' -benchtime 1x -count 1 -timeout 5m >"$out/sandboxes" 2>&1; then
		sbx() {
			awk -v name="$1" -v unit="$2" '$1 ~ "^"name"(-[0-9]+)?$" { for (i = 3; i < NF; i++) if ($(i+1) == unit) { printf "%.1f", $i; exit } }' "$out/sandboxes"
		}
		for be in landlock container; do
			b=BenchmarkConversationSandbox/$be
			row "$be: a conversation's later message, live sandbox: the run / POST → reply (p50)" "$(sbx $b kept_run_p50_ms) ms / $(sbx $b kept_reply_p50_ms) ms (p95 $(sbx $b kept_reply_p95_ms) ms)" \
				"scope message, same run: $(sbx $b msg_run_p50_ms) ms / $(sbx $b msg_reply_p50_ms) ms" "target run ≤ 10 ms, reply ≤ ⅓ of scope message"
			row "$be: an idle conversation sandbox's memory (PSS)" "$(sbx $b idle_sandbox_pss_MiB) MiB; with its egress proxy $(sbx $b idle_with_proxy_pss_MiB) MiB" "" ""
		done
		b=BenchmarkConversationSandbox/fifty-idle
		row "landlock: POST → reply beside 50 idle conversation sandboxes (p50)" "$(sbx $b beside_50_reply_p50_ms) ms; the 50 hold $(sbx $b sandboxes_pss_MiB) MiB (PSS)" \
			"without them, same run: $(sbx $b msg_reply_p50_ms) ms" "no degradation"
	else
		row "sandboxes" "did not run: $(grep -m1 -E 'FAIL|panic|cannot|did not' "$out/sandboxes" || tail -n1 "$out/sandboxes")" "" ""
	fi
fi

if has kubernetes; then
	echo "== kubernetes (go test ./e2e -bench Kubernetes -benchtime ${BENCH_KUBE_RUNS:-10}x)" >&2
	kubeenv=${KUBECONFIG:+KUBECONFIG=$KUBECONFIG}
	[ -n "$kubeenv" ] || ! scripts/kube-cluster.sh status >/dev/null 2>&1 || kubeenv=$(scripts/kube-cluster.sh env)
	if [ -z "$kubeenv" ]; then
		row "kubernetes" "did not run: no cluster (KUBECONFIG unset and scripts/kube-cluster.sh is not up)" "" ""
	elif env "$kubeenv" timeout 480 go test ./e2e -run '^$' -bench '^BenchmarkKubernetes(PodCreateToReady|ReplyFromAWarmPod|ReplyFromAColdPod)$' \
		-benchtime "${BENCH_KUBE_RUNS:-10}x" -count 1 -timeout 8m >"$out/kubernetes" 2>&1; then
		k() { bench_metric "$out/kubernetes" "$1" "$2"; }
		row "kubernetes, warm pod (\`warm = 1\`): POST → reply (p50)" "$(k BenchmarkKubernetesReplyFromAWarmPod p50-ms) ms (p95 $(k BenchmarkKubernetesReplyFromAWarmPod p95-ms) ms)" \
			"cold pod, same stack: $(k BenchmarkKubernetesReplyFromAColdPod p50-ms) ms" "target p50 ≤ 100 ms"
		row "kubernetes, cold pod (one per message): POST → reply (p50)" "$(k BenchmarkKubernetesReplyFromAColdPod p50-ms) ms (p95 $(k BenchmarkKubernetesReplyFromAColdPod p95-ms) ms)" \
			"a hardened pod's create → running: $(k BenchmarkKubernetesPodCreateToReady p50-ms) ms (p95 $(k BenchmarkKubernetesPodCreateToReady p95-ms) ms)" "target p50 ≤ 3 s"
	else
		row "kubernetes" "did not run: $(grep -m1 -E 'FAIL|panic|cannot|did not' "$out/kubernetes" || tail -n1 "$out/kubernetes")" "" ""
	fi
fi

echo
echo "berth benchmarks, $(date -u +%Y-%m-%dT%H:%MZ), $(nproc) CPUs, $(uname -r)"
echo
echo "| benchmark | result | baseline (same run) | ratio / target |"
echo "|---|---|---|---|"
printf '%s\n' "${rows[@]}"
