#!/usr/bin/env bash
# iperf3 over loopback: the ideal line in Hayate's throughput charts (see bench/peers/README.md).
#
#   bench/peers/iperf3.sh install                 iperf3 from Debian (~3 s)
#   bench/peers/iperf3.sh run [SECONDS] [ARGS...] a one-off server `iperf3 -s -1` on a free port
#                                                 of 127.0.0.1 and a client sending to it for
#                                                 SECONDS (default 3) with any extra client ARGS
#                                                 (e.g. -P 2, -l 1M); prints one line
#                                                 `bits_per_second N`, the receiver's figure
#   bench/peers/iperf3.sh version                 the installed iperf3's version
#
# The client's JSON report and the server's output go to bench/peers/run/iperf3-PORT.{json,log}
# (git-ignored). Nothing is left running.
set -euo pipefail

HERE="$(cd "$(dirname "$0")" && pwd)"
RUN_DIR="$HERE/run"

die() { echo "iperf3.sh: $*" >&2; exit 1; }

install() {
    command -v iperf3 >/dev/null && return 0
    [[ "$(id -u)" == 0 ]] || die "iperf3 is not installed; as root: apt-get install -y iperf3"
    echo "iperf3.sh: apt-get install -y iperf3" >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q iperf3 >/dev/null \
        || { apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q iperf3 >/dev/null; }
    command -v iperf3 >/dev/null || die "iperf3 still not on the PATH after apt-get"
}

# "3.12"
version() { iperf3 --version 2>/dev/null | sed -n 's/^iperf \([0-9.]*\).*/\1/p' | head -n1; }

# True when a TCP socket listens on port $1, on any address (read from /proc: connecting to
# probe would use up the one-off server's single test).
listening() {
    local hex
    hex="$(printf '%04X' "$1")"
    grep -qE "^ *[0-9]+: [0-9A-F]+:$hex [0-9A-F]+:0000 0A " /proc/net/tcp /proc/net/tcp6 2>/dev/null
}

# A TCP port that nothing listens on, from 5201 (iperf3's own) up.
free_port() {
    local p
    for ((p = 5201; p < 5301; p++)); do
        listening "$p" || { echo "$p"; return 0; }
    done
    die "no free port in 5201..5300"
}

run() {
    local seconds="${1:-3}"
    [[ "$seconds" =~ ^[0-9]+$ && "$seconds" -gt 0 ]] || die "SECONDS must be a positive whole number, not: $seconds"
    shift || true
    install
    mkdir -p "$RUN_DIR"
    local port
    port="$(free_port)"
    local log="$RUN_DIR/iperf3-$port.log" json="$RUN_DIR/iperf3-$port.json"
    iperf3 -s -1 -B 127.0.0.1 -p "$port" >"$log" 2>&1 </dev/null &
    local spid=$! i
    for ((i = 0; i < 100; i++)); do
        listening "$port" && break
        kill -0 "$spid" 2>/dev/null || { cat "$log" >&2; die "iperf3 server exited on start (log above)"; }
        sleep 0.05
    done
    listening "$port" || { kill "$spid" 2>/dev/null || true; die "iperf3 server did not listen on port $port"; }
    local rc=0
    iperf3 -c 127.0.0.1 -p "$port" -t "$seconds" -J "$@" >"$json" 2>>"$log" || rc=$?
    # The one-off server exits after its test; make sure it is gone.
    for ((i = 0; i < 50; i++)); do
        kill -0 "$spid" 2>/dev/null || break
        sleep 0.1
    done
    if kill -0 "$spid" 2>/dev/null; then
        kill "$spid" 2>/dev/null || true
    fi
    wait "$spid" 2>/dev/null || true
    [[ "$rc" == 0 ]] || { cat "$json" "$log" >&2; die "iperf3 client failed (exit $rc)"; }
    local bps
    if command -v jq >/dev/null; then
        bps="$(jq -r '.end.sum_received.bits_per_second' "$json")"
    else
        bps="$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["end"]["sum_received"]["bits_per_second"])' "$json")"
    fi
    [[ "$bps" =~ ^[0-9.e+]+$ ]] || die "no receiver bits_per_second in $json"
    echo "bits_per_second $bps"
}

case "${1:-}" in
    install) install ;;
    run) shift; run "$@" ;;
    version) install >/dev/null; version ;;
    *) echo "usage: $0 install | run [SECONDS] [CLIENT_ARGS...] | version" >&2; exit 2 ;;
esac
