#!/usr/bin/env bash
# zenohd, the Zenoh router, a peer Hayate is compared with (see bench/peers/README.md).
#
#   bench/peers/zenoh.sh install          zenohd 1.10.2 into bench/peers/bin/zenoh/bin/: copies
#                                         an existing one of that version (ZENOHD_BIN, then
#                                         /work/tools/bin/zenohd, then the PATH) or builds it
#                                         with `cargo install` (~20 minutes on 2 cores)
#   bench/peers/zenoh.sh start [PORT]     the router on tcp/127.0.0.1:PORT (default 7447), no
#                                         multicast scouting; waits until the port accepts
#                                         connections. Does not build: run install first
#   bench/peers/zenoh.sh stop [PORT]      stops the router started on PORT (default: every
#                                         router this script started)
#   bench/peers/zenoh.sh version          the installed zenohd's version
#
# bench/peers/bin and bench/peers/run (pid and log files) are git-ignored. Keep the zenohd
# build out of CI: it is the longest install of all the peers.
set -euo pipefail

VERSION=1.10.2
HERE="$(cd "$(dirname "$0")" && pwd)"
ROOT="$HERE/bin/zenoh"
RUN_DIR="$HERE/run"
# shellcheck source=lib.sh
. "$HERE/lib.sh"
BIN="$ROOT/bin/zenohd"

die() { echo "zenoh.sh: $*" >&2; exit 1; }

# The version a zenohd binary reports ("1.10.2"), or nothing.
version_of() {
    { "$1" --version 2>/dev/null || true; } | grep -oE '[0-9]+\.[0-9]+\.[0-9]+' | head -n1
}

installed() { [[ -x "$BIN" && "$(version_of "$BIN")" == "$VERSION" ]]; }

install() {
    installed && return 0
    mkdir -p "$ROOT/bin"
    local c
    for c in "${ZENOHD_BIN:-}" /work/tools/bin/zenohd "$(command -v zenohd || true)"; do
        if [[ -n "$c" && -x "$c" && "$(version_of "$c")" == "$VERSION" ]]; then
            cp "$c" "$BIN.tmp" && mv "$BIN.tmp" "$BIN"
            echo "zenoh.sh: zenohd $VERSION copied from $c"
            return 0
        fi
    done
    command -v cargo >/dev/null || die "zenohd $VERSION not found and cargo is not installed"
    echo "zenoh.sh: cargo install zenohd --version $VERSION --locked (about 20 minutes on 2 cores)"
    # A target dir of its own, so that the build does not lock or fill the workspace's.
    CARGO_TARGET_DIR="$ROOT/target" \
        cargo install zenohd --version "$VERSION" --locked --root "$ROOT"
    rm -rf "$ROOT/target"
    installed || die "$BIN does not report $VERSION"
}

# True when something accepts TCP connections on 127.0.0.1:$1.

start() {
    local port="${1:-7447}"
    [[ "$port" =~ ^[0-9]+$ ]] || die "bad port: $port"
    if [[ ! -x "$BIN" ]]; then
        die "zenohd is not installed ($BIN missing): run bench/peers/zenoh.sh install first (a cargo build of about 20 minutes on 2 cores)"
    fi
    installed || die "$BIN is not zenohd $VERSION (it reports '$(version_of "$BIN")'): run bench/peers/zenoh.sh install"
    mkdir -p "$RUN_DIR"
    local pidfile="$RUN_DIR/zenohd-$port.pid" log="$RUN_DIR/zenohd-$port.log"
    peer_check_free "$pidfile" "$port"
    "$BIN" --no-multicast-scouting -l "tcp/127.0.0.1:$port" >"$log" 2>&1 </dev/null &
    local pid=$!
    echo "$pid" >"$pidfile"
    peer_wait_up zenohd "$pid" "$pidfile" "$port" 20 'zenohd' 50 "$log"
    echo "zenoh.sh: zenohd $VERSION on tcp/127.0.0.1:$port (pid $pid)"
}

stop() { peer_stop zenohd 'zenohd' 50 "$@"; }

case "${1:-}" in
    install) install ;;
    start) shift; start "$@" ;;
    stop) shift; stop "$@" ;;
    version)
        installed || die "zenohd $VERSION is not installed: run bench/peers/zenoh.sh install (about 20 minutes)"
        version_of "$BIN" ;;
    *) echo "usage: $0 install | start [PORT] | stop [PORT] | version" >&2; exit 2 ;;
esac
