#!/usr/bin/env bash
BIN=$1; NAME=$2; PORT=$3; N=${4:-50000}; SIZE=${5:-64}
valgrind --tool=callgrind --callgrind-out-file=/tmp/cgs-$NAME.out $BIN broker --listen 127.0.0.1:$((PORT+1)) --mqtt off --ws off --stomp 127.0.0.1:$PORT > /tmp/cgs-$NAME.log 2>&1 &
VG=$!
sleep 3
timeout 600 /work/main/.venv-interop/bin/python /tmp/stomp_load.py $PORT $N $SIZE
kill -INT $VG; wait $VG
grep totals /tmp/cgs-$NAME.out
