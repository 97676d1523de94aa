#!/usr/bin/env bash
set -euo pipefail
cd /work/main
BIN=${BIN:-target/release/hayate}
tmp=$(mktemp -d)
TOKIO_WORKER_THREADS=1 $BIN broker --listen 127.0.0.1:34222 --mqtt off --ws off --stomp off --admin off --data "" --amqp 127.0.0.1:35672 >"$tmp/o" 2>&1 &
p1=$!
$BIN broker --listen 127.0.0.1:34223 --mqtt off --ws off --stomp off --admin off --data "" --amqp 127.0.0.1:35673 >"$tmp/o2" 2>&1 &
p2=$!
trap 'kill $p1 $p2 2>/dev/null || true; rm -rf "$tmp"' EXIT
for _ in $(seq 100); do grep -q ready "$tmp/o" && grep -q ready "$tmp/o2" && break; sleep 0.05; done
$BIN bench rpc --target "amqp://127.0.0.1:35672?client=hayate&name=w1" \
  --target "amqp://127.0.0.1:35673?client=hayate&name=w2" \
  --calls ${CALLS:-20k} --concurrency ${CONC:-none} --runs ${RUNS:-3} ${EXTRA:-}
