#!/usr/bin/env bash
BIN=$1; NAME=$2; PORT=$3; N=${4:-5000}
valgrind --tool=callgrind --callgrind-out-file=/tmp/cg/l-$NAME.out $BIN broker --listen 127.0.0.1:$((PORT+1)) --mqtt off --ws off --stomp 127.0.0.1:$PORT > /tmp/cg/l-$NAME.log 2>&1 &
VG=$!
sleep 4
/work/main/.venv-interop/bin/python /tmp/cg/stomp_pp.py $PORT $N 64
kill -INT $VG; wait $VG
grep totals /tmp/cg/l-$NAME.out
