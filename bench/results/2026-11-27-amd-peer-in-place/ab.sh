#!/usr/bin/env bash
# Peer nodes over shared memory: large messages read in place (the default arena, 16 MiB)
# against copied through the ring (`arena=0`), alternately, three rounds, 64 KiB, 256 KiB
# and 1 MiB, with raw TCP (`--baseline`) in each round. BIN: the release build.
set -uo pipefail
BIN=${BIN:-target/release/hayate}
for i in 1 2 3; do
  for a in default 0; do
    p=""; [ "$a" = 0 ] && p="&arena=0"
    timeout 300 "$BIN" bench thr --target "hayate://127.0.0.1:0?mode=peer&shm=require$p&name=shm-arena-$a" \
      --payload ${PAYLOADS:-64KiB,256KiB,1MiB} --duration 3s 2>&1 | grep -E -- "shm-|rror" | grep -v WARN
  done
  timeout 300 "$BIN" bench thr --target "hayate://127.0.0.1:0?mode=peer&shm=off&name=p2p" --baseline \
      --payload 1MiB --duration 3s 2>&1 | grep -E -- "tcp" | grep -v WARN
done
