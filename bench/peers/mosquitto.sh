#!/usr/bin/env bash
# Eclipse Mosquitto (MQTT), a peer Hayate is compared with (see bench/peers/README.md).
#
#   bench/peers/mosquitto.sh install          mosquitto + mosquitto-clients from Debian (~11 s)
#   bench/peers/mosquitto.sh start [PORT]     on 127.0.0.1:PORT (default 1883), anonymous, no
#                                             persistence, no queue limits; waits until the
#                                             port accepts connections
#   bench/peers/mosquitto.sh stop [PORT]      stops the broker started on PORT (default: every
#                                             broker this script started)
#   bench/peers/mosquitto.sh version          the installed mosquitto's version
#
# The config written to bench/peers/run/mosquitto-PORT.conf follows shared/peers/mosquitto.conf.
# bench/peers/run (config, pid and log files) is git-ignored.
set -euo pipefail

HERE="$(cd "$(dirname "$0")" && pwd)"
RUN_DIR="$HERE/run"
# shellcheck source=lib.sh
. "$HERE/lib.sh"

die() { echo "mosquitto.sh: $*" >&2; exit 1; }

install() {
    if command -v mosquitto >/dev/null && command -v mosquitto_pub >/dev/null; then
        return 0
    fi
    [[ "$(id -u)" == 0 ]] || die "mosquitto is not installed; as root: apt-get install -y mosquitto mosquitto-clients"
    echo "mosquitto.sh: apt-get install -y mosquitto mosquitto-clients"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q mosquitto mosquitto-clients >/dev/null \
        || { apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q mosquitto mosquitto-clients >/dev/null; }
    command -v mosquitto >/dev/null || die "mosquitto still not on the PATH after apt-get"
}

# "2.0.11"
# (mosquitto -h exits non-zero, hence the || true.)
version() { { mosquitto -h 2>/dev/null || true; } | sed -n 's/^mosquitto version *//p' | head -n1; }

# True when something accepts TCP connections on 127.0.0.1:$1.

start() {
    local port="${1:-1883}"
    [[ "$port" =~ ^[0-9]+$ ]] || die "bad port: $port"
    install
    mkdir -p "$RUN_DIR"
    local pidfile="$RUN_DIR/mosquitto-$port.pid" conf="$RUN_DIR/mosquitto-$port.conf" log="$RUN_DIR/mosquitto-$port.log"
    peer_check_free "$pidfile" "$port"
    # max_queued_messages/bytes 0: no limit on what is queued for a slow subscriber (the
    # default of 1000 messages would drop under a back-to-back publisher). The broker logs to
    # stderr, which goes to the log file.
    {
        echo "# written by bench/peers/mosquitto.sh from shared/peers/mosquitto.conf"
        echo "listener $port 127.0.0.1"
        echo "allow_anonymous true"
        echo "persistence false"
        echo "max_queued_messages 0"
        echo "max_queued_bytes 0"
        echo "log_dest stderr"
        echo "log_type error"
        echo "log_type warning"
        echo "log_type notice"
    } >"$conf"
    mosquitto -c "$conf" >"$log" 2>&1 </dev/null &
    local pid=$!
    echo "$pid" >"$pidfile"
    peer_wait_up mosquitto "$pid" "$pidfile" "$port" 10 'mosquitto' 50 "$log"
    echo "mosquitto.sh: mosquitto $(version) on 127.0.0.1:$port (pid $pid)"
}

stop() { peer_stop mosquitto 'mosquitto' 50 "$@"; }

case "${1:-}" in
    install) install ;;
    start) shift; start "$@" ;;
    stop) shift; stop "$@" ;;
    version) install >/dev/null; version ;;
    *) echo "usage: $0 install | start [PORT] | stop [PORT] | version" >&2; exit 2 ;;
esac
