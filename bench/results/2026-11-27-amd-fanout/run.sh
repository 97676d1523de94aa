#!/usr/bin/env bash
# Fan-out bar of issue 15 on the AMD EPYC VM: one broker, 20 subscriber processes reading
# the fan-out arena in place against one TCP subscriber (and 1 in place, 20 on TCP), three
# rounds of 1 KiB, 64 KiB --touch and 1 MiB --touch. BIN: the build measured.
set -euo pipefail
cd /work/main
OUT=${OUT:-bench/results/2026-11-27-amd-fanout}
BIN=${BIN:-target/release/hayate}
tmp=$(mktemp -d)
. bench/lib-broker.sh
start_broker
trap 'stop_broker; rm -rf "$tmp"' EXIT
for i in 1 2 3; do
for p in 1KiB 64KiB 1MiB; do
touch=(); [ "$p" = 1KiB ] || touch=(--touch)
echo "== round $i $p ${touch[*]}"
"$BIN" bench fanout --target "hayate://$BROKER_ADDR?shm=require&name=broker-shm-in-place" \
  --target "hayate://$BROKER_ADDR?shm=off&name=broker-tcp" \
  --subscribers 1,20 --payload $p --duration ${DURATION:-3s} --warmup 1s "${touch[@]}" \
  --json $OUT/fanout-$i-$p.json 2>&1 | grep -E "KiB|MiB"
done; done
grep -m1 "model name" /proc/cpuinfo >"$OUT/machine.txt"; nproc >>"$OUT/machine.txt"
