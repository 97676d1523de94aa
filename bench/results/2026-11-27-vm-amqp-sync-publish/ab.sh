#!/usr/bin/env bash
# Two builds side by side and RabbitMQ: AMQP RPC with the workspace's own client, one run.
set -euo pipefail
cd /work/main
OUT=${OUT:-/tmp/ab2}
mkdir -p "$OUT"
tmp=$(mktemp -d)
pids=()
i=1
for b in /tmp/hayate-before /tmp/hayate-after; do
  $b broker --listen 127.0.0.1:0 --mqtt off --ws off --stomp off --admin off --data "" --amqp 127.0.0.1:3560$i >"$tmp/o$i" 2>&1 &
  pids+=($!)
  i=$((i+1))
done
trap 'kill ${pids[*]} 2>/dev/null || true; bench/peers/rabbitmq.sh stop >/dev/null 2>&1 || true; rm -rf "$tmp"' EXIT
for _ in $(seq 100); do grep -q ready "$tmp/o1" && grep -q ready "$tmp/o2" && break; sleep 0.05; done
bench/peers/rabbitmq.sh start >/dev/null
/tmp/hayate-after bench thr --target "amqp://127.0.0.1:35601?client=hayate&name=before" \
  --target "amqp://127.0.0.1:35602?client=hayate&name=after" \
  --target "amqp://127.0.0.1:5672?client=hayate&name=rabbitmq" --payload 64,1KiB --duration 3s --json "$OUT/thr.json"
/tmp/hayate-after bench rpc --target "amqp://127.0.0.1:35601?client=hayate&name=before" \
  --target "amqp://127.0.0.1:35602?client=hayate&name=after" \
  --target "amqp://127.0.0.1:5672?client=hayate&name=rabbitmq" --baseline \
  --calls 20k --concurrency 16 --concurrent-calls 20k --runs ${RUNS:-5} --json "$OUT/rpc.json"
