#!/usr/bin/env bash
# cgn.sh BIN NAME PORT: callgrind of a broker while `hayate pub --count 200000` (64 B) crosses it to one `hayate sub`
BIN=$1; NAME=$2; PORT=$3
valgrind --tool=callgrind --callgrind-out-file=/tmp/cgn-$NAME.out $BIN broker --listen 127.0.0.1:$PORT --mqtt off --ws off --stomp off > /tmp/cgn-$NAME.log 2>&1 &
VG=$!
sleep 3
timeout 300 /tmp/hayate-after sub --server 127.0.0.1:$PORT --count 200000 'n/x' > /tmp/cgn-$NAME.sub &
SUB=$!
sleep 1.5
timeout 300 /tmp/hayate-after pub --server 127.0.0.1:$PORT --count 200000 n/x xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx
wait $SUB; echo "sub rc=$? lines=$(wc -l < /tmp/cgn-$NAME.sub)"
kill -INT $VG; wait $VG
grep totals /tmp/cgn-$NAME.out
