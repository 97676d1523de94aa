#!/usr/bin/env bash
# Geometries, alternately, three rounds: 64 B, 64 KiB, 1 MiB, raw TCP once per round.
set -uo pipefail
for i in 1 2 3; do
  for g in 1024:65536 1024:16384 512:32768 512:16384; do
    s=${g%:*}; b=${g#*:}
    timeout 300 /tmp/hayate-trailer bench thr --target "hayate://127.0.0.1:0?mode=peer&shm=require&slots=$s&slot=$b&name=shm-$s-x-$b" \
      --payload ${PAYLOADS:-64,64KiB,1MiB} --duration 3s 2>&1 | grep -E -- "shm-|rror" | grep -v WARN
  done
  timeout 300 /tmp/hayate-trailer bench thr --target "hayate://127.0.0.1:0?mode=peer&shm=off&name=p2p" --baseline \
      --payload 1MiB --duration 3s 2>&1 | grep -E -- "tcp" | grep -v WARN
done
