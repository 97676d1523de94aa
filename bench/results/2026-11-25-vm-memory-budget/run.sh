#!/usr/bin/env bash
# Before (4ab0047, no memory budget) vs after (this commit): native thr, rounds with the order
# of the two brokers rotated, same harness (the after binary's). PAYLOADS (64,1KiB,64KiB),
# ROUNDS (3), DURATION (3s) and NAME (thr: the output files' prefix) change the run.
set -euo pipefail
cd "$(dirname "$0")/../../.."
OUT=bench/results/2026-11-25-vm-memory-budget
OLD=${OLD:-target/oldtree/release/hayate}
NEW=target/release/hayate
common=(--mqtt off --stomp off --ws off --max-payload 67108864)
$OLD broker --listen 127.0.0.1:4711 "${common[@]}" >/dev/null 2>&1 &
p1=$!
$NEW broker --listen 127.0.0.1:4712 "${common[@]}" >/dev/null 2>&1 &
p2=$!
trap 'kill $p1 $p2 2>/dev/null' EXIT
sleep 1
for r in $(seq 1 "${ROUNDS:-3}"); do
  if [ $((r % 2)) = 1 ]; then a=(--target 'hayate://127.0.0.1:4711?name=before' --target 'hayate://127.0.0.1:4712?name=after')
  else a=(--target 'hayate://127.0.0.1:4712?name=after' --target 'hayate://127.0.0.1:4711?name=before'); fi
  $NEW bench thr "${a[@]}" --payload "${PAYLOADS:-64,1KiB,64KiB}" --duration "${DURATION:-3s}" \
      --json "$OUT/${NAME:-thr}-$r.json" | tee "$OUT/${NAME:-thr}-$r.txt"
done
