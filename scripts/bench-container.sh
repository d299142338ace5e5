#!/usr/bin/env bash
# Latency of the container backend: Submit → berth-agent read its request,
# → it answered, and → the run's end, cold and warm, with the container's end
# before and after the reply, beside `docker run --rm -i` of the same image
# and flags, measured in the same run. Prints Markdown tables
# (docs/benchmarks.md).
#
#   scripts/bench-container.sh [-n RUNS] [-agent BERTH-AGENT]
#                                  (as root; default 50 runs each; -agent runs
#                                   a prebuilt static berth-agent)
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib.sh
ensure_docker
ensure_packages :busybox-static
exec go run ./scripts/bench-container "$@"
