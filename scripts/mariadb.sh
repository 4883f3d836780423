#!/usr/bin/env bash
# Runs a throw-away MariaDB server on loopback, as a background process, for the tests that stop
# or kill a server (the machine's MariaDB on 3306 must stay up for everyone else). Everything
# (data, socket, pid file, error log) lives in DIR; user root, no password, over TCP and the socket.
#
#   scripts/mariadb.sh start DIR PORT   # initialises DIR on first use; returns once the server
#                                       # answers (at once if the one of DIR answers already)
#   scripts/mariadb.sh stop DIR         # a clean shutdown (SIGTERM), waits until the server is gone
#   scripts/mariadb.sh kill DIR         # SIGKILL, as a crash: InnoDB recovers on the next start
set -euo pipefail

find_binary() {
    local name
    for name in "$@"; do
        if command -v "$name" >/dev/null 2>&1; then
            command -v "$name"
            return 0
        fi
        if [ -x "/usr/sbin/$name" ]; then
            echo "/usr/sbin/$name"
            return 0
        fi
    done
    echo "none of $* is installed: apt-get install -y mariadb-server mariadb-client" >&2
    return 1
}

pid_of() {
    local dir=$1
    [ -f "$dir/mariadbd.pid" ] || return 1
    cat "$dir/mariadbd.pid"
}

is_running() {
    local pid
    pid=$(pid_of "$1") || return 1
    is_alive "$pid"
}

answers() {
    local dir=$1
    "$ADMIN" --no-defaults --protocol=socket --socket="$dir/mariadb.sock" --user=root \
        --connect-timeout=1 ping >/dev/null 2>&1
}

initialise() {
    local dir=$1 install
    [ -d "$dir/data/mysql" ] && return 0
    install=$(find_binary mariadb-install-db mysql_install_db)
    mkdir -p "$dir/data"
    # auth-root-authentication-method=normal: root@localhost with an empty password (not unix_socket).
    "$install" --no-defaults --datadir="$dir/data" --user="$(id -un)" \
        --auth-root-authentication-method=normal --skip-test-db >"$dir/install.log" 2>&1 || {
        echo "$install failed; see $dir/install.log:" >&2
        tail -20 "$dir/install.log" >&2
        return 1
    }
    echo initialising >"$dir/needs-grants"
}

grant_tcp_root() {
    # Without name resolution a TCP client from 127.0.0.1 is not root@localhost: give that host
    # its own root, as the machine's server has.
    "$CLIENT" --no-defaults --protocol=socket --socket="$1/mariadb.sock" --user=root -e \
        "CREATE USER IF NOT EXISTS 'root'@'127.0.0.1'; GRANT ALL ON *.* TO 'root'@'127.0.0.1' WITH GRANT OPTION;"
    rm -f "$1/needs-grants"
}

start() {
    local dir=$1 port=$2 server
    mkdir -p "$dir"
    dir=$(realpath "$dir")
    if is_running "$dir" && answers "$dir"; then
        return 0
    fi
    server=$(find_binary mariadbd mysqld)
    initialise "$dir"
    # setsid: the server outlives this script and is not in the test runner's process group.
    setsid "$server" --no-defaults --user="$(id -un)" --datadir="$dir/data" \
        --socket="$dir/mariadb.sock" --pid-file="$dir/mariadbd.pid" --log-error="$dir/error.log" \
        --port="$port" --bind-address=127.0.0.1 --skip-name-resolve --skip-log-bin \
        --innodb-buffer-pool-size=32M --innodb-log-file-size=16M --innodb-use-native-aio=0 \
        --max-connections=100 --local-infile=1 </dev/null >>"$dir/server.out" 2>&1 &
    local launched=$!
    for _ in $(seq 1 300); do
        if answers "$dir"; then
            [ -f "$dir/needs-grants" ] && grant_tcp_root "$dir"
            return 0
        fi
        if ! kill -0 "$launched" 2>/dev/null; then
            break
        fi
        sleep 0.1
    done
    echo "MariaDB did not answer on 127.0.0.1:$port; see $dir/error.log:" >&2
    tail -20 "$dir/error.log" >&2 || true
    return 1
}

is_alive() {
    # A zombie (dead, not yet reaped by whoever adopted it) counts as gone.
    local state
    state=$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null) || return 1
    [ -n "$state" ] && [ "$state" != Z ]
}

wait_gone() {
    local pid=$1
    for _ in $(seq 1 "$2"); do
        is_alive "$pid" || return 0
        sleep 0.1
    done
    return 1
}

stop() {
    local dir pid
    dir=$(realpath -m "$1")
    pid=$(pid_of "$dir") || return 0
    kill "$pid" 2>/dev/null || return 0
    wait_gone "$pid" 600 && return 0
    echo "MariaDB ($pid) did not stop in 60 s; killing it" >&2
    kill -9 "$pid" 2>/dev/null || true
    wait_gone "$pid" 100
}

kill_9() {
    local dir pid
    dir=$(realpath -m "$1")
    pid=$(pid_of "$dir") || { echo "no pid file in $dir" >&2; return 1; }
    kill -9 "$pid" 2>/dev/null || { echo "MariaDB ($pid) was not running" >&2; return 1; }
    wait_gone "$pid" 100 || { echo "MariaDB ($pid) survived SIGKILL" >&2; return 1; }
}

ADMIN=$(find_binary mariadb-admin mysqladmin)
CLIENT=$(find_binary mariadb mysql)
case "${1:-}" in
    start) [ $# -eq 3 ] || { echo "usage: $0 start DIR PORT" >&2; exit 2; }; start "$2" "$3" ;;
    stop) [ $# -eq 2 ] || { echo "usage: $0 stop DIR" >&2; exit 2; }; stop "$2" ;;
    kill) [ $# -eq 2 ] || { echo "usage: $0 kill DIR" >&2; exit 2; }; kill_9 "$2" ;;
    *) echo "usage: $0 start DIR PORT | $0 stop DIR | $0 kill DIR" >&2; exit 2 ;;
esac
