#!/usr/bin/env bash
# The broker-core comparison, Hayate vs NATS vs the raw TCP baseline, in one command:
# builds `hayate` (release), starts a Hayate broker and nats-server (both accepting payloads
# up to 64 MiB), runs one `hayate bench thr` payload sweep and one `hayate bench lat` with both
# targets and --baseline, and writes everything to bench/results/<date>-<host>-core/:
#   thr.json, thr-msgs.svg, thr-bits.svg, lat.json, lat-lat.svg, machine.txt
# Both servers are stopped on exit, whatever happens. See bench/README.md.
#
# Environment: PAYLOADS (default 8..64MiB), DURATION per throughput point (default 3s),
# LAT_DURATION per latency run (default 2s), LAT_RUNS (default 10: the order of the
# systems rotates each run and the medians over the runs are reported), OUT (the output directory), RUST_LOG (default warn: client
# library chatter off; failed points are still reported).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$(pwd)"

PAYLOADS="${PAYLOADS:-8..64MiB}"
DURATION="${DURATION:-3s}"
LAT_DURATION="${LAT_DURATION:-2s}"
LAT_RUNS="${LAT_RUNS:-10}"
MAX_PAYLOAD=67108864
HOST="$(uname -n)"
OUT="${OUT:-bench/results/$(date +%F)-$HOST-core}"
NATS="$ROOT/bench/peers/nats.sh"
BIN="$ROOT/target/release/hayate"
export RUST_LOG="${RUST_LOG:-warn}"

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
# Runs a benchmark as a waited-for child, so that a signal to this script is handled at once
# (bash runs traps only between foreground commands) and the cleanup can stop it too.
bench() {
    "$BIN" bench "$@" &
    bench_pid=$!
    wait "$bench_pid"
    bench_pid=""
}

echo "== cargo build --release -p hayate"
cargo build --release -p hayate
"$NATS" install

tmp="$(mktemp -d)"
hayate_pid=""
nats_port=""
bench_pid=""
cleanup() {
    local rc=$?
    if [[ -n "$bench_pid" ]]; then
        kill "$bench_pid" 2>/dev/null && wait "$bench_pid" 2>/dev/null || true
    fi
    if [[ -n "$hayate_pid" ]]; then
        kill "$hayate_pid" 2>/dev/null && wait "$hayate_pid" 2>/dev/null || true
    fi
    if [[ -n "$nats_port" ]]; then
        "$NATS" stop "$nats_port" || true
    fi
    rm -rf "$tmp"
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# Hayate broker: port 4700 if free, otherwise one chosen by the kernel (read back from its
# start-up line).
hayate_listen=127.0.0.1:4700
port_open 4700 && hayate_listen=127.0.0.1:0
"$BIN" broker --listen "$hayate_listen" --amqp off --admin off --max-payload "$MAX_PAYLOAD" >"$tmp/hayate.out" 2>"$tmp/hayate.err" &
hayate_pid=$!
hayate_addr=""
for _ in $(seq 200); do
    hayate_addr="$(sed -n 's/.*native protocol on \(.*\)$/\1/p' "$tmp/hayate.out" | head -n1)"
    [[ -n "$hayate_addr" ]] && port_open "${hayate_addr##*:}" && break
    hayate_addr=""
    kill -0 "$hayate_pid" 2>/dev/null || break
    sleep 0.05
done
if [[ -z "$hayate_addr" ]]; then
    echo "run-core.sh: the Hayate broker did not start" >&2
    cat "$tmp/hayate.out" "$tmp/hayate.err" >&2
    exit 1
fi
echo "hayate broker on $hayate_addr (pid $hayate_pid)"

# nats-server: port 4222 if free, otherwise the next free one.
for p in $(seq 4222 4321); do
    if ! port_open "$p"; then nats_port=$p; break; fi
done
[[ -n "$nats_port" ]] || { echo "run-core.sh: no free port for nats-server" >&2; exit 1; }
"$NATS" start "$nats_port" "$MAX_PAYLOAD" || { nats_port=""; exit 1; }

targets=(--target "hayate://$hayate_addr" --target "nats://127.0.0.1:$nats_port" --baseline)
mkdir -p "$OUT"

{
    echo "date: $(date -u +%FT%TZ)"
    echo "uname -a: $(uname -a)"
    echo "nproc: $(nproc)"
    echo "cpu: $(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n1)"
    echo "nats-server: $("$NATS" version)"
    echo "hayate: $("$BIN" --version 2>/dev/null || echo unknown)"
    echo "git rev-parse HEAD: $(git rev-parse HEAD)"
    if [[ -n "$(git status --porcelain --untracked-files=no)" ]]; then
        echo "git: the work tree has uncommitted changes"
    fi
    echo "hayate broker: --max-payload $MAX_PAYLOAD"
    echo "nats-server config: $(tr '\n' ';' <"$ROOT/bench/peers/run/nats-$nats_port.conf")"
    echo "thr: hayate bench thr ${targets[*]} --payload $PAYLOADS --duration $DURATION"
    echo "lat: hayate bench lat ${targets[*]} --duration $LAT_DURATION --runs $LAT_RUNS"
} >"$OUT/machine.txt"

echo "== hayate bench thr (payloads $PAYLOADS, $DURATION per point)"
bench thr "${targets[@]}" --payload "$PAYLOADS" --duration "$DURATION" --json "$OUT/thr.json"
echo "== hayate bench lat ($LAT_RUNS runs of $LAT_DURATION, medians over the runs)"
bench lat "${targets[@]}" --duration "$LAT_DURATION" --runs "$LAT_RUNS" --json "$OUT/lat.json"

failed="$(cat "$OUT/thr.json" "$OUT/lat.json" | grep -c '"error": "' || true)"
if [[ "$failed" -gt 0 ]]; then
    echo "note: $failed point(s) failed; see the error column above and \"error\" in the JSON"
fi
echo "results in $OUT"
