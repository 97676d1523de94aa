#!/usr/bin/env bash
# Hayate vs NATS over a rate-limited link (shared/BENCH.md, "Link speed"): the broker and the
# clients live in two network namespaces joined by a veth pair, and both ends of the pair are
# shaped with `tc ... tbf` to each rate in turn (100 Mbit/s, 1 Gbit/s, 10 Gbit/s). Per rate it
# starts a Hayate broker and nats-server in the broker namespace, measures the achievable TCP
# line with iperf3 (if installed), runs one `hayate bench thr` payload sweep with both targets
# from the client namespace, and stops the servers. At the end it prints a table of msg/s,
# payload bit/s and link utilisation and writes, to bench/results/<date>-<host>-linkspeed/:
#   thr-<rate>.json (the `hayate bench thr` records), iperf3-<rate>[-bidir].json,
#   tc-<rate>.txt (qdisc statistics, cumulative), linkspeed.csv, linkspeed.md, machine.txt
#
# Utilisation: publisher and subscriber are both in the client namespace, so every message
# crosses the link twice, client -> broker and broker -> client, i.e. once in each direction
# of the full-duplex link; each direction therefore carries the payload bit rate, and
# utilisation = payload bit/s / link rate (headers and framing not counted, so TCP/IP/Ethernet
# overhead alone keeps it below ~95% with a 1500-byte MTU; iperf3 shows that ceiling).
#
# Needs root (CAP_NET_ADMIN) for `ip netns` and `tc`; without it, prints "skipped" and exits 0.
# Cleans up on exit whatever happens: stops the servers it started, deletes both namespaces
# (which removes the veth pair).
#
# Environment: RATES (default "100mbit 1gbit 10gbit", tc units: kbit/mbit/gbit are 10^3/10^6/
# 10^9 bit/s), PAYLOADS (default 64,1KiB,16KiB,256KiB,1MiB), DURATION per point (default 2s),
# IPERF_TIME seconds (default 3), OUT (the output directory), RUST_LOG (default warn).
# Does not build: run `cargo build --release -p hayate` first.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$(pwd)"

RATES="${RATES:-100mbit 1gbit 10gbit}"
PAYLOADS="${PAYLOADS:-64,1KiB,16KiB,256KiB,1MiB}"
DURATION="${DURATION:-2s}"
IPERF_TIME="${IPERF_TIME:-3}"
MAX_PAYLOAD=67108864
HOST="$(uname -n)"
OUT="${OUT:-bench/results/$(date +%F)-$HOST-linkspeed}"
BIN="$ROOT/target/release/hayate"
export RUST_LOG="${RUST_LOG:-warn}"

BRK_NS="hy-brk-$$"
CLI_NS="hy-cli-$$"
BRK_IF="hyb-$$"         # veth end in the broker namespace (interface names: <= 15 chars)
CLI_IF="hyc-$$"         # veth end in the client namespace
BRK_IP=10.77.0.1
CLI_IP=10.77.0.2
HAYATE_PORT=4700
NATS_PORT=4222
IPERF_PORT=5201

die() { echo "linkspeed.sh: $*" >&2; exit 1; }

[[ -x "$BIN" ]] || die "$BIN not found: cargo build --release -p hayate"
NATS_BIN=""
for c in "$ROOT/bench/peers/bin/nats-server" /work/tools/bin/nats-server; do
    if [[ -x "$c" ]]; then NATS_BIN="$c"; break; fi
done
if [[ -z "$NATS_BIN" ]]; then
    "$ROOT/bench/peers/nats.sh" install
    NATS_BIN="$ROOT/bench/peers/bin/nats-server"
fi
HAVE_IPERF=0
command -v iperf3 >/dev/null && HAVE_IPERF=1
command -v python3 >/dev/null || die "python3 is needed for the report"
command -v jq >/dev/null || die "jq is needed to merge the results"

# Link rate in bit/s from a tc rate ("100mbit", "1gbit", "10gbit", "500kbit", "1000000bit").
rate_bps() {
    local r="${1,,}" n unit
    [[ "$r" =~ ^([0-9]+)(bit|kbit|mbit|gbit|tbit)?$ ]] || die "unsupported rate: $1 (use e.g. 100mbit)"
    n="${BASH_REMATCH[1]}"; unit="${BASH_REMATCH[2]:-bit}"
    case "$unit" in
        bit) echo "$n" ;;
        kbit) echo "$((n * 1000))" ;;
        mbit) echo "$((n * 1000000))" ;;
        gbit) echo "$((n * 1000000000))" ;;
        tbit) echo "$((n * 1000000000000))" ;;
    esac
}
for r in $RATES; do rate_bps "$r" >/dev/null; done

# --- cleanup ------------------------------------------------------------------------------
tmp="$(mktemp -d)"
pids=()            # servers started by this script
bench_pid=""
ns_made=()
cleanup() {
    local rc=$?
    trap - EXIT INT TERM
    if [[ -n "$bench_pid" ]]; then
        kill "$bench_pid" 2>/dev/null && wait "$bench_pid" 2>/dev/null || true
    fi
    stop_servers
    local ns p
    for ns in "${ns_made[@]}"; do
        # Anything still running inside our namespaces was started by this script.
        for p in $(ip netns pids "$ns" 2>/dev/null); do kill -9 "$p" 2>/dev/null || true; done
        ip netns del "$ns" 2>/dev/null || true
    done
    rm -rf "$tmp"
    exit "$rc"
}
stop_servers() {
    local p i
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    for p in "${pids[@]}"; do
        for ((i = 0; i < 50; i++)); do
            kill -0 "$p" 2>/dev/null || break
            sleep 0.1
        done
        kill -9 "$p" 2>/dev/null || true
        wait "$p" 2>/dev/null || true
    done
    pids=()
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# --- the two namespaces and the veth pair ---------------------------------------------------
if ! ip netns add "$BRK_NS" 2>"$tmp/netns.err"; then
    echo "linkspeed.sh: skipped: cannot create network namespaces ($(tr '\n' ' ' <"$tmp/netns.err"))"
    echo "linkspeed.sh: needs root / CAP_NET_ADMIN (ip netns, tc)"
    exit 0
fi
ns_made+=("$BRK_NS")
ip netns add "$CLI_NS"
ns_made+=("$CLI_NS")
ip link add "$BRK_IF" netns "$BRK_NS" type veth peer name "$CLI_IF" netns "$CLI_NS"
ip -n "$BRK_NS" addr add "$BRK_IP/24" dev "$BRK_IF"
ip -n "$CLI_NS" addr add "$CLI_IP/24" dev "$CLI_IF"
for ns in "$BRK_NS" "$CLI_NS"; do ip -n "$ns" link set lo up; done
ip -n "$BRK_NS" link set "$BRK_IF" up
ip -n "$CLI_NS" link set "$CLI_IF" up
echo "namespaces $BRK_NS ($BRK_IF $BRK_IP) <-veth-> $CLI_NS ($CLI_IF $CLI_IP)"

in_brk() { ip netns exec "$BRK_NS" "$@"; }
in_cli() { ip netns exec "$CLI_NS" "$@"; }
# True when the broker namespace accepts TCP connections on $1, tried from the client side.
port_open() { in_cli bash -c "exec 3<>/dev/tcp/$BRK_IP/$1" 2>/dev/null; }
wait_port() {   # PORT PID NAME LOG
    local i
    for ((i = 0; i < 200; i++)); do
        kill -0 "$2" 2>/dev/null || { cat "$4" >&2; die "$3 exited on start (log above)"; }
        port_open "$1" && return 0
        sleep 0.05
    done
    cat "$4" >&2
    die "$3 did not accept connections on $BRK_IP:$1 within 10s"
}
# Runs a benchmark as a waited-for child, so that a signal is handled at once. Background
# processes are started with `ip netns exec` itself (which execs the command, so $! is its pid),
# not through in_brk/in_cli (a backgrounded function would be a subshell).
run_child() {
    "$@" &
    bench_pid=$!
    wait "$bench_pid"
    bench_pid=""
}

# Shapes both directions: tbf on the egress of each veth end. Burst: 1 ms at the rate, and at
# least 64 KiB so that a full GSO/TSO segment (64 KiB) passes without being split; latency
# 20 ms bounds the queue (limit = rate * latency + burst).
shape() {
    local rate="$1" bps burst
    bps="$(rate_bps "$rate")"
    burst=$((bps / 8 / 1000))
    ((burst < 65536)) && burst=65536
    in_brk tc qdisc replace dev "$BRK_IF" root tbf rate "$rate" burst "$burst" latency 20ms
    in_cli tc qdisc replace dev "$CLI_IF" root tbf rate "$rate" burst "$burst" latency 20ms
    echo "tc: tbf rate $rate burst $burst latency 20ms on $BRK_IF and $CLI_IF"
}

# Waits (at most 20 s) until neither direction of the link carries more than 1% of RATE, so
# that a point does not share the link with what the previous one left queued.
wait_idle() {
    local bps a1 b1 a2 b2 i
    bps="$(rate_bps "$1")"
    for ((i = 0; i < 100; i++)); do
        a1="$(in_brk cat "/sys/class/net/$BRK_IF/statistics/tx_bytes")"
        b1="$(in_cli cat "/sys/class/net/$CLI_IF/statistics/tx_bytes")"
        sleep 0.2
        a2="$(in_brk cat "/sys/class/net/$BRK_IF/statistics/tx_bytes")"
        b2="$(in_cli cat "/sys/class/net/$CLI_IF/statistics/tx_bytes")"
        if (((a2 - a1) * 8 * 5 < bps / 100 && (b2 - b1) * 8 * 5 < bps / 100)); then
            return 0
        fi
    done
    echo "linkspeed.sh: warning: the link did not go idle within 20 s" >&2
}

nats_conf="$tmp/nats.conf"
# As bench/peers/nats.sh: max_payload 64 MiB, max_pending 4 payloads (so that a subscriber
# is not cut off as a slow consumer at the largest payloads).
{
    echo "# written by bench/linkspeed.sh"
    echo "listen: $BRK_IP:$NATS_PORT"
    echo "max_payload: $MAX_PAYLOAD"
    echo "max_pending: $((MAX_PAYLOAD * 4))"
} >"$nats_conf"

start_servers() {
    local log
    log="$tmp/hayate.log"
    ip netns exec "$BRK_NS" "$BIN" broker --listen "$BRK_IP:$HAYATE_PORT" --max-payload "$MAX_PAYLOAD" >"$log" 2>&1 &
    pids+=($!)
    wait_port "$HAYATE_PORT" "${pids[-1]}" "hayate broker" "$log"
    log="$tmp/nats.log"
    ip netns exec "$BRK_NS" "$NATS_BIN" -c "$nats_conf" -a "$BRK_IP" -p "$NATS_PORT" >"$log" 2>&1 &
    pids+=($!)
    wait_port "$NATS_PORT" "${pids[-1]}" "nats-server" "$log"
    if ((HAVE_IPERF)); then
        log="$tmp/iperf3.log"
        ip netns exec "$BRK_NS" iperf3 -s -B "$BRK_IP" -p "$IPERF_PORT" >"$log" 2>&1 &
        pids+=($!)
        wait_port "$IPERF_PORT" "${pids[-1]}" "iperf3 -s" "$log"
    fi
}

mkdir -p "$OUT"
{
    echo "date: $(date -u +%FT%TZ)"
    echo "uname -a: $(uname -a)"
    echo "nproc: $(nproc)"
    echo "cpu: $(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n1)"
    echo "loadavg at start: $(cat /proc/loadavg)"
    echo "nats-server: $("$NATS_BIN" --version 2>/dev/null | head -n1) ($NATS_BIN)"
    echo "hayate: $("$BIN" --version 2>/dev/null || echo unknown)"
    echo "iperf3: $( ((HAVE_IPERF)) && iperf3 --version | head -n1 || echo 'not installed')"
    echo "git rev-parse HEAD: $(git rev-parse HEAD 2>/dev/null || echo unknown)"
    if [[ -n "$(git status --porcelain --untracked-files=no 2>/dev/null)" ]]; then
        echo "git: the work tree has uncommitted changes"
    fi
    echo "link: veth $BRK_NS/$BRK_IF $BRK_IP <-> $CLI_NS/$CLI_IF $CLI_IP, mtu $(ip -n "$BRK_NS" -o link show "$BRK_IF" | sed -n 's/.* mtu \([0-9]*\).*/\1/p')"
    echo "shaping: tc qdisc replace dev <each veth end> root tbf rate <RATE> burst max(64KiB, 1 ms at RATE) latency 20ms"
    echo "rates: $RATES"
    echo "hayate broker: hayate broker --listen $BRK_IP:$HAYATE_PORT --max-payload $MAX_PAYLOAD (broker namespace)"
    echo "nats-server config: $(tr '\n' ';' <"$nats_conf")"
    echo "thr (client namespace): hayate bench thr --target hayate://$BRK_IP:$HAYATE_PORT --target nats://$BRK_IP:$NATS_PORT --payload $PAYLOADS --duration $DURATION"
    echo "iperf3 (client namespace): iperf3 -c $BRK_IP -t $IPERF_TIME -J, and the same with --bidir"
} >"$OUT/machine.txt"

for rate in $RATES; do
    echo
    echo "=== link $rate"
    shape "$rate"
    start_servers
    if ((HAVE_IPERF)); then
        echo "== iperf3 ($IPERF_TIME s, one way, client -> broker)"
        run_child ip netns exec "$CLI_NS" iperf3 -c "$BRK_IP" -p "$IPERF_PORT" -t "$IPERF_TIME" -J >"$OUT/iperf3-$rate.json" \
            || echo "iperf3 failed (see $OUT/iperf3-$rate.json)"
        echo "== iperf3 ($IPERF_TIME s, both directions at once)"
        run_child ip netns exec "$CLI_NS" iperf3 -c "$BRK_IP" -p "$IPERF_PORT" -t "$IPERF_TIME" --bidir -J >"$OUT/iperf3-$rate-bidir.json" \
            || echo "iperf3 --bidir failed (see $OUT/iperf3-$rate-bidir.json)"
    fi
    echo "== hayate bench thr (payloads $PAYLOADS, $DURATION per point, one process per point)"
    # One `hayate bench thr` process per system and payload, and the link left to go idle in
    # between: when a point ends, a client that buffers its publications (async-nats queues
    # thousands of them) would otherwise keep the link busy well into the next point (seen:
    # Hayate 1 MiB at 100 Mbit/s measured at half the line right after NATS 256 KiB). The
    # first system alternates per payload.
    rm -rf "$tmp/points" && mkdir -p "$tmp/points"
    n=0
    for payload in ${PAYLOADS//,/ }; do
        systems=("hayate://$BRK_IP:$HAYATE_PORT" "nats://$BRK_IP:$NATS_PORT")
        ((n % 2)) && systems=("${systems[1]}" "${systems[0]}")
        for target in "${systems[@]}"; do
            wait_idle "$rate"
            n=$((n + 1))
            run_child ip netns exec "$CLI_NS" "$BIN" bench thr --target "$target" \
                --payload "$payload" --duration "$DURATION" --json "$tmp/points/$(printf %03d $n).json" \
                >"$tmp/point.log" 2>&1 || echo "hayate bench thr exited with an error:"
            # The result row, and any warning (e.g. a publisher that did not stop in time).
            sed -nE 's/\x1b\[[0-9;]*m//g; /^ *[0-9.]+ (B|KiB|MiB) +(hayate|nats) |WARN|ERROR|rror:/p' "$tmp/point.log"
        done
    done
    jq -s 'add' "$tmp"/points/*.json >"$OUT/thr-$rate.json"
    wait_idle "$rate"
    stop_servers
    # qdisc statistics (drops, overlimits); `tc qdisc replace` keeps the counters, so they
    # are cumulative over the rates run so far.
    in_brk tc -s qdisc show dev "$BRK_IF" >"$OUT/tc-$rate.txt"
    in_cli tc -s qdisc show dev "$CLI_IF" >>"$OUT/tc-$rate.txt"
done
echo "loadavg at end: $(cat /proc/loadavg)" >>"$OUT/machine.txt"

# --- report -----------------------------------------------------------------------------------
rates_bps=""
for rate in $RATES; do rates_bps+="$rate=$(rate_bps "$rate") "; done
python3 - "$OUT" "$rates_bps" <<'EOF'
import json, os, sys

out, rates = sys.argv[1], [r.split("=") for r in sys.argv[2].split()]
SYSTEMS = [("hayate", "Hayate"), ("nats", "NATS")]

def size(n):
    for unit, f in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= f and n % f == 0:
            return f"{n // f} {unit}"
    return f"{n} B"

def mbit(b):
    return "" if b is None else f"{b / 1e6:,.1f}"

def pct(b, bps):
    return "" if b is None else f"{100 * b / bps:.1f}"

def load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None

csv = ["rate,rate_bps,system,payload_bytes,msgs_per_sec,bits_per_sec,utilisation_pct,error"]
md = []
iperf_rows = []
for rate, bps in rates:
    bps = int(bps)
    # iperf3: the TCP line, one way and per direction with both directions loaded at once.
    one = load(os.path.join(out, f"iperf3-{rate}.json"))
    bi = load(os.path.join(out, f"iperf3-{rate}-bidir.json"))
    one_b = bi_f = bi_r = None
    try:
        one_b = one["end"]["sum_received"]["bits_per_second"]
    except (TypeError, KeyError):
        pass
    try:
        bi_f = bi["end"]["sum_received"]["bits_per_second"]
        bi_r = bi["end"]["sum_received_bidir_reverse"]["bits_per_second"]
    except (TypeError, KeyError):
        pass
    for name, b in (("iperf3", one_b), ("iperf3-bidir-up", bi_f), ("iperf3-bidir-down", bi_r)):
        if b is not None:
            csv.append(f"{rate},{bps},{name},,,{b:.0f},{100 * b / bps:.2f},")
    if one_b is not None or bi_f is not None:
        iperf_rows.append(f"| {rate} | {mbit(one_b)} | {pct(one_b, bps)} | "
                          f"{mbit(bi_f)} / {mbit(bi_r)} | {pct(bi_f, bps)} / {pct(bi_r, bps)} |")

    recs = load(os.path.join(out, f"thr-{rate}.json")) or []
    by = {}
    for r in recs:
        by[(r["system"], r["payload_bytes"])] = r
        m, b, e = r.get("msgs_per_sec"), r.get("bits_per_sec"), r.get("error")
        u = "" if b is None else f"{100 * b / bps:.2f}"
        e = '"' + e.replace('"', "'") + '"' if e else ""
        ms = "" if m is None else f"{m:.1f}"
        bs = "" if b is None else f"{b:.0f}"
        csv.append(f"{rate},{bps},{r['system']},{r['payload_bytes']},{ms},{bs},{u},{e}")
    for p in sorted({p for (_, p) in by}):
        cells = []
        for s, _ in SYSTEMS:
            r = by.get((s, p))
            if r is None:
                cells += ["", "", ""]
            elif r.get("error"):
                cells += ["error", "", ""]
            else:
                cells += [f"{r['msgs_per_sec']:,.0f}", mbit(r["bits_per_sec"]), pct(r["bits_per_sec"], bps)]
        md.append(f"| {rate} | {size(p)} | " + " | ".join(cells) + " |")

with open(os.path.join(out, "linkspeed.csv"), "w") as f:
    f.write("\n".join(csv) + "\n")

lines = [
    "Payload throughput through the broker over the shaped link (utilisation = payload bit/s / link rate, per direction):",
    "",
    "| Link | Payload | Hayate msg/s | Hayate Mbit/s | Hayate util % | NATS msg/s | NATS Mbit/s | NATS util % |",
    "|---|---:|---:|---:|---:|---:|---:|---:|",
] + md
if iperf_rows:
    lines += [
        "",
        "The TCP line on the same link (iperf3, 1 stream; Mbit/s of TCP payload):",
        "",
        "| Link | iperf3 one way Mbit/s | util % | iperf3 --bidir up / down Mbit/s | util % |",
        "|---|---:|---:|---:|---:|",
    ] + iperf_rows
text = "\n".join(lines) + "\n"
with open(os.path.join(out, "linkspeed.md"), "w") as f:
    f.write(text)
print()
print(text, end="")
EOF

failed="$(cat "$OUT"/thr-*.json | grep -c '"error": "' || true)"
if [[ "$failed" -gt 0 ]]; then
    echo "note: $failed point(s) failed; see \"error\" in $OUT/thr-*.json and linkspeed.csv"
fi
echo "results in $OUT"
