#!/usr/bin/env bash
# The cost of metrics (issue 16): `hayate bench thr` at 64 B and 1 KiB against three brokers
# in one run, each measured in turn (clients on TCP, shm=off):
#   admin-scraped: this build, admin listener on and /metrics scraped every second (all run long);
#   admin-off:     this build, --admin off (the traffic counters still count: they are always on);
#   before:        BEFORE (optional), a build from before the counters existed.
# Needs a release build (cargo build --release -p hayate). Writes bench/results/<date>-vm-admin-cost.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-target/release/hayate}
BEFORE=${BEFORE:-}
OUT=${OUT:-bench/results/$(date +%F)-vm-admin-cost}
DURATION=${DURATION:-5s}
mkdir -p "$OUT"
tmp=$(mktemp -d)
pids=()
cleanup() { kill "${pids[@]}" 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$tmp"; }
trap cleanup EXIT
start() { # NAME BIN [ADMIN] (no ADMIN: a build from before --admin existed)
    "$2" broker --listen 127.0.0.1:0 --mqtt off --ws off --stomp off --amqp off ${3:+--admin "$3"} --data "" >"$tmp/$1.out" 2>"$tmp/$1.err" &
    pids+=($!)
    for _ in $(seq 100); do grep -q ready "$tmp/$1.out" && break; sleep 0.05; done
}
addr() { sed -n 's/^hayate broker: native protocol on //p' "$tmp/$1.out" | head -1; }
# Not in $(...): the broker's pid must reach `pids` in this shell, for the cleanup.
start on "$BIN" 127.0.0.1:0; on=$(addr on)
admin=$(sed -n 's/^hayate broker: admin http on //p' "$tmp/on.out" | head -1)
start off "$BIN" off; off=$(addr off)
# SWAP=1 measures admin-off first (thr measures the targets in order at each payload).
if [[ -n "${SWAP:-}" ]]; then
    targets=(--target "hayate://$off?shm=off&name=admin-off" --target "hayate://$on?shm=off&name=admin-scraped")
else
    targets=(--target "hayate://$on?shm=off&name=admin-scraped" --target "hayate://$off?shm=off&name=admin-off")
fi
if [[ -n "$BEFORE" ]]; then
    start before "$BEFORE"; before=$(addr before)
    targets+=(--target "hayate://$before?shm=off&name=before")
fi
# The scraper: one GET /metrics a second, for the whole run; how many it made is kept.
python3 - "$admin" "$tmp/scrapes" <<'PY' &
import sys, time, urllib.request
n = 0
while True:
    body = urllib.request.urlopen(f"http://{sys.argv[1]}/metrics", timeout=5).read()
    n += 1
    open(sys.argv[2], "w").write(f"{n} {len(body)}\n")
    time.sleep(1)
PY
pids+=($!)
"$BIN" bench thr "${targets[@]}" --payload 64,1KiB --duration "$DURATION" --json "$OUT/thr.json"
echo "scrapes (count, last size in bytes): $(cat "$tmp/scrapes")" | tee "$OUT/scrapes.txt"
grep -m1 "model name" /proc/cpuinfo >"$OUT/machine.txt"; nproc >>"$OUT/machine.txt"
