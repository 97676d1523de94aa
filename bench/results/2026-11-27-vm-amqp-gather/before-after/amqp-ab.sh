#!/usr/bin/env bash
# Before/after/RabbitMQ, AMQP RPC with the workspace's own client, one run.
set -euo pipefail
cd /work/main
OUT=${OUT:-/tmp/amqp-ab}
mkdir -p "$OUT"
tmp=$(mktemp -d)
/tmp/hayate-before broker --listen 127.0.0.1:0 --mqtt off --ws off --stomp off --admin off --data "" --amqp 127.0.0.1:35601 >"$tmp/o1" 2>&1 &
p1=$!
/tmp/hayate-after broker --listen 127.0.0.1:0 --mqtt off --ws off --stomp off --admin off --data "" --amqp 127.0.0.1:35602 >"$tmp/o2" 2>&1 &
p2=$!
trap 'kill $p1 $p2 2>/dev/null || true; bench/peers/rabbitmq.sh stop >/dev/null 2>&1 || true; rm -rf "$tmp"' EXIT
for _ in $(seq 100); do grep -q ready "$tmp/o1" && grep -q ready "$tmp/o2" && break; sleep 0.05; done
bench/peers/rabbitmq.sh start
/tmp/hayate-before bench rpc --target "amqp://127.0.0.1:35601?client=hayate&name=before" \
  --target "amqp://127.0.0.1:35602?client=hayate&name=after" \
  --target "amqp://127.0.0.1:5672?client=hayate&name=rabbitmq" \
  --calls 20k --concurrency 16 --concurrent-calls 20k --runs ${RUNS:-5} --json "$OUT/rpc.json"
