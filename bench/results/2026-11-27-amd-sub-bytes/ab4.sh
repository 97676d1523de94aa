#!/usr/bin/env bash
# shm 64 B only, three builds alternately, six rounds.
set -uo pipefail
for i in 1 2 3 4 5 6; do for b in before after after3; do
  timeout 100 /tmp/hayate-$b bench thr --target "hayate://127.0.0.1:0?mode=peer&shm=require&name=shm-$b" \
    --payload 64 --duration 2s 2>&1 | grep -E -- "-$b" | grep -v WARN
done; done
