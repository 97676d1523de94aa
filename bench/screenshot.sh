#!/usr/bin/env bash
# Screenshot of a `hayate bench compare` report, as a browser shows it:
#   bench/screenshot.sh DIR      writes DIR/report.png from DIR/index.html
# Needs Debian's chromium (`apt-get install -y chromium`). HEIGHT (default 3600) and WIDTH
# (default 1400) set the window size.
set -euo pipefail
dir="${1:?usage: bench/screenshot.sh DIR}"
dir="$(cd "$dir" && pwd)"
[[ -f "$dir/index.html" ]] || { echo "screenshot.sh: no $dir/index.html" >&2; exit 1; }
command -v chromium >/dev/null || { echo "screenshot.sh: chromium not installed (apt-get install -y chromium)" >&2; exit 1; }
profile="$(mktemp -d)"
trap 'rm -rf "$profile"' EXIT
timeout 120 chromium --headless --no-sandbox --disable-gpu --disable-quic --no-first-run \
    --disable-background-networking --disable-component-update --disable-sync \
    --user-data-dir="$profile" --window-size="${WIDTH:-1400},${HEIGHT:-3600}" \
    --screenshot="$dir/report.png" "file://$dir/index.html" >/dev/null 2>&1
[[ -s "$dir/report.png" ]] || { echo "screenshot.sh: chromium wrote no $dir/report.png" >&2; exit 1; }
echo "$dir/report.png"
