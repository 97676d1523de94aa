#!/usr/bin/env bash
# A long series of short runs, to compare two or more systems on a noisy machine.
#
#   bench/series.sh lat|rpc OUT_DIR RUNS TARGET_URL... [-- extra `hayate bench` flags]
#
# Each run is one `hayate bench lat` (or `rpc`) of every target, the order rotated between runs
# so that no system always goes first. Defaults: lat `--duration 2s --warmup 1s --payload 64`;
# rpc `--calls 4000 --concurrency none` (concurrency 1 only); extra flags replace them. Every
# run's records go to OUT_DIR/run-NNN.json; OUT_DIR/summary.md gets, per system, the median,
# quartiles and mean of the per-run figure (lat: p50 µs, lower is better; rpc: calls/s, higher
# is better) and its p50/p99 latency, and, for each pair of systems, in how many runs each was
# better and the median of the per-run ratios. HAYATE (default target/release/hayate) names
# the binary.
set -euo pipefail
[[ $# -ge 4 ]] || { sed -n '2,14p' "$0"; exit 2; }
TEST=$1; OUT=$2; RUNS=$3; shift 3
case $TEST in lat | rpc) ;; *) echo "series.sh: TEST is lat or rpc, not $TEST" >&2; exit 2 ;; esac
TARGETS=(); EXTRA=()
while [[ $# -gt 0 ]]; do
    if [[ $1 == -- ]]; then shift; EXTRA=("$@"); break; fi
    TARGETS+=("$1"); shift
done
if [[ ${#EXTRA[@]} -eq 0 ]]; then
    if [[ $TEST == lat ]]; then EXTRA=(--duration 2s --warmup 1s --payload 64)
    else EXTRA=(--calls 4000 --concurrency none); fi
fi
HAYATE=${HAYATE:-target/release/hayate}
mkdir -p "$OUT"
n=${#TARGETS[@]}
for ((r = 0; r < RUNS; r++)); do
    args=()
    for ((k = 0; k < n; k++)); do args+=(--target "${TARGETS[$(((k + r) % n))]}"); done
    "$HAYATE" bench "$TEST" "${args[@]}" --runs 1 "${EXTRA[@]}" --json "$OUT/$(printf 'run-%03d.json' "$r")" >/dev/null 2>&1 \
        || echo "series: run $r failed" >&2
    rm -f "$OUT"/run-*.svg   # one chart per run is noise; summary.md is the result
    printf '.' >&2
done
echo >&2
python3 - "$TEST" "$OUT" <<'PY'
import glob, json, statistics, sys, itertools
test, out = sys.argv[1], sys.argv[2]
key, unit, higher = ("p50_us", "p50 µs", False) if test == "lat" else ("msgs_per_sec", "calls/s", True)
runs = []
for f in sorted(glob.glob(f"{out}/run-*.json")):
    recs = json.load(open(f))
    runs.append({r["system"]: r for r in recs if r.get(key) and not r.get("error")})
systems = sorted({s for r in runs for s in r})
def q(v, p):
    v = sorted(v); i = (len(v) - 1) * p; lo = int(i); hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (i - lo)
what = "64 B, one message in flight (half round trip)" if test == "lat" else "request/reply, every reply checked"
extra = ["p99_us"] if test == "lat" else ["p50_us", "p99_us"]
lines = [f"# {test} series: {len(runs)} runs, {what}", "",
         f"| system | runs | {unit} median | {unit} q1..q3 | {unit} mean | " + " | ".join(f"{e[:3]} µs median" for e in extra) + " |",
         "|---|---|---|---|---|" + "---|" * len(extra)]
for s in sorted(systems, key=lambda s: statistics.median([r[s][key] for r in runs if s in r]), reverse=higher):
    v = [r[s][key] for r in runs if s in r]
    cols = [statistics.median([r[s][e] for r in runs if s in r]) for e in extra]
    lines.append(f"| {s} | {len(v)} | {statistics.median(v):.1f} | {q(v,.25):.1f}..{q(v,.75):.1f} | {statistics.mean(v):.1f} | " + " | ".join(f"{c:.1f}" for c in cols) + " |")
better = "higher" if higher else "lower"
lines += ["", f"| pair | runs | first {better} | second {better} | median of first/second {unit} |", "|---|---|---|---|---|"]
for a, b in itertools.combinations(systems, 2):
    both = [(r[a][key], r[b][key]) for r in runs if a in r and b in r]
    if not both: continue
    wa = sum((x > y) if higher else (x < y) for x, y in both); wb = sum((y > x) if higher else (y < x) for x, y in both)
    ratio = statistics.median([x / y for x, y in both])
    lines.append(f"| {a} vs {b} | {len(both)} | {wa} | {wb} | {ratio:.3f} |")
open(f"{out}/summary.md", "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
PY
