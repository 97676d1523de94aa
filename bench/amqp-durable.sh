#!/usr/bin/env bash
# AMQP durable queues (issue 17): persistent messages (delivery mode 2) with publisher
# confirms into a durable queue consumed with acknowledgements, Hayate (its [amqp] fsync
# default, `always`: a confirm means fsynced) against RabbitMQ, the same client (the
# workspace's own, `client=hayate&durable=1`) in one run: thr at 64 B, 1 KiB and 16 KiB, and
# the 64 B latency of one message at a time (the publisher's confirm is not waited for).
# bench/peers/rabbitmq.sh starts RabbitMQ.
# Needs the release build with the peers feature: cargo build --release -p hayate --features
# hayate/peers. Writes bench/results/<date>-vm-amqp-durable/{thr,lat}.json.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-target/release/hayate}
OUT=${OUT:-bench/results/$(date +%F)-vm-amqp-durable}
DURATION=${DURATION:-5s}
PORT=${PORT:-35672}
mkdir -p "$OUT"
tmp=$(mktemp -d)
"$BIN" broker --listen 127.0.0.1:0 --mqtt off --ws off --stomp off --admin off \
    --data "$tmp/data" --amqp "127.0.0.1:$PORT" >"$tmp/out" 2>"$tmp/err" &
pid=$!
trap 'kill $pid 2>/dev/null || true; bench/peers/rabbitmq.sh stop >/dev/null 2>&1 || true; rm -rf "$tmp"' EXIT
for _ in $(seq 100); do grep -q ready "$tmp/out" && break; sleep 0.05; done
bench/peers/rabbitmq.sh start
targets=(--target "amqp://127.0.0.1:$PORT?client=hayate&durable=1&name=hayate-amqp-durable"
         --target "amqp://127.0.0.1:5672?client=hayate&durable=1&name=rabbitmq-durable")
"$BIN" bench thr "${targets[@]}" --payload 64,1KiB,16KiB --duration "$DURATION" \
    --json "$OUT/thr.json"
"$BIN" bench lat "${targets[@]}" --payload 64 --duration "$DURATION" --json "$OUT/lat.json"
grep -m1 "model name" /proc/cpuinfo >"$OUT/machine.txt"; nproc >>"$OUT/machine.txt"
bench/peers/rabbitmq.sh version >>"$OUT/machine.txt" 2>/dev/null || true
