#!/usr/bin/env bash
# Three builds and RabbitMQ, AMQP RPC with the workspace's own client, one run.
set -euo pipefail
cd /work/main
OUT=${OUT:-/tmp/amqp-abc}
mkdir -p "$OUT"
tmp=$(mktemp -d)
pids=()
i=1
for b in before gather inline; do
  /tmp/hayate-$b broker --listen 127.0.0.1:0 --mqtt off --ws off --stomp off --admin off --data "" --amqp 127.0.0.1:3560$i >"$tmp/o$i" 2>&1 &
  pids+=($!)
  i=$((i+1))
done
trap 'kill ${pids[*]} 2>/dev/null || true; bench/peers/rabbitmq.sh stop >/dev/null 2>&1 || true; rm -rf "$tmp"' EXIT
for _ in $(seq 100); do grep -q ready "$tmp/o1" && grep -q ready "$tmp/o2" && grep -q ready "$tmp/o3" && break; sleep 0.05; done
bench/peers/rabbitmq.sh start >/dev/null
/tmp/hayate-before bench rpc --target "amqp://127.0.0.1:35601?client=hayate&name=before" \
  --target "amqp://127.0.0.1:35602?client=hayate&name=gather" \
  --target "amqp://127.0.0.1:35603?client=hayate&name=inline" \
  --target "amqp://127.0.0.1:5672?client=hayate&name=rabbitmq" \
  --calls 20k --concurrency 16 --concurrent-calls 20k --runs ${RUNS:-5} --json "$OUT/rpc.json"
