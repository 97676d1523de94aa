#!/usr/bin/env bash
# Apache Kafka 4.1 in KRaft mode (one process, broker + controller), a peer Hayate is
# compared with (see bench/peers/README.md).
#
#   bench/peers/kafka.sh install          Kafka's jars (Maven Central, bench/peers/kafka/pom.xml)
#                                         into bench/peers/bin/kafka-libs/ (~75 s, 93 jars)
#   bench/peers/kafka.sh start [PORT] [MAX_PAYLOAD]
#                                         formats a fresh log dir under bench/peers/run/ with a
#                                         random cluster id and starts Kafka on 127.0.0.1:PORT
#                                         (or PEER_HOST, below; default PORT 19092; the KRaft
#                                         controller on PORT+1) with
#                                         -Xmx1g, taking record batches of MAX_PAYLOAD bytes
#                                         plus 64 KiB of headroom (message.max.bytes; default
#                                         MAX_PAYLOAD 67108864 = 64 MiB, as Hayate and nats.sh);
#                                         waits until the port accepts connections
#   bench/peers/kafka.sh stop [PORT]      stops the Kafka started on PORT (default: every Kafka
#                                         this script started) and waits until it has exited
#   bench/peers/kafka.sh topic NAME [PORT] [PARTITIONS]
#                                         creates topic NAME (1 partition by default) on the
#                                         running Kafka; an existing topic is left as it is
#   bench/peers/kafka.sh version          the installed Kafka's version
#
# server.properties and log4j2.properties beside this script (bench/peers/kafka/) are the
# templates; start writes a copy with listeners, log.dirs and message.max.bytes rewritten to
# bench/peers/run/kafka-PORT.properties. The producer and consumer must raise their own
# limits (message.max.bytes, fetch.max.bytes) to send and fetch payloads above 1 MiB.
# bench/peers/bin and bench/peers/run are git-ignored.
#
# PEER_HOST (an IPv4 address, default 127.0.0.1): the address of the listeners, the advertised
# listener, the controller quorum voter and the readiness checks (start, topic), e.g. a veth
# address inside a network namespace (bench/linkspeed.sh: `ip netns exec NS env
# PEER_HOST=10.77.0.1 bench/peers/kafka.sh start`; `stop` with the same PEER_HOST). Any
# address but 127.0.0.1 keeps its properties, data, pid and log files in
# bench/peers/run/kafka-host-<address>/ instead of bench/peers/run/, so that its start and stop
# never meet a default Kafka's files (nor the other way round).
set -euo pipefail

HERE="$(cd "$(dirname "$0")" && pwd)"
PROJECT="$HERE/kafka"
BIN_DIR="$HERE/bin"
PEER_HOST="${PEER_HOST:-127.0.0.1}"
if [[ "$PEER_HOST" == 127.0.0.1 ]]; then
    RUN_DIR="$HERE/run"
else
    [[ "$PEER_HOST" =~ ^[0-9]{1,3}(\.[0-9]{1,3}){3}$ ]] \
        || { echo "kafka.sh: PEER_HOST must be an IPv4 address, not: $PEER_HOST" >&2; exit 1; }
    RUN_DIR="$HERE/run/kafka-host-$PEER_HOST"
fi
# shellcheck source=lib.sh
. "$HERE/lib.sh"
LIBS="$BIN_DIR/kafka-libs"
KAFKA_VERSION="$(sed -n 's:.*<kafka.version>\(.*\)</kafka.version>.*:\1:p' "$PROJECT/pom.xml")"
STAMP="$LIBS/.installed-$KAFKA_VERSION"
HEAP="${KAFKA_HEAP:--Xmx1g}"

die() { echo "kafka.sh: $*" >&2; exit 1; }

install() {
    [[ -f "$STAMP" ]] && return 0
    command -v java >/dev/null || die "java is not installed (apt-get install -y default-jre-headless)"
    command -v mvn >/dev/null || die "mvn is not installed (apt-get install -y maven)"
    echo "kafka.sh: fetching Kafka $KAFKA_VERSION jars into $LIBS"
    rm -rf "$LIBS.tmp"
    mvn -q -f "$PROJECT/pom.xml" dependency:copy-dependencies \
        -DoutputDirectory="$LIBS.tmp" -DincludeScope=runtime
    # mvn may leave a target/ beside the pom; it is not part of the repo.
    rm -rf "$PROJECT/target"
    ls "$LIBS.tmp"/kafka_2.13-"$KAFKA_VERSION".jar >/dev/null 2>&1 \
        || die "kafka_2.13-$KAFKA_VERSION.jar missing after mvn"
    rm -rf "$LIBS"
    mv "$LIBS.tmp" "$LIBS"
    touch "$STAMP"
    echo "kafka.sh: $(ls "$LIBS"/*.jar | wc -l) jars in $LIBS"
}

# Runs a Java class from Kafka's jars.
kjava() { java -cp "$LIBS/*" "$@"; }

version() { kjava org.apache.kafka.tools.TopicCommand --version 2>/dev/null | head -n1; }

# True when something accepts TCP connections on $PEER_HOST:$1 (replaces lib.sh's, which asks
# 127.0.0.1; peer_check_free and peer_wait_up call this one).
port_open() { (exec 3<>"/dev/tcp/$PEER_HOST/$1") 2>/dev/null; }

start() {
    local port="${1:-19092}" max_payload="${2:-67108864}"
    [[ "$port" =~ ^[0-9]+$ ]] || die "bad port: $port"
    [[ "$max_payload" =~ ^[0-9]+$ ]] || die "MAX_PAYLOAD is a number of bytes, not: $max_payload"
    local cport=$((port + 1)) max_message=$((max_payload + 65536))
    install
    mkdir -p "$RUN_DIR"
    local pidfile="$RUN_DIR/kafka-$port.pid" props="$RUN_DIR/kafka-$port.properties"
    local log="$RUN_DIR/kafka-$port.log" data="$RUN_DIR/kafka-$port-data"
    peer_check_free "$pidfile" "$port"
    port_open "$cport" && die "port $cport (the KRaft controller's) is already in use by another process"
    {
        echo "# written by bench/peers/kafka.sh from bench/peers/kafka/server.properties"
        sed -e "s|^log\.dirs=.*|log.dirs=$data|" \
            -e "s|^controller\.quorum\.voters=.*|controller.quorum.voters=1@$PEER_HOST:$cport|" \
            -e "s|^listeners=.*|listeners=PLAINTEXT://$PEER_HOST:$port,CONTROLLER://$PEER_HOST:$cport|" \
            -e "s|^advertised\.listeners=.*|advertised.listeners=PLAINTEXT://$PEER_HOST:$port|" \
            "$PROJECT/server.properties"
        # A record batch of one message of MAX_PAYLOAD bytes, its key and headers fit; the
        # default request limit (socket.request.max.bytes, 100 MiB) must hold it too.
        echo "message.max.bytes=$max_message"
        echo "replica.fetch.max.bytes=$max_message"
        if ((max_message + 1048576 > 104857600)); then
            echo "socket.request.max.bytes=$((max_message + 1048576))"
        fi
    } >"$props"
    # A fresh cluster every start: no topic or offset survives from an earlier run.
    rm -rf "$data"
    local cluster
    cluster="$(kjava kafka.tools.StorageTool random-uuid 2>/dev/null | tail -n1)"
    [[ -n "$cluster" ]] || die "StorageTool random-uuid printed nothing"
    kjava -Dlog4j2.configurationFile="$PROJECT/log4j2.properties" \
        kafka.tools.StorageTool format -t "$cluster" -c "$props" >"$log" 2>&1 \
        || { cat "$log" >&2; die "formatting $data failed (log above)"; }
    # setsid: Kafka gets its own process group, so a Ctrl-C in the caller's shell does not
    # reach it, and stop can find it by its pid alone.
    setsid java "$HEAP" -Xms256m -Dlog4j2.configurationFile="$PROJECT/log4j2.properties" \
        -cp "$LIBS/*" kafka.Kafka "$props" >>"$log" 2>&1 </dev/null &
    local pid=$!
    echo "$pid" >"$pidfile"
    peer_wait_up Kafka "$pid" "$pidfile" "$port" 60 'kafka\.Kafka' 300 "$log"
    echo "kafka.sh: Kafka $KAFKA_VERSION (KRaft) on $PEER_HOST:$port, controller :$cport (pid $pid, message.max.bytes $max_message, log $log)"
}

stop() { peer_stop kafka 'kafka\.Kafka' 300 "$@"; }

topic() {
    local name="${1:-}" port="${2:-19092}" partitions="${3:-1}"
    [[ -n "$name" ]] || die "usage: $0 topic NAME [PORT] [PARTITIONS]"
    install
    port_open "$port" || die "no Kafka accepts connections on $PEER_HOST:$port (start it first)"
    kjava -Dlog4j2.configurationFile="$PROJECT/log4j2.properties" \
        org.apache.kafka.tools.TopicCommand --bootstrap-server "$PEER_HOST:$port" \
        --create --if-not-exists --topic "$name" \
        --partitions "$partitions" --replication-factor 1
}

case "${1:-}" in
    install) install ;;
    start) shift; start "$@" ;;
    stop) shift; stop "$@" ;;
    topic) shift; topic "$@" ;;
    version) install >/dev/null; version ;;
    *) echo "usage: $0 install | start [PORT] [MAX_PAYLOAD] | stop [PORT] | topic NAME [PORT] [PARTITIONS] | version" >&2; exit 2 ;;
esac
