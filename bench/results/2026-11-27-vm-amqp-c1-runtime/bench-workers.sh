#!/usr/bin/env bash
# c1w.sh: hayate amqp vs rabbitmq at c=1, bench runtime default vs one worker (BW=1)
set -euo pipefail
cd /work/main
BIN=${BIN:-target/release/hayate}
tmp=$(mktemp -d)
$BIN broker --listen 127.0.0.1:34222 --mqtt off --ws off --stomp off --admin off --data "" --amqp 127.0.0.1:35672 >"$tmp/o" 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null || true; bench/peers/rabbitmq.sh stop >/dev/null 2>&1 || true; rm -rf "$tmp"' EXIT
for _ in $(seq 100); do grep -q ready "$tmp/o" && break; sleep 0.05; done
bench/peers/rabbitmq.sh start >/dev/null
for i in 1 2 3; do
for w in 2 1; do
echo "== bench workers $w"
TOKIO_WORKER_THREADS=$w $BIN bench rpc \
  --target "amqp://127.0.0.1:35672?client=hayate&name=amqp" \
  --target "amqp://127.0.0.1:5672?client=hayate&name=rabbitmq" \
  --calls ${CALLS:-20k} --concurrency ${CONC:-none} --runs ${RUNS:-3} ${EXTRA:-} 2>&1 | grep -E "^ +[0-9]+ "
done; done
