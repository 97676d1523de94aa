#!/usr/bin/env bash
# Instructions the broker executes per message of a latency run (one message in flight), under
# callgrind: repeatable where wall-clock latency on this VM is bimodal and the VM exposes no
# hardware counters to perf. Instrumentation is on only during the run (not the start-up).
#
#   bench/callgrind-lat.sh BINARY native|mqtt       # prints messages and Ir/message
#
# A/B: run it for the two binaries and compare Ir/message (the client is $CLIENT, default
# target/release/hayate, the same for both).
set -euo pipefail
CLIENT=${CLIENT:-target/release/hayate}
BIN=$1; PROTO=$2; tmp=$(mktemp -d)
valgrind --tool=callgrind --instr-atstart=no --callgrind-out-file=$tmp/cg.out "$BIN" broker --listen 127.0.0.1:0 --mqtt 127.0.0.1:0 --stomp off --amqp off --ws off --admin off --data $tmp/data >$tmp/out 2>$tmp/err &
pid=$!
for _ in $(seq 600); do grep -q ready $tmp/out && break; sleep 0.1; done
addr() { sed -n "s/^hayate broker: $1 on //p" $tmp/out | head -1; }
if [ "$PROTO" = native ]; then t="hayate://$(addr 'native protocol')?shm=off&name=x"; else t="mqtt://$(addr mqtt)?name=x"; fi
callgrind_control -i on $pid >/dev/null
"$CLIENT" bench lat --target "$t" --payload 64 --duration 5s --warmup 0s --runs 1 --json $tmp/r.json >/dev/null 2>&1
callgrind_control -i off $pid >/dev/null
n=$(python3 -c "import json;print(json.load(open('$tmp/r.json'))[0]['samples']*2)")
kill -INT $pid; wait $pid 2>/dev/null
ir=$(grep -h "^totals" $tmp/cg.out* | head -1 | awk "{print \$2}")
python3 -c "print('$(basename $BIN) $PROTO messages=$n Ir/message=%.0f' % ($ir/$n))"
rm -rf $tmp
