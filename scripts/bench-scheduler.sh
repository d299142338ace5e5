#!/bin/sh
# bench-scheduler.sh: the scheduler's figures at 1k, 10k and 100k stored runs
# (Submit, ListRuns first page and filtered by state, a restart's reconcile,
# the db file size) and the file size under retention once its window is
# full. Results go to docs/benchmarks.md by hand. Takes about 2-3 minutes.
set -eu
cd "$(dirname "$0")/.."
go test ./services/scheduler -run '^$' -bench '^BenchmarkScheduler$' -benchtime "${BENCHTIME:-100x}" -count 1 -timeout 10m
go test ./services/scheduler -run '^$' -bench '^BenchmarkRetentionSteadySize$' -benchtime 1x -count 1 -timeout 10m
