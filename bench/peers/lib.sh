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

# peer_check_free PIDFILE PORT: fails if our instance already runs there or the port is taken.
peer_check_free() {
    local pidfile="$1" port="$2"
    if [[ -f "$pidfile" ]] && kill -0 "$(cat "$pidfile")" 2>/dev/null; then
        echo "$PEER_SH: already running on port $port (pid $(cat "$pidfile"))" >&2
        exit 1
    fi
    if port_open "$port"; then
        echo "$PEER_SH: port $port is already in use by another process" >&2
        exit 1
    fi
}

# peer_wait_up NAME PID PIDFILE PORT SECONDS PATTERN STOP_TENTHS LOG: waits until the process
# PID (recorded in PIDFILE) accepts connections on PORT; if it exits or is not up within SECONDS,
# shows or names its LOG, stops it and exits with an error.
peer_wait_up() {
    local name="$1" pid="$2" pidfile="$3" port="$4" secs="$5" pattern="$6" stop="$7" log="$8" i
    for ((i = 0; i < secs * 10; i++)); do
        if ! kill -0 "$pid" 2>/dev/null; then
            rm -f "$pidfile"
            cat "$log" >&2
            echo "$PEER_SH: $name exited on start (log above)" >&2
            exit 1
        fi
        port_open "$port" && return 0
        sleep 0.1
    done
    peer_stop_one "$pidfile" "$pattern" "$stop"
    echo "$PEER_SH: $name did not accept connections on port $port within ${secs}s (log: $log)" >&2
    exit 1
}
