#!/usr/bin/env bash
# Peer nodes over shared memory, thr, the builds alternately: base (ba539d0: the reader
# never yields), fix2 (7d0240f: yields after a burst when the ring has more) and burst (the
# same plus bursts capped at 1 MiB of chunks). Binaries in /tmp/hayate-{base,fix2,burst}.
set -uo pipefail
for i in 1 2; do for b in ${BUILDS:-base fix2 burst}; do
  timeout 120 /tmp/hayate-$b bench thr --target "hayate://127.0.0.1:0?mode=peer&shm=require&name=shm-$b" \
    --payload ${PAYLOADS:-1KiB,64KiB,1MiB,4MiB} --duration 3s 2>&1 | grep -E "shm-" | grep -v WARN
done; done
