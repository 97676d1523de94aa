#!/usr/bin/env bash
# Cyclone DDS, a brokerless peer Hayate is compared with, through its own `ddsperf` tool
# (see bench/peers/README.md). There is no server to start or stop.
#
#   bench/peers/cyclonedds.sh install     cyclonedds-tools (ddsperf) from Debian (~3 s)
#   bench/peers/cyclonedds.sh version     the installed Cyclone DDS's version
#   bench/peers/cyclonedds.sh config      the path of a Cyclone DDS config that keeps every
#                                         participant on loopback, without multicast
#                                         (bench/peers/cyclonedds.xml, from
#                                         shared/peers/cyclonedds.xml); use it as
#     CYCLONEDDS_URI=file://$(bench/peers/cyclonedds.sh config) ddsperf -D 3 pong &
#     CYCLONEDDS_URI=file://$(bench/peers/cyclonedds.sh config) ddsperf -D 3 ping
#
# ddsperf halves the round trip itself, and its smallest payload is 12 bytes.
set -euo pipefail

HERE="$(cd "$(dirname "$0")" && pwd)"
CONFIG="$HERE/cyclonedds.xml"

die() { echo "cyclonedds.sh: $*" >&2; exit 1; }

install() {
    command -v ddsperf >/dev/null && return 0
    [[ "$(id -u)" == 0 ]] || die "ddsperf is not installed; as root: apt-get install -y cyclonedds-tools"
    echo "cyclonedds.sh: apt-get install -y cyclonedds-tools"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q cyclonedds-tools >/dev/null \
        || { apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q cyclonedds-tools >/dev/null; }
    command -v ddsperf >/dev/null || die "ddsperf still not on the PATH after apt-get"
}

# "0.10.2": ddsperf has no --version; the Debian package (cyclonedds-tools 0.10.2-2) has it.
version() {
    local v
    v="$(dpkg-query -W -f='${Version}' cyclonedds-tools 2>/dev/null || true)"
    [[ -n "$v" ]] || die "cyclonedds-tools is not installed (as a Debian package)"
    v="${v#*:}"
    echo "${v%-*}"
}

case "${1:-}" in
    install) install ;;
    version) install >/dev/null; version ;;
    config) [[ -f "$CONFIG" ]] || die "$CONFIG missing"; echo "$CONFIG" ;;
    *) echo "usage: $0 install | version | config" >&2; exit 2 ;;
esac
