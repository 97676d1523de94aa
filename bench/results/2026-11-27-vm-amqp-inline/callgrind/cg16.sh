#!/bin/bash
# cg16.sh BIN OUT: callgrind of the broker under AMQP RPC, 16 callers, 20k calls (client outside valgrind)
BIN=$1; OUT=$2
PORT=$((36000 + RANDOM % 1000))
valgrind --tool=callgrind --callgrind-out-file=$OUT $BIN broker --listen 127.0.0.1:0 --mqtt off --ws off --stomp off --admin off --data "" --amqp 127.0.0.1:$PORT > /tmp/cg16.out 2>/tmp/cg16.err &
for i in $(seq 200); do grep -q ready /tmp/cg16.out && break; sleep 0.1; done
/tmp/hayate-before bench rpc --target "amqp://127.0.0.1:$PORT?client=hayate" --calls 1000 --concurrency 16 --concurrent-calls 20000 2>&1 | grep -E "^ +16 " | awk '{print "calls/s", $4}'
pkill -INT -f "callgrind-out-file=$OUT"
wait
callgrind_annotate $OUT 2>/dev/null | grep "PROGRAM TOTALS"
