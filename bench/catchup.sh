#!/usr/bin/env bash
# A durable consumer far behind: fill a stream with SIZE (default 10GiB) of 64 KiB messages,
# read it all back through a durable consumer, and compare with `dd` of the same segment
# files; the broker's RSS is sampled every second throughout (it must stay bounded while
# the consumer is gigabytes behind). Writes bench/results/<date>-<host>-catchup/ (or $2).
#
#   cargo build --release -p hayate && bench/catchup.sh 10GiB
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
SIZE="${1:-10GiB}"
OUT="${2:-$ROOT/bench/results/$(date +%F)-$(hostname -s)-catchup}"
HAYATE="${HAYATE_BIN:-$ROOT/target/release/hayate}"
mkdir -p "$OUT"
data="$(mktemp -d -p "${CATCHUP_DIR:-/var/tmp}")"
"$HAYATE" broker --listen 127.0.0.1:0 --mqtt off --ws off --stomp off --amqp off --admin off --data "$data" >"$OUT/broker.log" 2>&1 &
bpid=$!
trap 'kill $bpid 2>/dev/null || true; rm -rf "$data"' EXIT
for _ in $(seq 100); do grep -q ready "$OUT/broker.log" && break; sleep 0.1; done
addr="$(sed -n 's/^hayate broker: native protocol on //p' "$OUT/broker.log" | head -1)"
( while kill -0 $bpid 2>/dev/null; do
    echo "$(date +%s) $(awk '/VmRSS/ {print $2}' /proc/$bpid/status 2>/dev/null)"; sleep 1
  done ) >"$OUT/rss-kb.txt" &
"$HAYATE" bench durable --server "$addr" --catchup "$SIZE" --payload 64KiB --json "$OUT/catchup.jsonl" | tee "$OUT/catchup.txt"
dir="$(ls -d "$data"/streams/bench-catchup-* | head -1)"
du -sb "$dir" | tee -a "$OUT/catchup.txt"
echo "dd of the same segment files (page cache as the consumer left it):" | tee -a "$OUT/catchup.txt"
start=$(date +%s.%N)
for f in "$dir"/*.log; do dd if="$f" of=/dev/null bs=1M status=none; done
end=$(date +%s.%N)
bytes=$(cat "$dir"/*.log | wc -c)
awk -v b="$bytes" -v s="$start" -v e="$end" 'BEGIN { printf "dd: %.0f bytes in %.2f s: %.0f MB/s\n", b, e - s, b / (e - s) / 1e6 }' | tee -a "$OUT/catchup.txt"
echo "max broker RSS: $(sort -k2 -n "$OUT/rss-kb.txt" | tail -1 | awk '{print $2}') kB" | tee -a "$OUT/catchup.txt"
