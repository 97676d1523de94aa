#!/usr/bin/env bash
# AMQP 0-9-1 (issue 17): Hayate's AMQP listener against RabbitMQ, the same client in one run:
# thr at 64 B and 1 KiB (amq.topic, a server-named exclusive queue, no-ack) with lapin and
# with the workspace's own client, and RPC by direct reply-to at concurrency 1 and 16 (both
# clients, ours on Tokio and on blocking threads), beside the floor of any brokered call on
# this host (`--baseline`: a relay process that only copies bytes between the callers and a
# server process; system `tcp`).
# bench/peers/rabbitmq.sh starts RabbitMQ.
# Needs the release build with the peers feature: cargo build --release -p hayate --features
# hayate/peers. Writes bench/results/<date>-vm-amqp/{thr,rpc}.json and prints the tables.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-target/release/hayate}
OUT=${OUT:-bench/results/$(date +%F)-vm-amqp}
DURATION=${DURATION:-5s}
PORT=${PORT:-35672}
mkdir -p "$OUT"
tmp=$(mktemp -d)
"$BIN" broker --listen 127.0.0.1:0 --mqtt off --ws off --stomp off --admin off --data "" \
    --amqp "127.0.0.1:$PORT" >"$tmp/out" 2>"$tmp/err" &
pid=$!
trap 'kill $pid 2>/dev/null || true; bench/peers/rabbitmq.sh stop >/dev/null 2>&1 || true; rm -rf "$tmp"' EXIT
for _ in $(seq 100); do grep -q ready "$tmp/out" && break; sleep 0.05; done
bench/peers/rabbitmq.sh start
targets=(--target "amqp://127.0.0.1:$PORT?name=hayate-amqp"
         --target "amqp://127.0.0.1:5672?name=rabbitmq")
# Throughput with lapin, and with the workspace's own AMQP client (hayate-amqp codec,
# `client=hayate`), which costs less per message: both clients against both brokers.
own=(--target "amqp://127.0.0.1:$PORT?client=hayate&name=hayate-amqp/own-client"
     --target "amqp://127.0.0.1:5672?client=hayate&name=rabbitmq/own-client")
"$BIN" bench thr "${targets[@]}" "${own[@]}" --payload 64,1KiB --duration "$DURATION" \
    --json "$OUT/thr.json"
# RPC also with the own client on blocking threads (io=blocking: each caller and the server
# blocked in its socket's reads, as the relay's are).
blocking=(--target "amqp://127.0.0.1:$PORT?client=hayate&io=blocking&name=hayate-amqp/own-blocking"
          --target "amqp://127.0.0.1:5672?client=hayate&io=blocking&name=rabbitmq/own-blocking")
"$BIN" bench rpc "${targets[@]}" "${own[@]}" "${blocking[@]}" --baseline --calls 20k --concurrency 16 --concurrent-calls 20k \
    --runs "${RUNS:-3}" --json "$OUT/rpc.json"
grep -m1 "model name" /proc/cpuinfo >"$OUT/machine.txt"; nproc >>"$OUT/machine.txt"
bench/peers/rabbitmq.sh version >>"$OUT/machine.txt" 2>/dev/null || true
