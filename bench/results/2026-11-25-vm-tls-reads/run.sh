#!/usr/bin/env bash
# Native protocol over TLS, broker before (c364c3f: TlsRead zeroes the caller's whole buffer
# per read) vs after (TlsRead zeroes only the plaintext rustls holds), same harness (the after
# binary's client), thr 64 B / 1 KiB / 64 KiB, 3 rounds with the order rotated.
#   BEFORE=/path/to/old/hayate bench/results/2026-11-25-vm-tls-reads/run.sh
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../../.." && pwd)"
OUT="$ROOT/bench/results/2026-11-25-vm-tls-reads"
BEFORE="${BEFORE:?the before binary}"
AFTER="$ROOT/target/release/hayate"
tmp="$(mktemp -d)"
pids=()
trap 'for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$tmp"' EXIT
"$ROOT/bench/tls-certs.sh" "$tmp"
start() {  # $1 binary, $2 log
    "$1" broker --listen 127.0.0.1:0 --native-tls 127.0.0.1:0 --mqtt off --ws off --stomp off \
        --tls-cert "$tmp/server.pem" --tls-key "$tmp/server.key" >"$2" 2>&1 &
    pids+=($!)
    for _ in $(seq 100); do grep -q ready "$2" && break; sleep 0.1; done
    sed -n "s/^hayate broker: native protocol over tls on //p" "$2" | head -1
}
b=$(start "$BEFORE" "$tmp/before.log"); a=$(start "$AFTER" "$tmp/after.log")
ca="ca=$tmp/ca.pem"
for r in 1 2 3; do
  if [ $((r % 2)) = 1 ]; then t=(--target "hayate://$b?$ca&name=before-tls" --target "hayate://$a?$ca&name=after-tls")
  else t=(--target "hayate://$a?$ca&name=after-tls" --target "hayate://$b?$ca&name=before-tls"); fi
  "$AFTER" bench thr "${t[@]}" --payload 64,1KiB,64KiB --duration 3s --json "$OUT/thr-$r.json" | tee "$OUT/thr-$r.txt"
done
