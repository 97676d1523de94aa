#!/bin/bash
BIN=$1; CONC=$2; CALLS=$3; SCHEME=${4:-amqp}
PORT=$((38000 + RANDOM % 1000))
if [ "$SCHEME" = amqp ]; then
  $BIN broker --listen 127.0.0.1:0 --mqtt off --ws off --stomp off --admin off --data "" --amqp 127.0.0.1:$PORT > /tmp/ab.out 2>&1 &
  T="amqp://127.0.0.1:$PORT?client=hayate"
else
  $BIN broker --listen 127.0.0.1:$PORT --mqtt off --ws off --stomp off --admin off --amqp off --data "" > /tmp/ab.out 2>&1 &
  T="hayate://127.0.0.1:$PORT?shm=off"
fi
BP=$!
for i in $(seq 100); do grep -q ready /tmp/ab.out && break; sleep 0.1; done
perf stat -e 'syscalls:sys_enter_writev,syscalls:sys_enter_recvfrom,syscalls:sys_enter_epoll_wait,syscalls:sys_enter_futex,task-clock' -p $BP -o /tmp/pf.txt &
PP=$!
sleep 0.2
if [ "$CONC" = 1 ]; then
  line=$(/tmp/hayate-before bench rpc --target "$T" --calls $CALLS --concurrency none 2>&1 | grep -E "^ +1 " | tail -1)
else
  line=$(/tmp/hayate-before bench rpc --target "$T" --calls 1000 --concurrency $CONC --concurrent-calls $CALLS 2>&1 | grep -E "^ +$CONC " | tail -1)
fi
kill -INT $PP; wait $PP
kill $BP; wait $BP 2>/dev/null
w=$(grep writev /tmp/pf.txt | awk '{gsub(",","",$1); print $1}')
r=$(grep recvfrom /tmp/pf.txt | awk '{gsub(",","",$1); print $1}')
e=$(grep epoll_wait /tmp/pf.txt | awk '{gsub(",","",$1); print $1}')
f=$(grep futex /tmp/pf.txt | awk '{gsub(",","",$1); print $1}')
tc=$(grep task-clock /tmp/pf.txt | awk '{gsub(",","",$1); print $1}')
n=$(echo "$line" | awk '{print $3}')
echo "$line" | awk -v b=$(basename $BIN) -v w=$w -v r=$r -v e=$e -v f=$f -v tc=$tc -v n=$n '{printf "%-13s %s c=%s calls/s %6s p50 %7s | per call: writev %.2f recv %.2f epoll %.2f futex %.2f cpu %.1f us\n", b, $2, $1, $4, $5, w/n, r/n, e/n, f/n, tc*1000/n}'
