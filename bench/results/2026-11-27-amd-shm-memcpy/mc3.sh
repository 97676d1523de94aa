#!/usr/bin/env bash
# Small messages over shared memory, words (after3) against memcpy, alternately, three
# rounds: thr 64 B and 1 KiB, and the 64 B half round trip.
set -uo pipefail
for i in 1 2 3; do for b in after3 memcpy; do
  timeout 300 /tmp/hayate-$b bench thr --target "hayate://127.0.0.1:0?mode=peer&shm=require&name=shm-$b" \
    --payload 64,1KiB --duration 3s 2>&1 | grep -E -- "-$b" | grep -v WARN
  timeout 300 /tmp/hayate-$b bench lat --target "hayate://127.0.0.1:0?mode=peer&shm=require&name=shm-$b" \
    --payload 64 --duration 3s 2>&1 | grep -E -- "-$b" | grep -v WARN
done; done
