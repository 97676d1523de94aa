#!/usr/bin/env bash
# The fan-out bar again on the final build of the day: ../2026-11-27-amd-fanout/run.sh
# with its output here.
OUT=bench/results/2026-11-27-amd-fanout-2 exec "$(dirname "$0")/../2026-11-27-amd-fanout/run.sh" "$@"
