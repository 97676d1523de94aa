#!/usr/bin/env bash
# A broker's clients on shared memory (shm=require), words (after3) against memcpy; each
# build against its own broker, alternately, two rounds.
set -uo pipefail
for i in 1 2; do for b in after3 memcpy; do
  BIN=/tmp/hayate-$b; tmp=$(mktemp -d); . /work/main/bench/lib-broker.sh; start_broker
  timeout 200 $BIN bench thr --target "hayate://$BROKER_ADDR?shm=require&name=broker-shm-$b" \
    --payload 64KiB,1MiB --duration 3s 2>&1 | grep -E -- "-$b" | grep -v WARN
  timeout 200 $BIN bench fanout --target "hayate://$BROKER_ADDR?shm=require&name=broker-shm-$b" \
    --payload 64KiB --subscribers 20 --duration 3s 2>&1 | grep -E -- "-$b" | grep -v WARN
  stop_broker; rm -rf "$tmp"
done; done
