#!/usr/bin/env bash
# Peer mode (issue 15): Hayate peer nodes against Zenoh peers, Hayate brokered and raw TCP, in
# one run. thr at 64 B and 1 KiB, lat at 64 B (half round trip). Needs the release build with
# the peers feature: cargo build --release -p hayate --features hayate/peers
# Writes bench/results/<date>-vm-peer/{thr,lat}.json and prints the tables.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-target/release/hayate}
OUT=${OUT:-bench/results/$(date +%F)-vm-peer}
DURATION=${DURATION:-5s}
mkdir -p "$OUT"
tmp=$(mktemp -d)
"$BIN" broker --listen 127.0.0.1:0 --mqtt off --ws off --stomp off --data "$tmp/data" >"$tmp/out" 2>"$tmp/err" &
bpid=$!
trap 'kill $bpid 2>/dev/null || true; wait $bpid 2>/dev/null || true; rm -rf "$tmp"' EXIT
for _ in $(seq 100); do grep -q 'native protocol on' "$tmp/out" && break; sleep 0.05; done
addr=$(sed -n 's/.*native protocol on \(.*\)$/\1/p' "$tmp/out" | head -1)
targets=(--target "hayate://127.0.0.1:0?mode=peer&name=hayate-p2p"
         --target "zenoh://127.0.0.1:0?mode=peer&name=zenoh-p2p"
         --target "hayate://$addr?name=hayate-brokered")
"$BIN" bench thr "${targets[@]}" --baseline --payload 64,1KiB --duration "$DURATION" --json "$OUT/thr.json"
"$BIN" bench lat "${targets[@]}" --baseline --payload 64 --duration "$DURATION" --json "$OUT/lat.json"
cat /proc/cpuinfo | grep -m1 "model name" >"$OUT/machine.txt"; nproc >>"$OUT/machine.txt"
