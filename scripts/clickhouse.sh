#!/usr/bin/env bash
# Runs a throw-away ClickHouse server on loopback, as a daemon, installing Debian's
# clickhouse-server first if it is missing. The tests start it through this script (once per
# session) and stop it with `stop`. Everything (config, data, logs, pid file) lives in DIR.
#
#   scripts/clickhouse.sh start DIR [HTTP_PORT] [TCP_PORT]   # returns once the server answers
#                                                             # (at once if one answers already)
#   scripts/clickhouse.sh stop DIR                            # stops the server started in DIR
#   scripts/clickhouse.sh --install                           # only make sure the binary is there
set -euo pipefail

SERVER=/usr/sbin/clickhouse-server

install_clickhouse() {
    [ -x "$SERVER" ] && return 0
    if [ "$(id -u)" -ne 0 ]; then
        echo "clickhouse-server is not installed and installing it needs root:" \
            "apt-get install -y clickhouse-server clickhouse-client" >&2
        return 1
    fi
    # Update the package lists only when they do not know the package yet.
    if ! apt-cache policy clickhouse-server 2>/dev/null | grep -q 'Candidate: [0-9]'; then
        apt-get update -q >&2
    fi
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q clickhouse-server clickhouse-client >&2
    [ -x "$SERVER" ] || { echo "clickhouse-server installed no $SERVER" >&2; return 1; }
}

write_config() {
    local dir=$1 http_port=$2 tcp_port=$3
    mkdir -p "$dir/data/" "$dir/tmp/" "$dir/user_files/" "$dir/format_schemas/" "$dir/log"
    cat >"$dir/config.xml" <<EOF
<?xml version="1.0"?>
<yandex>
    <logger>
        <level>warning</level>
        <log>$dir/log/server.log</log>
        <errorlog>$dir/log/server.err.log</errorlog>
        <size>100M</size>
        <count>2</count>
    </logger>
    <listen_host>127.0.0.1</listen_host>
    <http_port>$http_port</http_port>
    <tcp_port>$tcp_port</tcp_port>
    <max_connections>256</max_connections>
    <max_concurrent_queries>64</max_concurrent_queries>
    <uncompressed_cache_size>268435456</uncompressed_cache_size>
    <mark_cache_size>268435456</mark_cache_size>
    <path>$dir/data/</path>
    <tmp_path>$dir/tmp/</tmp_path>
    <user_files_path>$dir/user_files/</user_files_path>
    <format_schema_path>$dir/format_schemas/</format_schema_path>
    <users_config>$dir/users.xml</users_config>
    <default_profile>default</default_profile>
    <default_database>default</default_database>
    <timezone>UTC</timezone>
    <mlock_executable>false</mlock_executable>
</yandex>
EOF
    cat >"$dir/users.xml" <<EOF
<?xml version="1.0"?>
<yandex>
    <profiles><default><max_memory_usage>4000000000</max_memory_usage></default></profiles>
    <users>
        <default>
            <password></password>
            <networks><ip>127.0.0.1</ip><ip>::1</ip></networks>
            <profile>default</profile>
            <quota>default</quota>
        </default>
    </users>
    <quotas><default><interval><duration>3600</duration><queries>0</queries><errors>0</errors>
        <result_rows>0</result_rows><read_rows>0</read_rows><execution_time>0</execution_time>
    </interval></default></quotas>
</yandex>
EOF
}

start() {
    local dir http_port=${2:-18123} tcp_port=${3:-19000}
    dir=$(realpath -m "$1")
    if curl -sf "http://127.0.0.1:$http_port/ping" >/dev/null 2>&1; then
        return 0  # already running (a test restarts a server it may have stopped)
    fi
    install_clickhouse
    write_config "$dir" "$http_port" "$tcp_port"
    # The server drops to the owner of its data directory; the clickhouse user may not exist.
    "$SERVER" --config-file="$dir/config.xml" --pidfile="$dir/server.pid" --daemon
    for _ in $(seq 1 100); do
        if curl -sf "http://127.0.0.1:$http_port/ping" >/dev/null 2>&1; then
            return 0
        fi
        sleep 0.2
    done
    echo "ClickHouse did not answer on 127.0.0.1:$http_port; see $dir/log/server.err.log" >&2
    tail -20 "$dir/log/server.err.log" >&2 || true
    return 1
}

stop() {
    local dir pid
    dir=$(realpath -m "$1")
    [ -f "$dir/server.pid" ] || return 0
    pid=$(cat "$dir/server.pid")
    kill "$pid" 2>/dev/null || return 0
    for _ in $(seq 1 100); do
        kill -0 "$pid" 2>/dev/null || return 0
        sleep 0.1
    done
    kill -9 "$pid" 2>/dev/null || true
}

case "${1:-}" in
    --install) install_clickhouse ;;
    start) [ $# -ge 2 ] || { echo "usage: $0 start DIR [HTTP_PORT] [TCP_PORT]" >&2; exit 2; }; shift; start "$@" ;;
    stop) [ $# -ge 2 ] || { echo "usage: $0 stop DIR" >&2; exit 2; }; stop "$2" ;;
    *) echo "usage: $0 start DIR [HTTP_PORT] [TCP_PORT] | $0 stop DIR | $0 --install" >&2; exit 2 ;;
esac
