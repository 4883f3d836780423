#!/usr/bin/env bash
# Makes sure the machine's services the tests talk to are up: PostgreSQL, MariaDB and Redis run
# before CI starts; this restarts any that stopped. ClickHouse and etcd are installed and started
# by the test fixtures themselves (scripts/clickhouse.sh, scripts/etcd.sh).
set -uo pipefail

wait_for() {  # wait_for NAME COMMAND...: up to 30 s
    local name=$1; shift
    for _ in $(seq 1 30); do "$@" >/dev/null 2>&1 && return 0; sleep 1; done
    echo "$name is not reachable; the tests need it" >&2
    return 1
}

if ! pg_isready -q -h 127.0.0.1 -p 5432 2>/dev/null; then
    pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | head -1)" main start || true
fi
wait_for "PostgreSQL (127.0.0.1:5432)" pg_isready -q -h 127.0.0.1 -p 5432 || exit 1

if ! redis-cli -h 127.0.0.1 -p 6379 ping >/dev/null 2>&1; then
    redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save "" --appendonly no \
        --dir /var/lib/redis --logfile /var/log/redis/ci.log || true
fi
wait_for "Redis (127.0.0.1:6379)" redis-cli -h 127.0.0.1 -p 6379 ping || exit 1

if ! mariadb -h 127.0.0.1 -u root -e 'select 1' >/dev/null 2>&1; then
    start-stop-daemon --start --oknodo --background --exec /usr/sbin/mariadbd || true
fi
wait_for "MariaDB (127.0.0.1:3306)" mariadb -h 127.0.0.1 -u root -e 'select 1' || exit 1
bash "$(dirname "$0")/chromium.sh" || exit 1  # the browser tests of /ui (tests/ui/)
# @segment/analytics-node (tests/segment/). Without the npm registry only that test fails (the
# fixture runs the script again and reports its message), not every test.
bash "$(dirname "$0")/segment-node.sh" >/dev/null || echo "warning: tests/segment's Node.js client test will fail" >&2
