#!/usr/bin/env bash
# The broker's fan-out arena against copies, in one run: two brokers from the same binary,
# one with the arena (native.shm_fanout_bytes, default 16 MiB) and one without (0), their
# subscribers on shared memory: reading the arena's entries in place (the client's default),
# copying them out (in_place=0), and with no arena; plus the first broker's subscribers on
# TCP. One publisher to 1..20 subscriber processes (`hayate bench fanout`), at each payload
# size.
#
#   bench/fanout-arena.sh                      # 1 KiB and 64 KiB, 1/5/20 subscribers, 3 s
#   PAYLOADS="4KiB" SUBS=1,20 DURATION=5s OUT=... bench/fanout-arena.sh
#   TOUCH=1 ... bench/fanout-arena.sh          # subscribers read every byte (--touch)
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-target/release/hayate}
OUT=${OUT:-bench/results/$(date +%F)-vm-fanout-arena}
DURATION=${DURATION:-3s}
PAYLOADS=${PAYLOADS:-1KiB 64KiB}
SUBS=${SUBS:-1,5,20}
mkdir -p "$OUT"
tmp=$(mktemp -d)
start() { # $1: name, $2: fan-out bytes
    printf '[native]\nshm_fanout_bytes = %s\n' "$2" >"$tmp/$1.toml"
    "$BIN" broker --config "$tmp/$1.toml" --listen 127.0.0.1:0 --mqtt off --ws off --stomp off \
        --amqp off --admin off --data "$tmp/$1-data" >"$tmp/$1.out" 2>"$tmp/$1.err" &
    echo $! >"$tmp/$1.pid"
    for _ in $(seq 100); do grep -q 'native protocol on' "$tmp/$1.out" && break; sleep 0.05; done
    sed -n 's/.*native protocol on \(.*\)$/\1/p' "$tmp/$1.out" | head -1
}
stop() { for p in "$tmp"/*.pid; do kill "$(cat "$p")" 2>/dev/null || true; done; rm -rf "$tmp"; }
trap stop EXIT
arena=$(start arena 16777216)
copies=$(start copies 0)
[ -n "$arena" ] && [ -n "$copies" ] || { cat "$tmp"/*.err >&2; exit 1; }
for p in $PAYLOADS; do
    "$BIN" bench fanout \
        --target "hayate://$arena?shm=require&name=broker-shm-in-place" \
        --target "hayate://$arena?shm=require&in_place=0&name=broker-shm-arena" \
        --target "hayate://$copies?shm=require&name=broker-shm-copies" \
        --target "hayate://$arena?shm=off&name=broker-tcp" \
        --subscribers "$SUBS" --payload "$p" --duration "$DURATION" --warmup 1s ${TOUCH:+--touch} \
        --json "$OUT/fanout-$p.json" | tee "$OUT/fanout-$p.txt"
done
grep -m1 "model name" /proc/cpuinfo >"$OUT/machine.txt"; nproc >>"$OUT/machine.txt"
