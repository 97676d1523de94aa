#!/usr/bin/env bash
# Shared memory between the broker and its clients on one host (issue 15): the same broker,
# clients on TCP (shm=off) and on shared memory (shm=require), in one run. thr at 64 B, 1 KiB
# and 1 MiB, lat at 64 B, rpc at concurrency 1 and 16, fan-out to 1..20 subscriber processes.
# Needs the release build: cargo build --release -p hayate --features hayate/peers
# Writes bench/results/<date>-vm-broker-shm/{thr,lat,rpc,fanout}.json and prints the tables.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-target/release/hayate}
OUT=${OUT:-bench/results/$(date +%F)-vm-broker-shm}
DURATION=${DURATION:-5s}
mkdir -p "$OUT"
tmp=$(mktemp -d)
. bench/lib-broker.sh
start_broker
trap 'stop_broker; rm -rf "$tmp"' EXIT
addr=$BROKER_ADDR
targets=(--target "hayate://$addr?shm=off&name=hayate-tcp"
         --target "hayate://$addr?shm=require&name=hayate-shm")
"$BIN" bench thr "${targets[@]}" --baseline --payload 64,1KiB,1MiB --duration "$DURATION" --json "$OUT/thr.json"
"$BIN" bench lat "${targets[@]}" --baseline --payload 64 --duration "$DURATION" --json "$OUT/lat.json"
"$BIN" bench rpc "${targets[@]}" --concurrency 1,16 --duration "$DURATION" --json "$OUT/rpc.json"
"$BIN" bench fanout "${targets[@]}" --payload 1KiB --duration "$DURATION" --json "$OUT/fanout.json"
cat /proc/cpuinfo | grep -m1 "model name" >"$OUT/machine.txt"; nproc >>"$OUT/machine.txt"
