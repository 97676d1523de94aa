#!/usr/bin/env bash
# Default geometry (1024 x 64 KiB) against 512 x 16 KiB, alternately, three rounds: 64 KiB,
# 4 MiB and 16 MiB (larger than the 8 MiB ring).
set -uo pipefail
for i in 1 2 3; do for g in 1024:65536 512:16384; do
  s=${g%:*}; b=${g#*:}
  timeout 300 /tmp/hayate-trailer bench thr --target "hayate://127.0.0.1:0?mode=peer&shm=require&slots=$s&slot=$b&name=shm-$s-x-$b" \
    --payload ${PAYLOADS:-64KiB,4MiB,16MiB} --duration 3s 2>&1 | grep -E -- "shm-|rror" | grep -v WARN
done; done
