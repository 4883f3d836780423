#!/usr/bin/env bash
# Installs Segment's Node.js library, @segment/analytics-node (pinned), from the npm registry into a
# cache directory, for the client tests of the Segment endpoints (tests/segment/). Called by
# scripts/test-services.sh and by the tests' fixture; prints the directory that holds node_modules.
#
#   scripts/segment-node.sh        # installs when missing (about 10 s), else only prints the directory
set -euo pipefail

VERSION=3.1.0
DIR=${EVENTSPARK_SEGMENT_NODE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/eventspark/segment-node-$VERSION}
PACKAGE="$DIR/node_modules/@segment/analytics-node/package.json"

if [ ! -f "$PACKAGE" ]; then
    command -v npm >/dev/null || { echo "npm is not installed: apt-get install -y nodejs npm" >&2; exit 1; }
    mkdir -p "$DIR"
    # --ignore-scripts: nothing from the registry runs at install time.
    timeout 300 npm install --prefix "$DIR" --no-audit --no-fund --ignore-scripts --loglevel=error \
        "@segment/analytics-node@$VERSION" >&2
fi
grep -q "\"version\": \"$VERSION\"" "$PACKAGE" || { echo "$PACKAGE is not version $VERSION" >&2; exit 1; }
echo "$DIR"
