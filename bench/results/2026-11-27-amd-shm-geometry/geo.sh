#!/usr/bin/env bash
# Peer ring geometry at 1 MiB and 64 KiB: the default 1024 slots x 64 KiB (64 MiB) against
# smaller rings, alternately, two rounds, raw TCP in the same run.
set -uo pipefail
for i in 1 2; do for s in 1024 256 128; do
  timeout 300 /tmp/hayate-trailer bench thr --target "hayate://127.0.0.1:0?mode=peer&shm=require&slots=$s&name=shm-slots$s" \
    --baseline --payload ${PAYLOADS:-64KiB,1MiB} --duration 3s 2>&1 | grep -E -- "slots|tcp" | grep -v WARN
done; done
