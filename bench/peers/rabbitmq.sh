#!/usr/bin/env bash
# RabbitMQ with its STOMP and MQTT plugins, a peer Hayate is compared with three times
# (AMQP 0-9-1, STOMP, MQTT; see bench/peers/README.md).
#
#   bench/peers/rabbitmq.sh install       rabbitmq-server from Debian (~20 s)
#   bench/peers/rabbitmq.sh start [AMQP_PORT [STOMP_PORT [MQTT_PORT]]]
#                                         one node, rabbit@localhost, on 127.0.0.1 only
#                                         (or PEER_HOST, below):
#                                         AMQP 5672, STOMP 61613, MQTT 11883 by default
#                                         (Erlang distribution 25672, epmd 4369); a fresh
#                                         database every start; waits until all three ports
#                                         accept connections
#   bench/peers/rabbitmq.sh stop          `rabbitmqctl stop`, then the epmd the node started
#   bench/peers/rabbitmq.sh ctl ARGS...   rabbitmqctl ARGS against that node
#   bench/peers/rabbitmq.sh version       the installed RabbitMQ's version
#
# Follows shared/peers/rabbitmq.{conf,env} and rabbitmq-enabled-plugins, but keeps every file
# under bench/peers/run/rabbitmq/ (git-ignored): config, enabled plugins, database, logs and the
# Erlang cookie (HOME). The node runs as the calling user (the Debian wrappers in /usr/sbin
# would switch to the rabbitmq user, who cannot write there), from /usr/lib/rabbitmq/bin.
# The default user guest/guest may log in from loopback only, which is where the clients are.
# STOMP clients must send `host:/` (or no host header): RabbitMQ reads the host as a vhost.
#
# PEER_HOST (an IPv4 address, default 127.0.0.1): the address of the AMQP, STOMP and MQTT
# listeners and of the readiness checks, e.g. a veth address inside a network namespace
# (bench/linkspeed.sh: `ip netns exec NS env PEER_HOST=10.77.0.1 bench/peers/rabbitmq.sh
# start`, and `stop` the same way, in the same namespace). epmd and the Erlang distribution stay
# on 127.0.0.1, the namespace's own loopback. Any address but 127.0.0.1 gets a node of its own,
# rabbit-<a-b-c-d>@localhost, with its own run directory bench/peers/run/rabbitmq-<address>/
# (hence its own Erlang cookie) and pid file run/rabbitmq-<address>.pid: it never meets a
# default node, not even one running at the same time in another namespace. Its guest may log
# in from other hosts (loopback_users.guest = false): its clients are not on its loopback.
set -euo pipefail

HERE="$(cd "$(dirname "$0")" && pwd)"
RUN_DIR="$HERE/run"
RBIN=/usr/lib/rabbitmq/bin
PEER_HOST="${PEER_HOST:-127.0.0.1}"
if [[ "$PEER_HOST" == 127.0.0.1 ]]; then
    RDIR="$RUN_DIR/rabbitmq"
    PIDFILE="$RUN_DIR/rabbitmq.pid"
    NODE=rabbit@localhost
else
    [[ "$PEER_HOST" =~ ^[0-9]{1,3}(\.[0-9]{1,3}){3}$ ]] \
        || { echo "rabbitmq.sh: PEER_HOST must be an IPv4 address, not: $PEER_HOST" >&2; exit 1; }
    RDIR="$RUN_DIR/rabbitmq-$PEER_HOST"
    PIDFILE="$RUN_DIR/rabbitmq-$PEER_HOST.pid"
    NODE="rabbit-${PEER_HOST//./-}@localhost"
fi

die() { echo "rabbitmq.sh: $*" >&2; exit 1; }

install() {
    [[ -x "$RBIN/rabbitmq-server" ]] && return 0
    [[ "$(id -u)" == 0 ]] || die "rabbitmq-server is not installed; as root: apt-get install -y --no-install-recommends rabbitmq-server"
    echo "rabbitmq.sh: apt-get install -y --no-install-recommends rabbitmq-server"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends rabbitmq-server >/dev/null \
        || { apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends rabbitmq-server >/dev/null; }
    [[ -x "$RBIN/rabbitmq-server" ]] || die "$RBIN/rabbitmq-server missing after apt-get"
}

# "3.10.8", from the installed server's directory (rabbitmqctl version needs no node but
# starts an Erlang VM: 1-2 s).
version() {
    local d
    d="$(ls -d /usr/lib/rabbitmq/lib/rabbitmq_server-* 2>/dev/null | sort -V | tail -n1)"
    [[ -n "$d" ]] || die "rabbitmq-server is not installed"
    echo "${d##*/rabbitmq_server-}"
}

# The environment the node and rabbitmqctl share (see shared/peers/rabbitmq.env).
rabbit_env() {
    export HOME="$RDIR/home"
    export RABBITMQ_CONF_ENV_FILE="$RDIR/rabbitmq-env.conf"
    export RABBITMQ_CONFIG_FILE="$RDIR/rabbitmq.conf"
    export RABBITMQ_ENABLED_PLUGINS_FILE="$RDIR/enabled_plugins"
    export RABBITMQ_NODENAME="$NODE"
    export RABBITMQ_NODE_IP_ADDRESS="$PEER_HOST"
    export RABBITMQ_DIST_PORT=25672
    export ERL_EPMD_ADDRESS=127.0.0.1
    export RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS="-kernel inet_dist_use_interface {127,0,0,1}"
    export RABBITMQ_CTL_ERL_ARGS="-kernel inet_dist_use_interface {127,0,0,1}"
    export RABBITMQ_MNESIA_BASE="$RDIR/mnesia"
    export RABBITMQ_LOG_BASE="$RDIR/log"
    export RABBITMQ_PID_FILE="$RDIR/beam.pid"
}

ctl() { rabbit_env; "$RBIN/rabbitmqctl" "$@"; }

# True when something accepts TCP connections on $2:$1 (default $PEER_HOST).
port_open() { (exec 3<>"/dev/tcp/${2:-$PEER_HOST}/$1") 2>/dev/null; }

# The pids of the running epmd processes in this network namespace, one a line (an epmd of
# another namespace serves other nodes: never ours to stop).
epmd_pids() {
    local d ns
    ns="$(readlink /proc/self/ns/net)"
    for d in /proc/[0-9]*; do
        [[ "$(cat "$d/comm" 2>/dev/null)" == epmd ]] || continue
        [[ "$(readlink "$d/ns/net" 2>/dev/null)" == "$ns" ]] && echo "${d#/proc/}"
    done
    return 0
}

start() {
    local amqp="${1:-5672}" stomp="${2:-61613}" mqtt="${3:-11883}" p
    for p in "$amqp" "$stomp" "$mqtt"; do
        [[ "$p" =~ ^[0-9]+$ ]] || die "bad port: $p"
    done
    install
    mkdir -p "$RUN_DIR"
    local pidfile="$PIDFILE" log="$RDIR/console.log"
    if [[ -f "$pidfile" ]] && kill -0 "$(cat "$pidfile")" 2>/dev/null; then
        die "already running (pid $(cat "$pidfile")); bench/peers/rabbitmq.sh stop first"
    fi
    for p in "$amqp" "$stomp" "$mqtt"; do
        port_open "$p" && die "port $p is already in use by another process"
    done
    port_open 25672 127.0.0.1 && die "port 25672 (Erlang distribution) is already in use by another process"
    # A fresh node every start: no queue, vhost or message survives from an earlier run.
    rm -rf "$RDIR"
    mkdir -p "$RDIR/home" "$RDIR/mnesia" "$RDIR/log"
    : >"$RDIR/rabbitmq-env.conf"   # instead of /etc/rabbitmq/rabbitmq-env.conf
    echo "[rabbitmq_stomp,rabbitmq_mqtt]." >"$RDIR/enabled_plugins"
    {
        echo "# written by bench/peers/rabbitmq.sh from shared/peers/rabbitmq.conf"
        echo "listeners.tcp.default = $PEER_HOST:$amqp"
        echo "stomp.listeners.tcp.1 = $PEER_HOST:$stomp"
        echo "mqtt.listeners.tcp.1 = $PEER_HOST:$mqtt"
        if [[ "$PEER_HOST" == 127.0.0.1 ]]; then
            echo "loopback_users.guest = true"
        else
            echo "loopback_users.guest = false"
        fi
    } >"$RDIR/rabbitmq.conf"
    # Which epmd runs before the node starts: an epmd that does is not ours to stop.
    local before
    before="$(epmd_pids)"
    (
        rabbit_env
        cd "$RDIR"
        exec setsid "$RBIN/rabbitmq-server" >"$log" 2>&1 </dev/null
    ) &
    local pid=$!
    echo "$pid" >"$pidfile"
    local i ready
    for ((i = 0; i < 1200; i++)); do
        if ! kill -0 "$pid" 2>/dev/null; then
            rm -f "$pidfile"
            tail -n 40 "$log" >&2
            die "rabbitmq-server exited on start (log above; more in $RDIR/log)"
        fi
        ready=1
        for p in "$amqp" "$stomp" "$mqtt"; do
            port_open "$p" || { ready=; break; }
        done
        [[ -n "$ready" ]] && break
        sleep 0.1
    done
    # Remember the epmd the node started (by pid), for stop.
    local e
    for e in $(epmd_pids); do
        grep -qx "$e" <<<"$before" || echo "$e" >>"$RDIR/epmd.pid"
    done
    if [[ -z "$ready" ]]; then
        stop
        die "RabbitMQ did not accept connections on ports $amqp, $stomp and $mqtt within 120s (log: $log)"
    fi
    echo "rabbitmq.sh: RabbitMQ $(version) on $PEER_HOST: AMQP $amqp, STOMP $stomp, MQTT $mqtt (pid $pid, logs $RDIR/log)"
}

# Waits up to $2 tenths of a second for pid $1 to exit; false if it is still there.
wait_gone() {
    local i
    for ((i = 0; i < $2; i++)); do
        kill -0 "$1" 2>/dev/null || return 0
        sleep 0.1
    done
    return 1
}

stop() {
    local pidfile="$PIDFILE" pid beam=""
    pid="$(cat "$pidfile" 2>/dev/null || true)"
    [[ -f "$RDIR/beam.pid" ]] && beam="$(cat "$RDIR/beam.pid")"
    if [[ "$pid" =~ ^[0-9]+$ ]] && kill -0 "$pid" 2>/dev/null; then
        # rabbitmqctl stop PIDFILE returns once the node's VM has exited.
        if [[ -f "$RDIR/beam.pid" ]]; then
            ctl stop "$RDIR/beam.pid" >/dev/null 2>&1 || true
        else
            ctl stop >/dev/null 2>&1 || true
        fi
        if wait_gone "$pid" 300; then
            echo "rabbitmq.sh: stopped pid $pid"
        elif grep -q rabbitmq "/proc/$pid/cmdline" 2>/dev/null; then
            # The wrapper script: TERM makes it stop the VM itself.
            kill "$pid" 2>/dev/null || true
            wait_gone "$pid" 100 || kill -9 "$pid" 2>/dev/null || true
            echo "rabbitmq.sh: killed pid $pid"
        fi
    fi
    rm -f "$pidfile"
    # The VM itself (normally gone with the wrapper).
    if [[ "$beam" =~ ^[0-9]+$ ]] && grep -q beam "/proc/$beam/cmdline" 2>/dev/null; then
        kill "$beam" 2>/dev/null || true
        wait_gone "$beam" 100 || kill -9 "$beam" 2>/dev/null || true
    fi
    # The epmd the node started, by pid, and only if it is still an epmd.
    local e
    if [[ -f "$RDIR/epmd.pid" ]]; then
        for e in $(cat "$RDIR/epmd.pid"); do
            [[ "$(cat "/proc/$e/comm" 2>/dev/null)" == epmd ]] || continue
            kill "$e" 2>/dev/null || true
            wait_gone "$e" 50 || kill -9 "$e" 2>/dev/null || true
            echo "rabbitmq.sh: stopped epmd pid $e"
        done
        rm -f "$RDIR/epmd.pid"
    fi
    return 0
}

case "${1:-}" in
    install) install ;;
    start) shift; start "$@" ;;
    stop) stop ;;
    ctl) shift; install; ctl "$@" ;;
    version) install >/dev/null; version ;;
    *) echo "usage: $0 install | start [AMQP_PORT [STOMP_PORT [MQTT_PORT]]] | stop | ctl ARGS... | version" >&2; exit 2 ;;
esac
