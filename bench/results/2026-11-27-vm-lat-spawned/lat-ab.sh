#!/usr/bin/env bash
# The ping loop as the block_on future (before) or as a task on the runtime's workers
# (after), alternately, same targets: half round trip p50 at 64 B. The two builds in
# /tmp/hayate-before and /tmp/hayate-after; one broker (the after build) for both.
set -euo pipefail
cd /work/main
OUT=bench/results/2026-11-27-vm-lat-spawned
BIN=/tmp/hayate-after
tmp=$(mktemp -d)
. bench/lib-broker.sh
start_broker
trap 'stop_broker; rm -rf "$tmp"' EXIT
ADDR=$BROKER_ADDR
for i in 1 2 3; do
for b in before after; do
echo "== $b $i"
/tmp/hayate-$b bench lat --target "hayate://127.0.0.1:0?mode=peer&shm=off&name=hayate-p2p" \
  --target "hayate://127.0.0.1:0?mode=peer&name=hayate-peer" \
  --target "hayate://$ADDR?name=hayate-brokered" \
  --baseline --payload 64 --duration ${DURATION:-3s} --runs ${RUNS:-3} --json $OUT/lat-$b-$i.json 2>&1 | grep -E "hayate|tcp"
done; done
