#!/usr/bin/env bash
# Peer ring geometries (slots x slot bytes), alternately, two rounds: 64 B to 1 MiB.
set -uo pipefail
for i in 1 2; do for g in 1024:65536 256:65536 512:16384 1024:16384; do
  s=${g%:*}; b=${g#*:}
  timeout 300 /tmp/hayate-trailer bench thr --target "hayate://127.0.0.1:0?mode=peer&shm=require&slots=$s&slot=$b&name=shm-$s-x-$b" \
    --payload ${PAYLOADS:-64,1KiB,64KiB,1MiB} --duration 3s 2>&1 | grep -E -- "shm-" | grep -v WARN
done; done
