#!/usr/bin/env bash
# old (one-worker multi-thread runtimes) vs new (current-thread) own-threads lat, peer + baseline
cd /work/main
for i in 1 2 3; do
for b in /tmp/hayate-after /tmp/hayate-ct; do
echo "== $b"
$b bench lat --target "hayate://127.0.0.1:0?mode=peer&shm=off&name=hayate-p2p" --own-threads --baseline --payload 64 --duration ${DURATION:-3s} --runs ${RUNS:-3} 2>&1 | grep -E "hayate-p2p|tcp"
done; done
