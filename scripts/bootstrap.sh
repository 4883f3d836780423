#!/usr/bin/env bash
# Creates the virtualenv and installs eventspark into it; checks Java for Spark.
set -euo pipefail
venv=${1:-.venv}
python=${PYTHON:-python3}

if ! "$python" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
    echo "eventspark needs Python >= 3.11 (found: $("$python" --version 2>&1))" >&2
    exit 1
fi
if ! command -v java >/dev/null 2>&1; then
    echo "eventspark runs its batch pipeline on Apache Spark, which needs Java 17 or newer." >&2
    echo "Install it, e.g.: apt-get install -y openjdk-17-jre-headless" >&2
    exit 1
fi
java_major=$(java -version 2>&1 | sed -n 's/.*version "\([0-9]*\).*/\1/p' | head -1)
if [ -z "$java_major" ] || [ "$java_major" -lt 17 ]; then
    echo "Spark 4 needs Java 17 or newer; 'java -version' reports: $(java -version 2>&1 | head -1)" >&2
    exit 1
fi
[ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
"$venv/bin/python" -m pip install --quiet --upgrade pip
"$venv/bin/python" -m pip install --quiet -e .
# The tracking script served at /s/lib.js (docs/tracking-script.md): pinned, checksum-verified, kept
# in the venv. Without the registry, serve still runs and /s/lib.js says how to fetch it later.
if ! "$venv/bin/eventspark" tracking-script fetch; then
    echo "warning: the tracking script was not installed; /s/lib.js answers 404 until" \
        "'$venv/bin/eventspark tracking-script fetch' succeeds" >&2
fi
