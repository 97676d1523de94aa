#!/usr/bin/env bash
# Durable publishing, Hayate streams vs Kafka 4.1 (KRaft, 1 partition), on this machine in one
# run, 64 B / 1 KiB / 64 KiB payloads:
#   - Hayate: `hayate bench durable` (one connection, 1024 confirms outstanding, then one
#     message at a time for the latency), fsync `always` (group commit) and `interval=100`;
#   - Kafka: its own ProducerPerformance, acks=1 with the default flush policy (the OS writes
#     back; like Hayate's `interval`, a confirm means "in the page cache"), and acks=1 on a
#     topic with flush.messages=1 (fsync per message batch, like Hayate's `always`);
#     throughput at --throughput -1, latency with --throughput 500 (unloaded).
# Writes bench/results/<date>-<host>-durable/ (or $1): the raw outputs and a summary.
#
#   cargo build --release -p hayate && bench/durable-vs-kafka.sh
#
# Environment: HAYATE_BIN (default target/release/hayate), DURATION (Hayate's throughput part
# per point, default 5s), KAFKA_SCALE (divides Kafka's record counts: 5 for a quick run),
# SKIP_KAFKA=1 (Hayate only). `hayate bench compare` runs this script for its durable rows.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
OUT="${1:-$ROOT/bench/results/$(date +%F)-$(hostname -s)-durable}"
HAYATE="${HAYATE_BIN:-$ROOT/target/release/hayate}"
DURATION="${DURATION:-5s}"
mkdir -p "$OUT"
LIBS="$ROOT/bench/peers/bin/kafka-libs"
PORT=19092

# --- Hayate ---------------------------------------------------------------------------------
data="$(mktemp -d)"
"$HAYATE" broker --listen 127.0.0.1:0 --mqtt off --ws off --stomp off --amqp off --admin off --data "$data" >"$OUT/hayate-broker.log" 2>&1 &
bpid=$!
trap 'kill $bpid 2>/dev/null || true; "$ROOT/bench/peers/kafka.sh" stop >/dev/null 2>&1 || true; rm -rf "$data"' EXIT
for _ in $(seq 100); do grep -q ready "$OUT/hayate-broker.log" && break; sleep 0.1; done
addr="$(sed -n 's/^hayate broker: native protocol on //p' "$OUT/hayate-broker.log" | head -1)"
echo "== hayate $("$HAYATE" --version 2>/dev/null || true) on $addr (data $data)" | tee "$OUT/hayate.txt"
"$HAYATE" bench durable --server "$addr" --payload 64,1KiB,64KiB --duration "$DURATION" \
    --json "$OUT/hayate.jsonl" | tee -a "$OUT/hayate.txt"
kill $bpid; wait $bpid 2>/dev/null || true

# --- Kafka ----------------------------------------------------------------------------------
if [[ "${SKIP_KAFKA:-0}" == 1 ]]; then
    { uname -a; nproc; grep -m1 'model name' /proc/cpuinfo; } >"$OUT/machine.txt" 2>/dev/null || true
    echo "wrote $OUT (Kafka skipped)"
    exit 0
fi
SCALE="${KAFKA_SCALE:-1}"
"$ROOT/bench/peers/kafka.sh" start $PORT >/dev/null
kj() { java -Dlog4j2.configurationFile="$ROOT/bench/peers/kafka/log4j2.properties" -cp "$LIBS/*" "$@"; }
topic() { # NAME [extra TopicCommand args]
    local n="$1"; shift
    kj org.apache.kafka.tools.TopicCommand --bootstrap-server 127.0.0.1:$PORT --create \
        --if-not-exists --topic "$n" --partitions 1 --replication-factor 1 "$@" >/dev/null
}
perf() { # TOPIC SIZE RECORDS THROUGHPUT
    kj org.apache.kafka.tools.ProducerPerformance --topic "$1" --record-size "$2" \
        --num-records "$3" --throughput "$4" \
        --producer-props bootstrap.servers=127.0.0.1:$PORT acks=1 max.request.size=67108864 2>&1 | tail -1
}
: >"$OUT/kafka.txt"
for size in 64 1024 65536; do
    case $size in 64) n=3000000 ;; 1024) n=1000000 ;; *) n=30000 ;; esac
    n=$((n / SCALE))
    for mode in default flush1; do
        t="durable-$size-$mode"
        if [[ $mode == flush1 ]]; then topic "$t" --config flush.messages=1; else topic "$t"; fi
        thr="$(perf "$t" "$size" "$n" -1)"
        lat="$(perf "$t" "$size" $((5000 / SCALE)) 500)"
        printf 'kafka %-8s %6s B  throughput: %s\n' "$mode" "$size" "$thr" | tee -a "$OUT/kafka.txt"
        printf 'kafka %-8s %6s B  latency@500/s: %s\n' "$mode" "$size" "$lat" | tee -a "$OUT/kafka.txt"
    done
done
echo "kafka $(kj kafka.Kafka --version 2>/dev/null | head -1 || true)" >>"$OUT/kafka.txt"
"$ROOT/bench/peers/kafka.sh" stop >/dev/null
{ uname -a; nproc; grep -m1 'model name' /proc/cpuinfo; df -T "$data" | tail -1; } >"$OUT/machine.txt" 2>/dev/null || true
echo "wrote $OUT"
