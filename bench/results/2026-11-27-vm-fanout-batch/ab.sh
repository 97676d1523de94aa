#!/usr/bin/env bash
# Fan-out at 1 KiB (and $PAYLOADS), one broker (the after build), the benchmark of the build
# before (subscribers take one message at a time, each MSG_BATCH decoded into a Bytes per
# payload on the reader) and after (MSG_BATCH payloads kept as they came, `next_batch`),
# alternately: 20 subscribers reading the arena in place, 1 and 20 on TCP.
set -euo pipefail
cd /work/main
OUT=bench/results/2026-11-27-vm-fanout-batch
BIN=/tmp/hayate-items
tmp=$(mktemp -d)
. bench/lib-broker.sh
start_broker
trap 'stop_broker; rm -rf "$tmp"' EXIT
for i in 1 2; do
for b in after items; do
for p in ${PAYLOADS:-1KiB}; do
echo "== $b $i $p"
/tmp/hayate-$b bench fanout --target "hayate://$BROKER_ADDR?shm=require&name=broker-shm-in-place" \
  --target "hayate://$BROKER_ADDR?shm=off&name=broker-tcp" \
  --subscribers 1,20 --payload $p --duration ${DURATION:-3s} --warmup 1s ${TOUCH:+--touch} \
  --json $OUT/fanout-$b-$i-$p${TOUCH:+-touch}.json 2>&1 | grep -E "KiB|MiB"
done; done; done
