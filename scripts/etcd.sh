#!/usr/bin/env bash
# Runs a throw-away single-member etcd on loopback, in the foreground, installing Debian's
# etcd-server first if it is missing. The tests start it through this script (once per session).
#
#   scripts/etcd.sh DATA_DIR [CLIENT_PORT] [PEER_PORT]   # Ctrl-C (SIGTERM) stops it
#   scripts/etcd.sh --install                             # only make sure the binary is there
set -euo pipefail

install_etcd() {
    command -v etcd >/dev/null 2>&1 && return 0
    if [ "$(id -u)" -ne 0 ]; then
        echo "etcd is not installed and installing it needs root: apt-get install -y etcd-server" >&2
        return 1
    fi
    # Update the package lists only when they do not know the package yet.
    if ! apt-cache policy etcd-server 2>/dev/null | grep -q 'Candidate: [0-9]'; then
        apt-get update -q >&2
    fi
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q etcd-server >&2
    command -v etcd >/dev/null 2>&1 || { echo "etcd-server installed no etcd binary" >&2; return 1; }
}

if [ "${1:-}" = "--install" ]; then
    install_etcd
    exit 0
fi
if [ $# -lt 1 ]; then
    echo "usage: $0 DATA_DIR [CLIENT_PORT] [PEER_PORT] | $0 --install" >&2
    exit 2
fi
data_dir=$1
client_port=${2:-2379}
peer_port=${3:-2380}
install_etcd
mkdir -p -m 700 "$data_dir"
client_url="http://127.0.0.1:$client_port"
peer_url="http://127.0.0.1:$peer_port"
exec etcd \
    --name eventspark-test \
    --data-dir "$data_dir" \
    --listen-client-urls "$client_url" --advertise-client-urls "$client_url" \
    --listen-peer-urls "$peer_url" --initial-advertise-peer-urls "$peer_url" \
    --initial-cluster "eventspark-test=$peer_url" --initial-cluster-state new \
    --logger zap --log-outputs stderr --log-level warn
