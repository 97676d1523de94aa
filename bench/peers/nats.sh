#!/usr/bin/env bash
# nats-server, the peer Hayate is compared with (see bench/README.md).
#
#   bench/peers/nats.sh install                  nats-server v2.15.2 into bench/peers/bin/
#   bench/peers/nats.sh start [PORT] [MAX_PAYLOAD]
#                                                on 127.0.0.1:PORT (default 4222), max_payload
#                                                MAX_PAYLOAD bytes (default 67108864 = 64 MiB,
#                                                as Hayate); waits until the port accepts
#   bench/peers/nats.sh stop [PORT]              stops the server started on PORT (default:
#                                                every server this script started)
#   bench/peers/nats.sh version                  the installed nats-server's version
#
# install copies an existing nats-server of the right version (NATS_SERVER_BIN, then
# /work/tools/bin/nats-server, then the PATH) or builds it with `go install`.
# bench/peers/bin and bench/peers/run (config, pid and log files) are git-ignored.
set -euo pipefail

VERSION=v2.15.2
MODULE=github.com/nats-io/nats-server/v2
HERE="$(cd "$(dirname "$0")" && pwd)"
BIN_DIR="$HERE/bin"
RUN_DIR="$HERE/run"
# shellcheck source=lib.sh
. "$HERE/lib.sh"
BIN="$BIN_DIR/nats-server"

die() { echo "nats.sh: $*" >&2; exit 1; }

# The version a nats-server binary reports ("v2.15.2"), or nothing.
version_of() { "$1" --version 2>/dev/null | sed -n 's/^nats-server: *//p' | head -n1; }

install() {
    if [[ -x "$BIN" && "$(version_of "$BIN")" == "$VERSION" ]]; then
        return 0
    fi
    mkdir -p "$BIN_DIR"
    local c
    for c in "${NATS_SERVER_BIN:-}" /work/tools/bin/nats-server "$(command -v nats-server || true)"; do
        if [[ -n "$c" && -x "$c" && "$(version_of "$c")" == "$VERSION" ]]; then
            cp "$c" "$BIN.tmp" && mv "$BIN.tmp" "$BIN"
            echo "nats.sh: nats-server $VERSION copied from $c"
            return 0
        fi
    done
    command -v go >/dev/null || die "nats-server $VERSION not found and Go is not installed"
    echo "nats.sh: go install $MODULE@$VERSION"
    GOBIN="$BIN_DIR" go install "$MODULE@$VERSION"
    [[ "$(version_of "$BIN")" == "$VERSION" ]] || die "$BIN does not report $VERSION"
}

# True when something accepts TCP connections on 127.0.0.1:$1.

start() {
    local port="${1:-4222}" max_payload="${2:-67108864}"
    [[ "$port" =~ ^[0-9]+$ ]] || die "bad port: $port"
    [[ "$max_payload" =~ ^[0-9]+$ ]] || die "MAX_PAYLOAD is a number of bytes, not: $max_payload"
    install
    mkdir -p "$RUN_DIR"
    local pidfile="$RUN_DIR/nats-$port.pid" conf="$RUN_DIR/nats-$port.conf" log="$RUN_DIR/nats-$port.log"
    peer_check_free "$pidfile" "$port"
    # nats-server cuts a subscriber off as a slow consumer once max_pending (64 MiB by
    # default) is queued for it, so with 64 MiB payloads a single queued message would do:
    # allow four payloads in flight, as Hayate's outbox does in effect for large messages.
    {
        echo "# written by bench/peers/nats.sh"
        echo "listen: 127.0.0.1:$port"
        echo "max_payload: $max_payload"
        echo "max_pending: $(( max_payload * 4 > 67108864 ? max_payload * 4 : 67108864 ))"
    } >"$conf"
    "$BIN" -c "$conf" >"$log" 2>&1 &
    local pid=$!
    echo "$pid" >"$pidfile"
    peer_wait_up nats-server "$pid" "$pidfile" "$port" 10 'nats-server' 50 "$log"
    echo "nats.sh: nats-server $VERSION on 127.0.0.1:$port (pid $pid, max_payload $max_payload)"
}

stop() { peer_stop nats 'nats-server' 50 "$@"; }

case "${1:-}" in
    install) install ;;
    start) shift; start "$@" ;;
    stop) shift; stop "$@" ;;
    version) install >/dev/null; version_of "$BIN" ;;
    *) echo "usage: $0 install | start [PORT] [MAX_PAYLOAD] | stop [PORT] | version" >&2; exit 2 ;;
esac
