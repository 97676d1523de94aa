# Shared helpers of the peer scripts (sourced; not run). Expects RUN_DIR to be set and uses the
# sourcing script's name in messages.

PEER_SH="$(basename "$0")"

# True if something accepts TCP connections on 127.0.0.1:$1.
port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# peer_stop_one PIDFILE PATTERN WAIT_TENTHS: stops the process in PIDFILE if its command line
# still matches PATTERN (the pid may have been reused), waiting up to WAIT_TENTHS/10 s for a
# clean exit before SIGKILL.
peer_stop_one() {
    local pidfile="$1" pattern="$2" wait="$3" pid i
    pid="$(cat "$pidfile" 2>/dev/null || true)"
    rm -f "$pidfile"
    [[ "$pid" =~ ^[0-9]+$ ]] || return 0
    tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -q "$pattern" || return 0
    kill "$pid" 2>/dev/null || return 0
    for ((i = 0; i < wait; i++)); do
        kill -0 "$pid" 2>/dev/null || { echo "$PEER_SH: stopped pid $pid"; return 0; }
        sleep 0.1
    done
    kill -9 "$pid" 2>/dev/null || true
    for ((i = 0; i < 50; i++)); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
    done
    echo "$PEER_SH: killed pid $pid"
}

# peer_stop PREFIX PATTERN WAIT_TENTHS [PORT]: stops the instance on PORT, or every instance
# with a pid file $RUN_DIR/PREFIX-*.pid.
peer_stop() {
    local prefix="$1" pattern="$2" wait="$3" f
    shift 3
    if [[ $# -ge 1 ]]; then
        peer_stop_one "$RUN_DIR/$prefix-$1.pid" "$pattern" "$wait"
    else
        for f in "$RUN_DIR/$prefix"-*.pid; do
            [[ -e "$f" ]] && peer_stop_one "$f" "$pattern" "$wait"
        done
    fi
    return 0
}
