#!/usr/bin/env bash
# 64 B only, 8 more rounds with the order rotated (the first three rounds of run.sh differed by
# up to 9% at 64 B, in the direction of whichever ran first).
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
for r in 1 2 3 4 5 6 7 8; do
  if [ $((r % 2)) = 1 ]; then a=(--target 'hayate://127.0.0.1:4711?name=before' --target 'hayate://127.0.0.1:4712?name=after')
  else a=(--target 'hayate://127.0.0.1:4712?name=after' --target 'hayate://127.0.0.1:4711?name=before'); fi
  $NEW bench thr "${a[@]}" --payload 64 --duration 2s --json "$OUT/thr64-$r.json" | grep -E "^ +64 B"
done
