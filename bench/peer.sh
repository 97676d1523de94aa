#!/usr/bin/env bash
# Peer mode (issue 15): Hayate peer nodes against Zenoh peers, Hayate brokered and raw TCP, in
# one run. thr at 64 B and 1 KiB, lat at 64 B (half round trip). Needs the release build with
# the peers feature: cargo build --release -p hayate --features hayate/peers
# Writes bench/results/<date>-vm-peer/{thr,lat,lat-own-threads}.json and prints the tables.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-target/release/hayate}
OUT=${OUT:-bench/results/$(date +%F)-vm-peer}
DURATION=${DURATION:-5s}
mkdir -p "$OUT"
tmp=$(mktemp -d)
. bench/lib-broker.sh
start_broker
trap 'stop_broker; rm -rf "$tmp"' EXIT
addr=$BROKER_ADDR
# hayate-p2p: peer nodes over TCP (shared memory off); hayate-shm: the same nodes over shared
# memory (both in this process, so on one host); hayate-shm-spin: readers poll their ring
# for 200 us before sleeping (busy polling, for the latency bar).
targets=(--target "hayate://127.0.0.1:0?mode=peer&shm=off&name=hayate-p2p"
         --target "hayate://127.0.0.1:0?mode=peer&shm=require&name=hayate-shm"
         --target "zenoh://127.0.0.1:0?mode=peer&name=zenoh-p2p"
         --target "hayate://$addr?name=hayate-brokered")
"$BIN" bench thr "${targets[@]}" --baseline --payload 64,1KiB,1MiB --duration "$DURATION" --json "$OUT/thr.json"
"$BIN" bench lat "${targets[@]}" --target "hayate://127.0.0.1:0?mode=peer&shm=require&spin=200&name=hayate-shm-spin" \
    --baseline --payload 64 --duration "$DURATION" --json "$OUT/lat.json"
# The same with each side on a thread and one-worker runtime of its own (as two
# single-threaded processes would be), beside raw TCP on blocking threads and on Tokio.
"$BIN" bench lat "${targets[@]}" --own-threads --baseline --payload 64 --duration "$DURATION" \
    --json "$OUT/lat-own-threads.json"
cat /proc/cpuinfo | grep -m1 "model name" >"$OUT/machine.txt"; nproc >>"$OUT/machine.txt"
