#!/usr/bin/env bash
# A long series of short latency runs, to compare two or more systems' p50 on a noisy machine.
#
#   bench/lat-series.sh OUT_DIR RUNS TARGET_URL... [-- extra `hayate bench lat` flags]
#
# Each run is one `hayate bench lat` of every target (the order rotated between runs, so no
# system always goes first), with `--duration 2s --warmup 1s --payload 64`, or with the extra
# flags instead when any are given. Every run's records go to OUT_DIR/run-NNN.json; OUT_DIR/summary.md gets,
# per system, the median, quartiles and mean of the per-run p50 and p99, and, for each pair of
# systems, in how many runs the first one's p50 was lower. HAYATE (default
# target/release/hayate) names the binary.
set -euo pipefail
[[ $# -ge 3 ]] || { sed -n '2,12p' "$0"; exit 2; }
OUT=$1; RUNS=$2; shift 2
TARGETS=(); EXTRA=()
while [[ $# -gt 0 ]]; do
    if [[ $1 == -- ]]; then shift; EXTRA=("$@"); break; fi
    TARGETS+=("$1"); shift
done
HAYATE=${HAYATE:-target/release/hayate}
mkdir -p "$OUT"
n=${#TARGETS[@]}
for ((r = 0; r < RUNS; r++)); do
    args=()
    for ((k = 0; k < n; k++)); do args+=(--target "${TARGETS[$(((k + r) % n))]}"); done
    [[ ${#EXTRA[@]} -gt 0 ]] || EXTRA=(--duration 2s --warmup 1s --payload 64)
    "$HAYATE" bench lat "${args[@]}" --runs 1 "${EXTRA[@]}" --json "$OUT/$(printf 'run-%03d.json' "$r")" >/dev/null 2>&1 \
        || echo "lat-series: run $r failed" >&2
    rm -f "$OUT"/run-*-lat.svg   # one chart per run is noise; summary.md is the result
    printf '.' >&2
done
echo >&2
python3 - "$OUT" <<'PY'
import glob, json, statistics, sys, itertools
out = sys.argv[1]
runs = []
for f in sorted(glob.glob(f"{out}/run-*.json")):
    recs = json.load(open(f))
    runs.append({r["system"]: r for r in recs if r.get("p50_us") and not r.get("error")})
systems = sorted({s for r in runs for s in r})
def q(v, p):
    v = sorted(v); i = (len(v) - 1) * p; lo = int(i); hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (i - lo)
lines = [f"# Latency series: {len(runs)} runs, 64 B, one message in flight (half round trip)", "",
         "| system | runs | p50 median µs | p50 q1..q3 µs | p50 mean µs | p99 median µs |", "|---|---|---|---|---|---|"]
for s in systems:
    p50 = [r[s]["p50_us"] for r in runs if s in r]; p99 = [r[s]["p99_us"] for r in runs if s in r]
    lines.append(f"| {s} | {len(p50)} | {statistics.median(p50):.1f} | {q(p50,.25):.1f}..{q(p50,.75):.1f} | {statistics.mean(p50):.1f} | {statistics.median(p99):.1f} |")
lines += ["", "| pair | runs | first lower | second lower | median of first/second |", "|---|---|---|---|---|"]
for a, b in itertools.permutations(systems, 2):
    if a > b: continue
    both = [(r[a]["p50_us"], r[b]["p50_us"]) for r in runs if a in r and b in r]
    if not both: continue
    wa = sum(x < y for x, y in both); wb = sum(y < x for x, y in both)
    ratio = statistics.median([x / y for x, y in both])
    lines.append(f"| {a} vs {b} | {len(both)} | {wa} | {wb} | {ratio:.3f} |")
open(f"{out}/summary.md", "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
PY
