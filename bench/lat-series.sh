#!/usr/bin/env bash
# bench/lat-series.sh OUT_DIR RUNS TARGET_URL... [-- flags]: bench/series.sh lat (see there).
exec "$(dirname "$0")/series.sh" lat "$@"
