#!/usr/bin/env bash
# TLS cost, one run: Hayate's native protocol plain vs TLS, Hayate's MQTT plain vs TLS, and
# Mosquitto plain vs TLS, all MQTT points with the same client (hayate-bench's MQTT driver,
# TLS by tokio-rustls), `hayate bench thr` at 64 B / 1 KiB / 64 KiB and `hayate bench lat` at
# 64 B. Certificates: a throwaway CA and a server certificate for 127.0.0.1 (openssl, RSA
# 2048); both brokers negotiate TLS 1.3 with the same certificate and the same cipher suite,
# TLS_AES_128_GCM_SHA256 (Hayate's first choice; Mosquitto is told to use it).
# The native targets say `shm=off`: a native client on the broker's host otherwise moves to
# shared memory after its HELLO, TLS or not, and the TLS row would measure no TLS at all.
# Writes bench/results/<date>-<host>-tls/ (or $1).
#
#   cargo build --release -p hayate && bench/tls.sh
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
OUT="${1:-$ROOT/bench/results/$(date +%F)-$(hostname -s)-tls}"
HAYATE="${HAYATE_BIN:-$ROOT/target/release/hayate}"
DURATION="${DURATION:-3s}"
# MQTT QoS of the MQTT rows (0: the broker sheds what a slow subscriber cannot take; 1:
# the publisher is held back by its in-flight window instead).
QOS="${QOS:-0}"
mkdir -p "$OUT"
tmp="$(mktemp -d)"
pids=()
trap 'for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$tmp"' EXIT

"$ROOT/bench/tls-certs.sh" "$tmp"

"$HAYATE" broker --listen 127.0.0.1:0 --native-tls 127.0.0.1:0 --mqtt 127.0.0.1:0 --mqtt-tls 127.0.0.1:0 \
    --ws off --stomp off --amqp off --admin off --data "" --tls-cert "$tmp/server.pem" --tls-key "$tmp/server.key" \
    >"$OUT/hayate-broker.log" 2>&1 &
pids+=($!)
for _ in $(seq 100); do grep -q ready "$OUT/hayate-broker.log" && break; sleep 0.1; done
addr() { sed -n "s/^hayate broker: $1 on //p" "$OUT/hayate-broker.log" | head -1; }
native=$(addr "native protocol"); native_tls=$(addr "native protocol over tls")
mqtt=$(addr "mqtt"); mqtt_tls=$(addr "mqtt over tls")

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
mp=$(free_port); mtp=$(free_port)
cat >"$tmp/mosquitto.conf" <<CONF
per_listener_settings false
allow_anonymous true
persistence false
max_queued_messages 0
max_queued_bytes 0
log_dest stderr
log_type error
listener $mp 127.0.0.1
listener $mtp 127.0.0.1
cafile $tmp/ca.pem
certfile $tmp/server.pem
keyfile $tmp/server.key
ciphers_tls1.3 TLS_AES_128_GCM_SHA256
CONF
# As root, mosquitto drops to the `mosquitto` user, who cannot read the temporary files.
[ "$(id -u)" -eq 0 ] && echo "user root" >>"$tmp/mosquitto.conf"
MOSQUITTO="$(command -v mosquitto || echo /usr/sbin/mosquitto)"
[ -x "$MOSQUITTO" ] || { echo "mosquitto is not installed: bench/peers/mosquitto.sh install" >&2; exit 1; }
"$MOSQUITTO" -c "$tmp/mosquitto.conf" >"$OUT/mosquitto.log" 2>&1 &
pids+=($!)
sleep 1
ca="ca=$tmp/ca.pem"
targets=(
    --target "hayate://$native?shm=off&name=hayate"
    --target "hayate://$native_tls?$ca&shm=off&name=hayate-tls"
    --target "mqtt://$mqtt?qos=$QOS&name=hayate-mqtt"
    --target "mqtt://$mqtt_tls?qos=$QOS&transport=tls&$ca&name=hayate-mqtt-tls"
    --target "mqtt://127.0.0.1:$mp?qos=$QOS&name=mosquitto"
    --target "mqtt://127.0.0.1:$mtp?qos=$QOS&transport=tls&$ca&name=mosquitto-tls"
)
{
    echo "hayate: $("$HAYATE" --version)"
    echo "mosquitto: $("$MOSQUITTO" -h 2>/dev/null | sed -n 's/^mosquitto version *//p' | head -1)"
    echo "openssl: $(openssl version)"
} | tee "$OUT/versions.txt"
"$HAYATE" bench thr "${targets[@]}" --payload 64,1KiB,64KiB --duration "$DURATION" \
    --json "$OUT/thr.json" | tee "$OUT/thr.txt"
"$HAYATE" bench lat "${targets[@]}" --payload 64 --duration "$DURATION" --runs 3 \
    --json "$OUT/lat.json" | tee "$OUT/lat.txt"
{ uname -a; nproc; grep -m1 'model name' /proc/cpuinfo; } >"$OUT/machine.txt" 2>/dev/null || true
echo "wrote $OUT"
