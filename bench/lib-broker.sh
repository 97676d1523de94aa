# Sourced by the bench scripts (not run): a throwaway Hayate broker, native protocol only, on
# a free port, its data and output in $tmp. Needs BIN and tmp set.
#   start_broker   sets BROKER_PID and BROKER_ADDR (exits if the broker does not start)
#   stop_broker    for the caller's EXIT trap

start_broker() {
    "$BIN" broker --listen 127.0.0.1:0 --mqtt off --ws off --stomp off --amqp off --admin off \
        --data "$tmp/data" >"$tmp/out" 2>"$tmp/err" &
    BROKER_PID=$!
    for _ in $(seq 100); do grep -q 'native protocol on' "$tmp/out" && break; sleep 0.05; done
    BROKER_ADDR=$(sed -n 's/.*native protocol on \(.*\)$/\1/p' "$tmp/out" | head -1)
    if [ -z "$BROKER_ADDR" ]; then
        echo "the broker did not start:" >&2
        cat "$tmp/err" >&2
        exit 1
    fi
}

stop_broker() {
    kill "${BROKER_PID:-}" 2>/dev/null || true
    wait "${BROKER_PID:-}" 2>/dev/null || true
}
