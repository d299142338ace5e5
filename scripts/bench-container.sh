#!/usr/bin/env bash
# Latency of the container backend: Submit → berth-agent read its request,
# cold and warm, beside `docker run --rm -i` of the same image and flags,
# measured in the same run. Prints a Markdown table (docs/benchmarks.md).
#
#   scripts/bench-container.sh [-n RUNS]     (as root; default 50 runs each)
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib.sh
ensure_docker
[ -e /usr/share/doc/busybox-static ] || ensure_packages busybox-static-is-missing:busybox-static
exec go run ./scripts/bench-container "$@"
