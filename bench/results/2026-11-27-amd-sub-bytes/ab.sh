#!/usr/bin/env bash
# Subscription byte bound: before (6d29cbb) against after, alternately, two rounds.
# Peer nodes over TCP and shared memory, and a broker's clients over TCP (each build
# against its own broker).
set -uo pipefail
for i in 1 2; do for b in before after; do
  BIN=/tmp/hayate-$b
  timeout 200 $BIN bench thr --target "hayate://127.0.0.1:0?mode=peer&shm=off&name=p2p-$b" \
    --target "hayate://127.0.0.1:0?mode=peer&shm=require&name=shm-$b" \
    --payload 64,1KiB,1MiB --duration 3s 2>&1 | grep -E -- "-$b" | grep -v WARN
  tmp=$(mktemp -d); . /work/main/bench/lib-broker.sh; start_broker
  timeout 200 $BIN bench thr --target "hayate://$BROKER_ADDR?shm=off&name=broker-$b" \
    --payload 64,1KiB,1MiB --duration 3s 2>&1 | grep -E -- "-$b" | grep -v WARN
  stop_broker; rm -rf "$tmp"
done; done
