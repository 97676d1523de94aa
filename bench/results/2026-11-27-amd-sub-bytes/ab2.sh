#!/usr/bin/env bash
# Peer nodes, 64 B and 1 KiB, three builds alternately, three rounds: before (6d29cbb),
# after (byte bound, receiver gives back per batch), after2 (gives back lazily).
set -uo pipefail
for i in 1 2 3; do for b in ${BUILDS:-before after after2}; do
  timeout 200 /tmp/hayate-$b bench thr --target "hayate://127.0.0.1:0?mode=peer&shm=off&name=p2p-$b" \
    --target "hayate://127.0.0.1:0?mode=peer&shm=require&name=shm-$b" \
    --payload ${PAYLOADS:-64,1KiB} --duration 3s 2>&1 | grep -E -- "-$b" | grep -v WARN
done; done
