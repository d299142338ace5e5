#!/usr/bin/env bash
# The egress proxy's cost, each figure beside direct, interleaved in the
# same run (services/egress/bench_test.go), on berth's four ways out:
#   provider, HTTP/HTTPS  berth-agent's provider calls: /providers/<name>/… on
#                         the run's socket, berth-egress adding the key (and TLS)
#   tool, HTTP/HTTPS      a tool in the sandbox: HTTP_PROXY=127.0.0.1:3128
#                         (berth-agent's relay) → the run's socket →
#                         berth-egress (a forwarded request; a CONNECT tunnel)
# Latency of a small request (p50) and throughput of a 64 MiB answer, all on
# loopback; and the peak RSS of a real berth-egress process under 32
# concurrent streams (needs root, as berth-egress runs as its own user).
# Medians of -c runs; the load average is printed with them, as the figures
# move with it. Prints a Markdown table (docs/benchmarks.md). Targets: ≥ 90 %
# of direct throughput, ≤ 1 ms added at p50, ≤ 64 MiB RSS.
#
#   scripts/bench-egress.sh [-c COUNT]     (default 5)
set -euo pipefail
cd "$(dirname "$0")/.."

count=5
while getopts c: opt; do
	case "$opt" in
	c) count=$OPTARG ;;
	*) echo "usage: $0 [-c COUNT]" >&2; exit 2 ;;
	esac
done

raw=$(mktemp)
trap 'rm -f "$raw"' EXIT
load_before=$(cut -d' ' -f1-3 /proc/loadavg)
go test ./services/egress -run '^$' -count "$count" -benchtime 400x -bench '^BenchmarkSmallRequest$' -timeout 60m >"$raw"
go test ./services/egress -run '^$' -count "$count" -benchtime 8x -bench '^BenchmarkLargeDownload$' -timeout 60m >>"$raw"
go test ./services/egress -run '^$' -count "$count" -benchtime 1x -bench '^BenchmarkProxyRSS$' -timeout 60m >>"$raw"
load_after=$(cut -d' ' -f1-3 /proc/loadavg)

# median NAME UNIT: the median of the metric UNIT over the runs of benchmark
# NAME (e.g. SmallRequest/tool-http).
median() {
	awk -v name="Benchmark$1" -v unit="$2" '
		{ sub(/-[0-9]+$/, "", $1) }
		$1 == name { for (i = 3; i < NF; i++) if ($(i+1) == unit) v[n++] = $i + 0 }
		END {
			if (n == 0) { print "NaN"; exit }
			for (i = 0; i < n; i++) for (j = i + 1; j < n; j++) if (v[j] < v[i]) { t = v[i]; v[i] = v[j]; v[j] = t }
			print (n % 2) ? v[int(n/2)] : (v[n/2-1] + v[n/2]) / 2
		}' "$raw"
}

met() { awk -v v="$1" -v t="$2" -v dir="$3" 'BEGIN { print ((dir == "ge" && v >= t) || (dir == "le" && v <= t)) ? "met" : "not met" }'; }

echo "| path | direct | through the egress proxy | proxy vs direct | target |"
echo "|---|---|---|---|---|"
for path in provider-http provider-https tool-http tool-https; do
	d=$(median "SmallRequest/$path" direct-p50-us)
	p=$(median "SmallRequest/$path" proxy-p50-us)
	a=$(median "SmallRequest/$path" added-p50-us)
	echo "| small request p50, $path | $d µs | $p µs | +$a µs | ≤ +1000 µs: $(met "$a" 1000 le) |"
done
for path in provider-http provider-https tool-http tool-https; do
	d=$(median "LargeDownload/$path" direct-MB/s)
	p=$(median "LargeDownload/$path" proxy-MB/s)
	r=$(median "LargeDownload/$path" %direct)
	echo "| 64 MiB answer, $path | $(printf %.0f "$d") MB/s | $(printf %.0f "$p") MB/s | $(printf %.0f "$r") % | ≥ 90 %: $(met "$r" 90 ge) |"
done
rss=$(median ProxyRSS VmHWM-MiB)
streams=$(median ProxyRSS streams-at-once)
echo "| berth-egress peak RSS (VmHWM), $(printf %.0f "$streams") streams at once, all four paths | | $(printf %.1f "$rss") MiB | | ≤ 64 MiB: $(met "$rss" 64 le) |"
echo
echo "$count runs each, medians; load average $load_before before, $load_after after ($(nproc) CPUs), $(date -u +%F)."
