#!/usr/bin/env bash
# The fan-out bar on the build with peer in-place reads: ../2026-11-27-amd-fanout/run.sh
# with its output here.
OUT=bench/results/2026-11-27-amd-fanout-3 exec "$(dirname "$0")/../2026-11-27-amd-fanout/run.sh" "$@"
