#!/usr/bin/env bash
# Peer-mode fan-out (issue 15): one publisher node, 1 and 20 subscriber nodes in processes
# of their own, over shared memory (large messages read in place in the publisher's arena)
# and over TCP; 1 KiB, and 64 KiB and 1 MiB with every subscriber reading every byte
# (--touch). BIN: the build measured.
set -euo pipefail
BIN=${BIN:-target/release/hayate}
for p in 1KiB 64KiB 1MiB; do
  touch=(); [ "$p" = 1KiB ] || touch=(--touch)
  "$BIN" bench fanout --target "hayate://127.0.0.1:0?mode=peer&shm=require&name=peer-shm" \
    --target "hayate://127.0.0.1:0?mode=peer&shm=off&name=peer-tcp" \
    --subscribers 1,20 --payload $p --duration ${DURATION:-3s} --warmup 1s "${touch[@]}" \
    --json fanout-$p.json 2>&1 | grep -E "KiB|MiB"
done
