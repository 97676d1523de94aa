#!/usr/bin/env bash
# Fan-out (issue 15): one publisher, 1 to 20 subscriber processes on this host, aggregate
# throughput, for Hayate peer nodes over shared memory and over TCP, Hayate brokered (its
# clients on TCP, and on shared memory with the broker), Zenoh peers (each subscriber a peer
# connected to the publisher's session, TCP), the Zenoh router (zenohd, when
# bench/peers/zenoh.sh install has been run: publisher and subscribers are its clients),
# nats-server and Cyclone DDS (ddsperf pub and sub processes, when bench/peers/cyclonedds.sh
# install has been run), in one run. Needs the release build with the peers feature
# (cargo build --release -p hayate --features hayate/peers) and nats-server
# (bench/peers/nats.sh install). Writes bench/results/<date>-vm-fanout/fanout.json and the chart.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-target/release/hayate}
OUT=${OUT:-bench/results/$(date +%F)-vm-fanout}
DURATION=${DURATION:-3s}
PAYLOAD=${PAYLOAD:-1KiB}
SUBS=${SUBS:-1,2,5,10,20}
NATS_PORT=${NATS_PORT:-14222}
ZENOH_PORT=${ZENOH_PORT:-17447}
mkdir -p "$OUT"
tmp=$(mktemp -d)
. bench/lib-broker.sh
start_broker
bench/peers/nats.sh start "$NATS_PORT" >/dev/null
router=()
if bench/peers/zenoh.sh version >/dev/null 2>&1; then
    bench/peers/zenoh.sh start "$ZENOH_PORT" >/dev/null
    router=(--target "zenoh://127.0.0.1:$ZENOH_PORT?name=zenoh-router")
fi
dds=()
command -v ddsperf >/dev/null && dds=(--ddsperf)
trap 'stop_broker; bench/peers/nats.sh stop "$NATS_PORT" >/dev/null 2>&1 || true; bench/peers/zenoh.sh stop "$ZENOH_PORT" >/dev/null 2>&1 || true; rm -rf "$tmp"' EXIT
addr=$BROKER_ADDR
"$BIN" bench fanout \
    --target "hayate://127.0.0.1:0?mode=peer&shm=require&name=hayate-shm" \
    --target "hayate://127.0.0.1:0?mode=peer&shm=off&name=hayate-p2p" \
    --target "hayate://$addr?shm=off&name=hayate-brokered" \
    --target "hayate://$addr?shm=require&name=hayate-brokered-shm" \
    --target "zenoh://127.0.0.1:0?mode=peer&name=zenoh-p2p" "${router[@]}" \
    --target "nats://127.0.0.1:$NATS_PORT?name=nats" \
    "${dds[@]}" --subscribers "$SUBS" --payload "$PAYLOAD" --duration "$DURATION" --warmup 1s \
    --json "$OUT/fanout.json"
grep -m1 "model name" /proc/cpuinfo >"$OUT/machine.txt"; nproc >>"$OUT/machine.txt"
