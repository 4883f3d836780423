#!/usr/bin/env bash
# Runs a throw-away BigQuery emulator (bqemulator) on loopback, as a daemon, installing it first
# into a venv of its own: its pins (sqlglot<30.12) clash with fakesnow's in the project's venv.
# The tests start it through this script (once per session) and stop it with `stop`.
#
#   scripts/bqemulator.sh start DIR REST_PORT GRPC_PORT [GCS_ROOT]  # returns once it answers
#   scripts/bqemulator.sh stop DIR                                  # stops the one started in DIR
#   scripts/bqemulator.sh --install                                 # only make sure it is installed
#
# GCS_ROOT: the filesystem root of a fake-gcs-server; `gs://bucket/key` loads then read
# GCS_ROOT/bucket/key (BQEMU_GCS_LOCAL_ROOT). The venv (and the HOME the emulator runs with, where
# DuckDB keeps its spatial extension) is $EVENTSPARK_CACHE/bqemulator, by default
# ~/.cache/eventspark/bqemulator: outside the checkout, kept between runs.
set -euo pipefail

CACHE=${EVENTSPARK_CACHE:-$HOME/.cache/eventspark}/bqemulator
VENV=$CACHE/venv
EMU_HOME=$CACHE/home
PYTHON=${PYTHON:-python3}  # the tests pass their own interpreter
# ../shared/emulators.md section 2: the versions found to work offline on this machine.
PINS=(bqemulator==1.4.0 duckdb==1.5.5 duckdb-extension-spatial==1.5.5 duckdb-extensions==1.5.5 numpy
    google-cloud-bigquery==3.47.0)

install_bqemulator() {
    [ -x "$VENV/bin/bqemulator" ] && [ -f "$CACHE/installed" ] \
        && [ "$(cat "$CACHE/installed")" = "${PINS[*]} +unicode-table-ids" ] && return 0
    mkdir -p "$CACHE" "$EMU_HOME"
    [ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV" >&2
    "$VENV/bin/python" -m pip install -q "${PINS[@]}" >&2
    # The emulator cannot start unless DuckDB's spatial extension loads, and offline it cannot be
    # downloaded: install the one from PyPI into $HOME/.duckdb, the HOME the emulator runs with.
    HOME=$EMU_HOME "$VENV/bin/python" -c "import duckdb_extensions; duckdb_extensions.import_extension('spatial')" >&2
    widen_table_ids
    echo "${PINS[*]} +unicode-table-ids" >"$CACHE/installed"
}

# bqemulator takes table ids of [A-Za-z0-9_-] only, where BigQuery also takes Unicode letters,
# marks, numbers, connectors, dashes and spaces (`ünïcödé_tàble`, as eventspark's contract tests
# create): widen its two patterns to Python's Unicode \w (letters, digits and `_` of every script)
# plus `-`. That is still narrower than BigQuery: \w refuses combining marks (categories Mn, Mc)
# and spaces, so such table names stay refused here (BigQuery's rule for them is untested); it
# also refuses quotes, backticks and every other SQL-dangerous character.
widen_table_ids() {
    "$VENV/bin/python" - <<'EOF_PY'
import pathlib

import bqemulator

root = pathlib.Path(bqemulator.__file__).parent
for rel, old, new in [
    ("domain/ids.py", r'_TABLE_RE = re.compile(r"^[A-Za-z0-9_\-]{1,1024}$")', r'_TABLE_RE = re.compile(r"^[\w\-]{1,1024}$")'),
    (
        "storage/sql_identifiers.py",
        r'_SQL_SAFE_ID_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_\-]{0,254}$")',
        r'_SQL_SAFE_ID_RE = re.compile(r"^\w[\w\-]{0,254}$")',
    ),
]:
    path = root / rel
    text = path.read_text()
    if old in text:
        path.write_text(text.replace(old, new))
    elif new not in text:
        raise SystemExit(f"bqemulator changed: {rel} lacks the table id pattern to widen")
EOF_PY
}

answers() {
    curl -s -o /dev/null "http://127.0.0.1:$1/bigquery/v2/projects/test-proj/datasets" 2>/dev/null
}

start() {
    local dir rest_port=$2 grpc_port=$3 gcs_root=${4:-}
    dir=$(realpath -m "$1")
    if answers "$rest_port"; then
        return 0  # already running
    fi
    install_bqemulator
    mkdir -p "$dir"
    (
        cd "$dir"
        export HOME=$EMU_HOME
        [ -n "$gcs_root" ] && export BQEMU_GCS_LOCAL_ROOT=$gcs_root
        exec setsid "$VENV/bin/bqemulator" start --rest-host 127.0.0.1 --rest-port "$rest_port" --grpc-host 127.0.0.1 \
            --grpc-port "$grpc_port" --project test-proj --log-level warning >"$dir/emulator.log" 2>&1 </dev/null
    ) &
    echo $! >"$dir/emulator.pid"
    for _ in $(seq 1 150); do
        if answers "$rest_port"; then
            return 0
        fi
        kill -0 "$(cat "$dir/emulator.pid")" 2>/dev/null || break
        sleep 0.2
    done
    echo "bqemulator did not answer on 127.0.0.1:$rest_port; see $dir/emulator.log" >&2
    tail -20 "$dir/emulator.log" >&2 || true
    return 1
}

stop() {
    local dir pid
    dir=$(realpath -m "$1")
    [ -f "$dir/emulator.pid" ] || return 0
    pid=$(cat "$dir/emulator.pid")
    kill "$pid" 2>/dev/null || return 0
    for _ in $(seq 1 100); do
        kill -0 "$pid" 2>/dev/null || return 0
        sleep 0.1
    done
    kill -9 "$pid" 2>/dev/null || true
}

case "${1:-}" in
    --install) install_bqemulator ;;
    start) [ $# -ge 4 ] || { echo "usage: $0 start DIR REST_PORT GRPC_PORT [GCS_ROOT]" >&2; exit 2; }; shift; start "$@" ;;
    stop) [ $# -ge 2 ] || { echo "usage: $0 stop DIR" >&2; exit 2; }; stop "$2" ;;
    *) echo "usage: $0 start DIR REST_PORT GRPC_PORT [GCS_ROOT] | $0 stop DIR | $0 --install" >&2; exit 2 ;;
esac
