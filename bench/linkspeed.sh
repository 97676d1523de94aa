#!/usr/bin/env bash
# Hayate and its peers over a rate-limited link (shared/BENCH.md, "Link speed"): the brokers and
# the clients live in two network namespaces joined by a veth pair, and both ends of the pair
# are shaped with `tc ... tbf` to each rate in turn (100 Mbit/s, 1 Gbit/s, 10 Gbit/s). Per rate
# it starts every system's server in the broker namespace, listening on the veth address
# (Hayate's broker, nats-server, Mosquitto, zenohd, one RabbitMQ node for AMQP 0-9-1 and STOMP,
# Kafka in KRaft mode), measures the achievable TCP line with iperf3 (if installed), runs one
# `hayate bench thr` payload sweep over all the systems from the client namespace, and stops
# the servers. At the end it prints a table of msg/s, payload bit/s and link utilisation per
# link, payload and system and writes, to bench/results/<date>-<host>-linkspeed/:
#   thr-<rate>.json (the `hayate bench thr` records), iperf3-<rate>[-bidir].json,
#   tc-<rate>.txt (qdisc statistics, cumulative), linkspeed.csv, linkspeed.md, machine.txt
#
# Systems (SYSTEMS, in this order by default) and the targets measured:
#   hayate          hayate://BRK:4700                    hayate broker --max-payload 64 MiB
#   nats            nats://BRK:4222                      nats-server, as bench/peers/nats.sh
#   mosquitto       mqtt://BRK:1883?name=mosquitto       MQTT QoS 0; config as mosquitto.sh
#   zenoh           zenoh://BRK:7447                     zenohd router, sessions in client mode
#   rabbitmq        amqp://BRK:5672?name=rabbitmq        AMQP 0-9-1  } one node, started with
#   rabbitmq-stomp  stomp://BRK:61613?name=rabbitmq-stomp  STOMP     } bench/peers/rabbitmq.sh
#   kafka           kafka://BRK:19092                    KRaft, started with bench/peers/kafka.sh
# The mqtt, amqp, zenoh and kafka drivers are only in a binary built with the peers feature
# (`cargo build --release -p hayate --features hayate/peers`); without them those systems are
# skipped with a note (on the terminal, in machine.txt and in the report), and so is a system
# whose server is not installed (the peers' install verbs: bench/peers/README.md). RabbitMQ and
# Kafka run through their scripts inside the broker namespace with PEER_HOST set to the veth
# address (`ip netns exec NS env PEER_HOST=10.77.0.1 bench/peers/rabbitmq.sh start`): their
# run files are then their own, apart from any default instance on the machine's 127.0.0.1,
# and epmd, the Erlang distribution port and the namespace's loopback stay inside the
# namespace. A server that does not come up at some rate is noted and its points skipped there.
#
# Utilisation: publisher and subscriber are both in the client namespace, so every message
# crosses the link twice, client -> broker and broker -> client, i.e. once in each direction
# of the full-duplex link; each direction therefore carries the payload bit rate, and
# utilisation = payload bit/s / link rate (headers and framing not counted, so TCP/IP/Ethernet
# overhead alone keeps it below ~95% with a 1500-byte MTU; iperf3 shows that ceiling).
#
# Needs root (CAP_NET_ADMIN) for `ip netns` and `tc`; without it, prints "skipped" and exits 0.
# Cleans up on exit whatever happens: stops the servers it started (RabbitMQ and Kafka with
# their scripts' stop), deletes both namespaces (which removes the veth pair, and kills
# whatever still runs in them).
#
# Environment: SYSTEMS (default "hayate nats mosquitto zenoh rabbitmq rabbitmq-stomp kafka"),
# RATES (default "100mbit 1gbit 10gbit", tc units: kbit/mbit/gbit are 10^3/10^6/10^9 bit/s),
# PAYLOADS (default 64,1KiB,16KiB,256KiB,1MiB), DURATION per point (default 2s), IPERF_TIME
# seconds (default 3), OUT (the output directory), RUST_LOG (default warn).
# Does not build: run `cargo build --release -p hayate --features hayate/peers` first (without
# the feature: Hayate, NATS and RabbitMQ's STOMP only).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$(pwd)"

SYSTEMS="${SYSTEMS:-hayate nats mosquitto zenoh rabbitmq rabbitmq-stomp kafka}"
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
MOSQUITTO_PORT=1883
ZENOH_PORT=7447
AMQP_PORT=5672          # RabbitMQ's listeners (rabbitmq.sh start AMQP STOMP MQTT); its MQTT
STOMP_PORT=61613        # plugin listens too, unmeasured here
RABBIT_MQTT_PORT=11883
KAFKA_PORT=19092        # and the KRaft controller on 19093
IPERF_PORT=5201
RABBITMQ_SH="$ROOT/bench/peers/rabbitmq.sh"
KAFKA_SH="$ROOT/bench/peers/kafka.sh"

die() { echo "linkspeed.sh: $*" >&2; exit 1; }

[[ -x "$BIN" ]] || die "$BIN not found: cargo build --release -p hayate --features hayate/peers"

# The target URL of a system (the broker namespace's address); false for an unknown name.
target_of() {
    case "$1" in
        hayate) echo "hayate://$BRK_IP:$HAYATE_PORT" ;;
        nats) echo "nats://$BRK_IP:$NATS_PORT" ;;
        mosquitto) echo "mqtt://$BRK_IP:$MOSQUITTO_PORT?name=mosquitto" ;;
        zenoh) echo "zenoh://$BRK_IP:$ZENOH_PORT" ;;
        rabbitmq) echo "amqp://$BRK_IP:$AMQP_PORT?name=rabbitmq" ;;
        rabbitmq-stomp) echo "stomp://$BRK_IP:$STOMP_PORT?name=rabbitmq-stomp" ;;
        kafka) echo "kafka://$BRK_IP:$KAFKA_PORT" ;;
        *) return 1 ;;
    esac
}
wanted=()
for s in $SYSTEMS; do
    target_of "$s" >/dev/null || die "unknown system: $s (known: hayate nats mosquitto zenoh rabbitmq rabbitmq-stomp kafka)"
    [[ " ${wanted[*]} " == *" $s "* ]] || wanted+=("$s")
done
((${#wanted[@]})) || die "SYSTEMS is empty"

# Which systems can run: the driver is compiled in and the server installed. Each one that
# cannot is skipped with a note (notes also go to machine.txt and the report).
systems=()         # the systems measured, in SYSTEMS order
notes=()           # "system: why it is not measured"
rate_notes=()      # "system at RATE: why it is not measured there"
skip() { notes+=("$1: $2"); echo "linkspeed.sh: skipping $1: $2"; }
PEERS_BUILD=""     # whether the binary has the peers' drivers (asked only if one is wanted)
if [[ " ${wanted[*]} " =~ \ (mosquitto|zenoh|rabbitmq|kafka)\  ]]; then
    # Target::parse refuses a driver that is not compiled in; otherwise this only fails to
    # connect. (Output captured first: with pipefail, `... | grep -q` would see the exit status.)
    probe="$(timeout 60 "$BIN" bench thr --target zenoh://127.0.0.1:1 --duration 10ms --payload 8 2>&1 || true)"
    if [[ "$probe" == *"not compiled in"* ]]; then PEERS_BUILD=no; else PEERS_BUILD=yes; fi
fi
NATS_BIN="" MOSQUITTO_BIN="" ZENOHD_BIN=""
for s in "${wanted[@]}"; do
    driver=""
    case "$s" in
        mosquitto) driver=mqtt ;;
        zenoh) driver=zenoh ;;
        rabbitmq) driver=amqp ;;
        kafka) driver=kafka ;;
    esac
    if [[ -n "$driver" && "$PEERS_BUILD" == no ]]; then
        skip "$s" "the $driver driver is not compiled in (cargo build --release -p hayate --features hayate/peers)"
        continue
    fi
    case "$s" in
        nats)
            for c in "$ROOT/bench/peers/bin/nats-server" /work/tools/bin/nats-server; do
                if [[ -x "$c" ]]; then NATS_BIN="$c"; break; fi
            done
            if [[ -z "$NATS_BIN" ]]; then
                "$ROOT/bench/peers/nats.sh" install
                NATS_BIN="$ROOT/bench/peers/bin/nats-server"
            fi ;;
        mosquitto)
            MOSQUITTO_BIN="$(command -v mosquitto || true)"
            [[ -z "$MOSQUITTO_BIN" && -x /usr/sbin/mosquitto ]] && MOSQUITTO_BIN=/usr/sbin/mosquitto
            [[ -n "$MOSQUITTO_BIN" ]] || { skip "$s" "mosquitto is not installed (bench/peers/mosquitto.sh install)"; continue; } ;;
        zenoh)
            ZENOHD_BIN="$ROOT/bench/peers/bin/zenoh/bin/zenohd"
            [[ -x "$ZENOHD_BIN" ]] || { skip "$s" "zenohd is not installed (bench/peers/zenoh.sh install: a cargo build of ~20 minutes)"; continue; } ;;
        rabbitmq | rabbitmq-stomp)
            [[ -x /usr/lib/rabbitmq/bin/rabbitmq-server ]] || { skip "$s" "rabbitmq-server is not installed (bench/peers/rabbitmq.sh install)"; continue; } ;;
        kafka)
            if ! command -v java >/dev/null || ! compgen -G "$ROOT/bench/peers/bin/kafka-libs/.installed-*" >/dev/null; then
                skip "$s" "Kafka is not installed (java, and bench/peers/kafka.sh install)"
                continue
            fi ;;
    esac
    systems+=("$s")
done
((${#systems[@]})) || die "none of the systems ($SYSTEMS) can be measured (notes above)"
# True when system $1 is measured in this run.
measured() { [[ " ${systems[*]} " == *" $1 "* ]]; }
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
scripts=()         # peer scripts whose `start` ran (rabbitmq, kafka): stopped with their `stop`
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
    # Through the scripts, in the namespace they were started in, with the same PEER_HOST: they
    # find their own run files (never a default instance's) and stop only what they started.
    for p in "${scripts[@]}"; do
        case "$p" in
            rabbitmq) in_brk env PEER_HOST="$BRK_IP" "$RABBITMQ_SH" stop || true ;;
            kafka) in_brk env PEER_HOST="$BRK_IP" "$KAFKA_SH" stop "$KAFKA_PORT" || true ;;
        esac
    done
    scripts=()
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
# PORT PID NAME LOG [SECONDS, default 10]: waits until the server PID accepts connections on
# PORT; false, with its log shown, if it exits or is not up in time.
wait_port() {
    local i secs="${5:-10}"
    for ((i = 0; i < secs * 20; i++)); do
        if ! kill -0 "$2" 2>/dev/null; then
            cat "$4" >&2
            echo "linkspeed.sh: $3 exited on start (log above)" >&2
            return 1
        fi
        port_open "$1" && return 0
        sleep 0.05
    done
    cat "$4" >&2
    echo "linkspeed.sh: $3 did not accept connections on $BRK_IP:$1 within ${secs}s" >&2
    return 1
}
# Runs a benchmark (or a peer script's start) as a waited-for child, so that a signal is
# handled at once. Background
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
mosquitto_conf="$tmp/mosquitto.conf"
# As bench/peers/mosquitto.sh (shared/peers/mosquitto.conf), on the veth address: no
# persistence, no limit on what is queued for a slow subscriber (the default of 1000 messages
# would drop under a back-to-back publisher). Started as root, it drops to the mosquitto user
# after binding.
{
    echo "# written by bench/linkspeed.sh from shared/peers/mosquitto.conf"
    echo "listener $MOSQUITTO_PORT $BRK_IP"
    echo "allow_anonymous true"
    echo "persistence false"
    echo "max_queued_messages 0"
    echo "max_queued_bytes 0"
    echo "log_dest stderr"
    echo "log_type error"
    echo "log_type warning"
    echo "log_type notice"
} >"$mosquitto_conf"

down=" "           # the systems whose server did not come up at the current rate
# Marks systems as not measured at RATE: their server did not start.
server_down() {
    local rate="$1" s
    shift
    for s in "$@"; do
        measured "$s" || continue
        down+="$s "
        rate_notes+=("$s at $rate: its server did not start")
        echo "linkspeed.sh: $s is not measured at $rate: its server did not start" >&2
    done
}

# Starts the servers of the measured systems in the broker namespace. Hayate, NATS and iperf3
# must come up (or the run ends); a peer that does not is noted and skipped at this rate.
start_servers() {
    local rate="$1" log
    down=" "
    if measured hayate; then
        log="$tmp/hayate.log"
        ip netns exec "$BRK_NS" "$BIN" broker --listen "$BRK_IP:$HAYATE_PORT" --amqp off --admin off --max-payload "$MAX_PAYLOAD" >"$log" 2>&1 &
        pids+=($!)
        wait_port "$HAYATE_PORT" "${pids[-1]}" "hayate broker" "$log" || exit 1
    fi
    if measured nats; then
        log="$tmp/nats.log"
        ip netns exec "$BRK_NS" "$NATS_BIN" -c "$nats_conf" -a "$BRK_IP" -p "$NATS_PORT" >"$log" 2>&1 &
        pids+=($!)
        wait_port "$NATS_PORT" "${pids[-1]}" "nats-server" "$log" || exit 1
    fi
    if measured mosquitto; then
        log="$tmp/mosquitto.log"
        ip netns exec "$BRK_NS" "$MOSQUITTO_BIN" -c "$mosquitto_conf" >"$log" 2>&1 </dev/null &
        pids+=($!)
        wait_port "$MOSQUITTO_PORT" "${pids[-1]}" "mosquitto" "$log" || server_down "$rate" mosquitto
    fi
    if measured zenoh; then
        # As bench/peers/zenoh.sh, on the veth address.
        log="$tmp/zenohd.log"
        ip netns exec "$BRK_NS" "$ZENOHD_BIN" --no-multicast-scouting -l "tcp/$BRK_IP:$ZENOH_PORT" >"$log" 2>&1 </dev/null &
        pids+=($!)
        wait_port "$ZENOH_PORT" "${pids[-1]}" "zenohd" "$log" 20 || server_down "$rate" zenoh
    fi
    if measured rabbitmq || measured rabbitmq-stomp; then
        # One node for both; the script waits until AMQP, STOMP and MQTT accept connections
        # (on a loaded 2-core machine: ~25 s). Registered for stop before it starts, so that an
        # interrupted start is stopped too.
        scripts+=(rabbitmq)
        run_child ip netns exec "$BRK_NS" env PEER_HOST="$BRK_IP" "$RABBITMQ_SH" start "$AMQP_PORT" "$STOMP_PORT" "$RABBIT_MQTT_PORT" \
            || server_down "$rate" rabbitmq rabbitmq-stomp
    fi
    if measured kafka; then
        scripts+=(kafka)
        run_child ip netns exec "$BRK_NS" env PEER_HOST="$BRK_IP" "$KAFKA_SH" start "$KAFKA_PORT" "$MAX_PAYLOAD" \
            || server_down "$rate" kafka
    fi
    if ((HAVE_IPERF)); then
        log="$tmp/iperf3.log"
        ip netns exec "$BRK_NS" iperf3 -s -B "$BRK_IP" -p "$IPERF_PORT" >"$log" 2>&1 &
        pids+=($!)
        wait_port "$IPERF_PORT" "${pids[-1]}" "iperf3 -s" "$log" || exit 1
    fi
}

mkdir -p "$OUT"
{
    echo "date: $(date -u +%FT%TZ)"
    echo "uname -a: $(uname -a)"
    echo "nproc: $(nproc)"
    echo "cpu: $(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n1)"
    echo "loadavg at start: $(cat /proc/loadavg)"
    echo "hayate: $("$BIN" --version 2>/dev/null || echo unknown)"
    if [[ -n "$PEERS_BUILD" ]]; then
        echo "peers drivers (mqtt, amqp, zenoh, kafka) in $BIN: $([[ "$PEERS_BUILD" == yes ]] && echo "compiled in" || echo "not compiled in")"
    fi
    echo "systems asked (SYSTEMS): ${wanted[*]}"
    echo "systems measured: ${systems[*]}"
    for note in "${notes[@]}"; do echo "skipped: $note"; done
    measured nats && echo "nats-server: $("$NATS_BIN" --version 2>/dev/null | head -n1) ($NATS_BIN)"
    measured mosquitto && echo "mosquitto: $({ "$MOSQUITTO_BIN" -h 2>/dev/null || true; } | sed -n 's/^mosquitto version *//p' | head -n1) ($MOSQUITTO_BIN)"
    measured zenoh && echo "zenohd: $("$ZENOHD_BIN" --version 2>/dev/null | head -n1) ($ZENOHD_BIN)"
    if measured rabbitmq || measured rabbitmq-stomp; then
        echo "rabbitmq: $("$RABBITMQ_SH" version 2>/dev/null || echo unknown)"
    fi
    measured kafka && echo "kafka: $("$KAFKA_SH" version 2>/dev/null || echo unknown) (KRaft; java: $(java -version 2>&1 | head -n1))"
    echo "iperf3: $( ((HAVE_IPERF)) && iperf3 --version | head -n1 || echo 'not installed')"
    echo "git rev-parse HEAD: $(git rev-parse HEAD 2>/dev/null || echo unknown)"
    if [[ -n "$(git status --porcelain --untracked-files=no 2>/dev/null)" ]]; then
        echo "git: the work tree has uncommitted changes"
    fi
    echo "link: veth $BRK_NS/$BRK_IF $BRK_IP <-> $CLI_NS/$CLI_IF $CLI_IP, mtu $(ip -n "$BRK_NS" -o link show "$BRK_IF" | sed -n 's/.* mtu \([0-9]*\).*/\1/p')"
    echo "shaping: tc qdisc replace dev <each veth end> root tbf rate <RATE> burst max(64KiB, 1 ms at RATE) latency 20ms"
    echo "rates: $RATES"
    echo "servers (broker namespace):"
    measured hayate && echo "  hayate broker --listen $BRK_IP:$HAYATE_PORT --max-payload $MAX_PAYLOAD"
    measured nats && echo "  nats-server -c <config> -a $BRK_IP -p $NATS_PORT; config: $(tr '\n' ';' <"$nats_conf")"
    measured mosquitto && echo "  mosquitto -c <config>; config: $(grep -v '^#' "$mosquitto_conf" | tr '\n' ';')"
    measured zenoh && echo "  zenohd --no-multicast-scouting -l tcp/$BRK_IP:$ZENOH_PORT"
    if measured rabbitmq || measured rabbitmq-stomp; then
        echo "  PEER_HOST=$BRK_IP bench/peers/rabbitmq.sh start $AMQP_PORT $STOMP_PORT $RABBIT_MQTT_PORT (one node; loopback_users.guest = false; epmd and distribution on the namespace's 127.0.0.1)"
    fi
    measured kafka && echo "  PEER_HOST=$BRK_IP bench/peers/kafka.sh start $KAFKA_PORT $MAX_PAYLOAD (KRaft, controller on $((KAFKA_PORT + 1)))"
    echo "thr (client namespace), one process per system and payload: hayate bench thr --target URL --payload P --duration $DURATION --json F, URL one of:"
    for s in "${systems[@]}"; do echo "  $s: $(target_of "$s")"; done
    echo "iperf3 (client namespace): iperf3 -c $BRK_IP -t $IPERF_TIME -J, and the same with --bidir"
} >"$OUT/machine.txt"

for rate in $RATES; do
    echo
    echo "=== link $rate"
    shape "$rate"
    start_servers "$rate"
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
    # first system rotates per payload (systems in SYSTEMS order, starting one further on each
    # payload).
    rm -rf "$tmp/points" && mkdir -p "$tmp/points"
    n=0
    k=0
    for payload in ${PAYLOADS//,/ }; do
        order=("${systems[@]:k}" "${systems[@]:0:k}")
        k=$(((k + 1) % ${#systems[@]}))
        for s in "${order[@]}"; do
            [[ "$down" == *" $s "* ]] && continue
            wait_idle "$rate"
            n=$((n + 1))
            run_child ip netns exec "$CLI_NS" "$BIN" bench thr --target "$(target_of "$s")" \
                --payload "$payload" --duration "$DURATION" --json "$tmp/points/$(printf %03d $n).json" \
                >"$tmp/point.log" 2>&1 || echo "hayate bench thr ($s) exited with an error:"
            # The result row, and any warning (e.g. a publisher that did not stop in time).
            sed -nE 's/\x1b\[[0-9;]*m//g; /^ *[0-9.]+ (B|KiB|MiB) +[a-z0-9_-]+ |WARN|ERROR|rror:/p' "$tmp/point.log"
        done
    done
    if compgen -G "$tmp/points/*.json" >/dev/null; then
        jq -s 'add' "$tmp"/points/*.json >"$OUT/thr-$rate.json"
    else
        echo "[]" >"$OUT/thr-$rate.json"
    fi
    wait_idle "$rate"
    stop_servers
    # qdisc statistics (drops, overlimits); `tc qdisc replace` keeps the counters, so they
    # are cumulative over the rates run so far.
    in_brk tc -s qdisc show dev "$BRK_IF" >"$OUT/tc-$rate.txt"
    in_cli tc -s qdisc show dev "$CLI_IF" >>"$OUT/tc-$rate.txt"
done
{
    for note in "${rate_notes[@]}"; do echo "not started: $note"; done
    echo "loadavg at end: $(cat /proc/loadavg)"
} >>"$OUT/machine.txt"

# --- report -----------------------------------------------------------------------------------
rates_bps=""
for rate in $RATES; do rates_bps+="$rate=$(rate_bps "$rate") "; done
python3 - "$OUT" "$rates_bps" "${systems[*]}" "$(printf '%s\n' "${notes[@]}" "${rate_notes[@]}")" <<'EOF'
import json, os, sys

out, rates = sys.argv[1], [r.split("=") for r in sys.argv[2].split()]
# The systems measured, in SYSTEMS order, and why others (or some rates) were not.
systems, notes = sys.argv[3].split(), [n for n in sys.argv[4].split("\n") if n]
NAMES = {
    "hayate": "Hayate",
    "nats": "NATS",
    "mosquitto": "Mosquitto (MQTT QoS 0)",
    "zenoh": "Zenoh (zenohd, client)",
    "rabbitmq": "RabbitMQ (AMQP 0-9-1)",
    "rabbitmq-stomp": "RabbitMQ (STOMP)",
    "kafka": "Kafka (KRaft)",
}

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
    # One row per payload and system (a column group per system would be too wide).
    for p in sorted({p for (_, p) in by}):
        for s in systems + sorted({s for (s, _) in by} - set(systems)):
            r = by.get((s, p))
            if r is None:
                cells = ["not run", "", ""]
            elif r.get("error") or r.get("msgs_per_sec") is None:
                cells = ["error", "", ""]
            else:
                cells = [f"{r['msgs_per_sec']:,.0f}", mbit(r["bits_per_sec"]), pct(r["bits_per_sec"], bps)]
            md.append(f"| {rate} | {size(p)} | {NAMES.get(s, s)} | " + " | ".join(cells) + " |")

with open(os.path.join(out, "linkspeed.csv"), "w") as f:
    f.write("\n".join(csv) + "\n")

lines = [
    "Payload throughput through the broker over the shaped link (utilisation = payload bit/s / link rate, per direction):",
    "",
    "| Link | Payload | System | msg/s | Mbit/s | util % |",
    "|---|---:|---|---:|---:|---:|",
] + md
if notes:
    lines += ["", "Not measured:", ""] + [f"- {n}" for n in notes]
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
