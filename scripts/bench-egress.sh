#!/usr/bin/env bash
# The egress proxy's cost, each figure beside direct from the same run:
# latency of a small request and throughput of a 64 MiB download (plain
# HTTP, decided per request; HTTPS, a CONNECT tunnel), on two paths:
#   provider  berth-agent's provider calls: the run's socket → berth-egress
#   tool      a tool in the sandbox: HTTP_PROXY=127.0.0.1:3128 (berth-agent's
#             loopback proxy) → the run's socket → berth-egress
# All on loopback (services/egress/bench_test.go); medians of -c runs.
# Prints a Markdown table (docs/benchmarks.md); targets: ≥ 80 % of direct
# throughput, ≤ 2 ms added per request.
#
#   scripts/bench-egress.sh [-c COUNT]     (default 5; any user)
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
go test ./services/egress -run '^$' -count "$count" -benchtime 2000x -bench '^BenchmarkSmallRequest$' >"$raw"
go test ./services/egress -run '^$' -count "$count" -benchtime 8x -bench '^BenchmarkLargeDownload(HTTPS)?$' >>"$raw"

# median NAME FIELD: the median of FIELD (ns/op or MB/s) over the runs of
# benchmark NAME (e.g. SmallRequest/proxy).
median() {
	awk -v name="Benchmark$1" -v unit="$2" '
		{ sub(/-[0-9]+$/, "", $1) }
		$1 == name { for (i = 3; i < NF; i++) if ($(i+1) == unit) v[n++] = $i }
		END {
			if (n == 0) { print "NaN"; exit }
			for (i = 0; i < n; i++) for (j = i + 1; j < n; j++) if (v[j] < v[i]) { t = v[i]; v[i] = v[j]; v[j] = t }
			print (n % 2) ? v[int(n/2)] : (v[n/2-1] + v[n/2]) / 2
		}' "$raw"
}

us() { awk -v ns="$1" 'BEGIN { printf "%.0f µs", ns / 1000 }'; }
added() { awk -v d="$1" -v p="$2" 'BEGIN { printf "%+.0f µs (target ≤ +2 ms)", (p - d) / 1000 }'; }
mbs() { awk -v v="$1" 'BEGIN { printf "%.0f MB/s", v }'; }
ratio() { awk -v d="$1" -v p="$2" 'BEGIN { printf "%.0f %% (target ≥ 80 %%)", 100 * p / d }'; }

echo "| path | direct | through the egress proxy | proxy vs direct |"
echo "|---|---|---|---|"
d=$(median SmallRequest/direct ns/op)
for path in proxy:provider sandbox:tool; do
	p=$(median "SmallRequest/${path%%:*}" ns/op)
	echo "| small request, ${path#*:} path | $(us "$d") | $(us "$p") | $(added "$d" "$p") |"
done
for bench in LargeDownload:HTTP LargeDownloadHTTPS:"HTTPS (CONNECT tunnel)"; do
	d=$(median "${bench%%:*}/direct" MB/s)
	for path in proxy:provider sandbox:tool; do
		p=$(median "${bench%%:*}/${path%%:*}" MB/s)
		echo "| 64 MiB download, ${bench#*:}, ${path#*:} path | $(mbs "$d") | $(mbs "$p") | $(ratio "$d" "$p") |"
	done
done
