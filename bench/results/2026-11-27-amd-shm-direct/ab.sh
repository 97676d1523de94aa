#!/usr/bin/env bash
# Reader copies straight into the frame's allocation (new) against through a 4 KiB stack
# buffer (base), alternately, three rounds: peer nodes over shared memory at 64 B, 64 KiB
# and 1 MiB, raw TCP at 1 MiB in each round. BASE and NEW are the two release builds.
set -uo pipefail
BASE=${BASE:-/tmp/hayate-base} NEW=${NEW:-/tmp/hayate-new}
for i in 1 2 3; do
  for b in base new; do
    bin=$BASE; [ $b = new ] && bin=$NEW
    timeout 300 "$bin" bench thr --target "hayate://127.0.0.1:0?mode=peer&shm=require&name=shm-$b" \
      --payload ${PAYLOADS:-64,64KiB,1MiB} --duration 3s 2>&1 | grep -E -- "shm-|rror" | grep -v WARN
  done
  timeout 300 "$NEW" bench thr --target "hayate://127.0.0.1:0?mode=peer&shm=off&name=p2p" --baseline \
      --payload 1MiB --duration 3s 2>&1 | grep -E -- "tcp" | grep -v WARN
done
