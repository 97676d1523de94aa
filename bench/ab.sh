#!/usr/bin/env bash
# Before/after on the paths a change touches: two builds side by side in one run, every
# measurement repeated RUNS times with the order of the two rotated, medians reported.
#
#   BEFORE=path/to/old/hayate [AFTER=target/release/hayate] [RUNS=5] bench/ab.sh OUT_DIR
#
# Both brokers run at once, each with its native, MQTT, STOMP and AMQP listeners on free ports
# (WebSocket and admin off, data in a temporary directory). Per run:
#   thr  native (shm off), MQTT QoS 0, MQTT QoS 1, STOMP, AMQP (the workspace's client),
#        AMQP durable (persistent messages with confirms into a durable queue, acks):
#        64 B and 1 KiB, `hayate bench thr --duration DURATION`;
#   lat  native and MQTT, 64 B, `hayate bench lat --duration 2s`;
#   rpc  native, 4,000 calls at concurrency 1 and 8,000 at 16.
# The AFTER binary runs every client (the harness is the same for both brokers).
# HAYATE_ENV_BEFORE / HAYATE_ENV_AFTER: extra environment for one broker (e.g. one binary
# against itself with HAYATE_TOKIO_LIFO=1). TESTS (default "thr lat rpc") picks the tests,
# PATHS (a regular expression, default all) the thr paths by name (e.g. 'amqp|stomp').
# OUT_DIR gets <test>-NNN.json and summary.md.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:?OUT_DIR}
BEFORE=${BEFORE:?BEFORE=path of the old binary}
AFTER=${AFTER:-target/release/hayate}
RUNS=${RUNS:-5}
DURATION=${DURATION:-2s}
mkdir -p "$OUT"
tmp=$(mktemp -d)
pids=()
cleanup() { kill "${pids[@]}" 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$tmp"; }
trap cleanup EXIT
start() { # NAME BIN ENV
    mkdir -p "$tmp/$1"
    env $3 "$2" broker --listen 127.0.0.1:0 --mqtt 127.0.0.1:0 --stomp 127.0.0.1:0 \
        --amqp 127.0.0.1:0 --ws off --admin off --data "$tmp/$1/data" \
        >"$tmp/$1/out" 2>"$tmp/$1/err" &
    pids+=($!)
    for _ in $(seq 200); do grep -q ready "$tmp/$1/out" && break; sleep 0.05; done
    grep -q ready "$tmp/$1/out" || { echo "broker $1 did not start:"; cat "$tmp/$1/err"; exit 1; } >&2
}
addr() { sed -n "s/^hayate broker: $2 on //p" "$tmp/$1/out" | head -1; }
start before "$BEFORE" "${HAYATE_ENV_BEFORE:-}"
start after "$AFTER" "${HAYATE_ENV_AFTER:-}"
TESTS=${TESTS:-thr lat rpc}
PATHS=${PATHS:-.}
thr_targets() { # NAME
    thr_all "$1" | grep -E "name=$1-($PATHS)"
}
thr_all() {
    echo "hayate://$(addr "$1" 'native protocol')?shm=off&name=$1-native"
    echo "mqtt://$(addr "$1" mqtt)?qos=0&name=$1-mqtt-qos0"
    echo "mqtt://$(addr "$1" mqtt)?qos=1&name=$1-mqtt-qos1"
    echo "stomp://$(addr "$1" stomp)?name=$1-stomp"
    echo "amqp://$(addr "$1" amqp)?client=hayate&name=$1-amqp"
    echo "amqp://$(addr "$1" amqp)?client=hayate&durable=1&name=$1-amqp-durable"
}
lat_targets() {
    echo "hayate://$(addr "$1" 'native protocol')?shm=off&name=$1-native"
    echo "mqtt://$(addr "$1" mqtt)?name=$1-mqtt"
}
rpc_targets() { echo "hayate://$(addr "$1" 'native protocol')?shm=off&name=$1-native"; }
both() { # FN, rotated by run: before first on even runs
    if (($2 % 2 == 0)); then "$1" before; "$1" after; else "$1" after; "$1" before; fi
}
for ((r = 0; r < RUNS; r++)); do
    n=$(printf '%03d' "$r")
    if [[ " $TESTS " == *" thr "* ]]; then
    mapfile -t t < <(both thr_targets "$r")
    "$AFTER" bench thr $(printf -- '--target %s ' "${t[@]}") --payload 64,1KiB \
        --duration "$DURATION" --json "$OUT/thr-$n.json" >/dev/null 2>>"$OUT/errors.log" || echo "thr run $r failed" >&2
    fi
    if [[ " $TESTS " == *" lat "* ]]; then
    mapfile -t t < <(both lat_targets "$r")
    "$AFTER" bench lat $(printf -- '--target %s ' "${t[@]}") --payload 64 --duration 2s \
        --warmup 1s --runs 1 --json "$OUT/lat-$n.json" >/dev/null 2>>"$OUT/errors.log" || echo "lat run $r failed" >&2
    fi
    if [[ " $TESTS " == *" rpc "* ]]; then
    mapfile -t t < <(both rpc_targets "$r")
    "$AFTER" bench rpc $(printf -- '--target %s ' "${t[@]}") --calls 4000 --concurrency 16 \
        --concurrent-calls 8000 --runs 1 --json "$OUT/rpc-$n.json" >/dev/null 2>>"$OUT/errors.log" || echo "rpc run $r failed" >&2
    fi
    rm -f "$OUT"/*.svg
    printf '.' >&2
done
echo >&2
{
    grep -m1 "model name" /proc/cpuinfo; nproc
    echo "before: $BEFORE ${HAYATE_ENV_BEFORE:-}"; echo "after: $AFTER ${HAYATE_ENV_AFTER:-}"
    echo "runs: $RUNS, thr duration $DURATION, tests: $TESTS, thr paths: $PATHS"
} >"$OUT/machine.txt"
python3 - "$OUT" <<'PY'
import glob, json, statistics, sys, collections
out = sys.argv[1]
rows = collections.defaultdict(list)   # (test, path, payload, concurrency) -> {side: [values]}
for f in sorted(glob.glob(f"{out}/*-[0-9][0-9][0-9].json")):
    test = f.rsplit("/", 1)[1].split("-")[0]
    for r in json.load(open(f)):
        if r.get("error"):
            continue
        side, path = r["system"].split("-", 1)
        key = "p50_us" if test == "lat" else "msgs_per_sec"
        if r.get(key) is None:
            continue
        k = (test, path, r.get("payload_bytes") or r.get("payload") or "", r.get("concurrency") or "")
        rows.setdefault(k, {}).setdefault(side, []).append(r[key])
lines = ["# before/after, medians of the runs (lat: p50 half round trip µs, lower is better; "
         "thr: msg/s at the subscriber; rpc: calls/s)", "",
         "| test | path | payload | callers | before | after | after/before | runs |",
         "|---|---|---|---|---|---|---|---|"]
for k in sorted(rows, key=str):
    d = rows[k]
    if "before" not in d or "after" not in d:
        continue
    b, a = statistics.median(d["before"]), statistics.median(d["after"])
    lines.append(f"| {k[0]} | {k[1]} | {k[2]} | {k[3]} | {b:,.1f} | {a:,.1f} | {a/b:.3f} | {len(d['before'])}/{len(d['after'])} |")
open(f"{out}/summary.md", "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
PY
