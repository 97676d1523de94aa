#!/usr/bin/env bash
# Shared-memory copies by memcpy: before (words: the build of 7a1e4c1-ish, subscription bytes) against
# after (memcpy), alternately, two rounds; peer nodes over shared memory, with raw TCP
# (--baseline) in the same run.
set -uo pipefail
for i in 1 2; do for b in ${BUILDS:-after3 memcpy}; do
  timeout 300 /tmp/hayate-$b bench thr --target "hayate://127.0.0.1:0?mode=peer&shm=require&name=shm-$b" \
    --baseline --payload ${PAYLOADS:-1KiB,64KiB,1MiB,4MiB} --duration 3s 2>&1 | grep -E -- "-$b|tcp" | grep -v WARN
done; done
