#!/usr/bin/env bash
# dur-ab.sh BIN NAME: hayate bench durable 64 B and 1 KiB, always, against a fresh broker of BIN
BIN=$1; NAME=$2
d=$(mktemp -d)
$BIN broker --listen 127.0.0.1:0 --mqtt off --ws off --stomp off --data $d > /tmp/dab-$NAME.log 2>&1 &
P=$!
for i in $(seq 50); do grep -q ready /tmp/dab-$NAME.log && break; sleep 0.1; done
a=$(sed -n 's/^hayate broker: native protocol on //p' /tmp/dab-$NAME.log)
/work/main/target/release/hayate bench durable --server $a --payload 64,1KiB --fsync always --duration 3s --lat-samples 500 | tail -2 | sed "s/^/$NAME /"
kill $P; wait $P 2>/dev/null; rm -rf $d
