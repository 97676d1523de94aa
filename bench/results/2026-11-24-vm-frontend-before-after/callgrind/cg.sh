#!/usr/bin/env bash
# usage: cg.sh BIN NAME PORT
BIN=$1; NAME=$2; PORT=$3
rm -f /tmp/cg-$NAME.out
valgrind --tool=callgrind --callgrind-out-file=/tmp/cg-$NAME.out $BIN broker --listen 127.0.0.1:$((PORT+1)) --mqtt 127.0.0.1:$PORT --ws off --stomp off > /tmp/cg-$NAME.log 2>&1 &
VG=$!
for i in $(seq 1 100); do mosquitto_pub -p $PORT -t ping -m x 2>/dev/null && break; sleep 0.5; done
timeout 300 mosquitto_sub -p $PORT -t 'cg/x' -C 100000 > /tmp/cg-$NAME.sub &
SUB=$!
sleep 2
start=$(date +%s.%N)
timeout 300 mosquitto_pub -p $PORT -t 'cg/x' -l < /tmp/lines.txt
wait $SUB; echo "sub rc=$? lines=$(wc -l < /tmp/cg-$NAME.sub) secs=$(echo "$(date +%s.%N) - $start" | bc)"
kill -INT $VG; wait $VG
