#!/usr/bin/env bash
# Installs Segment's Node.js library, @segment/analytics-node, from the npm registry into a cache
# directory, for the client tests of the Segment endpoints (tests/segment/). Called by
# scripts/test-services.sh and by the tests' fixture; prints the directory that holds node_modules.
#
#   scripts/segment-node.sh        # installs when missing (a few seconds), else only prints the directory
#
# The whole dependency tree is pinned, with checksums, by scripts/segment-node/package-lock.json
# (`npm ci`); to change the version, edit package.json there and run
# `npm install --package-lock-only --ignore-scripts` in that directory.
# Bounded: at most INSTALL_TIMEOUT seconds (default 120), one retry per request. A registry that
# cannot be reached fails with a message saying so; npm_config_registry selects a mirror.
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
LOCK="$HERE/segment-node/package-lock.json"
VERSION=$(sed -n 's/.*"@segment\/analytics-node": "\([0-9.]*\)".*/\1/p' "$HERE/segment-node/package.json")
# The directory's name carries the lock file's checksum: a changed lock installs afresh.
LOCK_SUM=$(sha256sum "$LOCK" | cut -c1-12)
CACHE=${XDG_CACHE_HOME:-$HOME/.cache}/eventspark
DIR=${EVENTSPARK_SEGMENT_NODE_DIR:-$CACHE/segment-node-$VERSION-$LOCK_SUM}
PACKAGE="$DIR/node_modules/@segment/analytics-node/package.json"
TIMEOUT=${INSTALL_TIMEOUT:-120}

fail() {
    echo "scripts/segment-node.sh: cannot install @segment/analytics-node@$VERSION: $*" >&2
    echo "  (the npm registry must be reachable, or set npm_config_registry to a mirror;" \
        "the tests of tests/segment/ that run the Node.js client need it)" >&2
    exit 1
}

if [ ! -f "$PACKAGE" ]; then
    command -v npm >/dev/null || fail "npm is not installed (apt-get install -y nodejs npm)"
    mkdir -p "$(dirname "$DIR")"
    # Installed beside the target and renamed into place: an interrupted or failed install never
    # looks complete, and two concurrent runs do not mix their files.
    staging=$(mktemp -d "$DIR.XXXXXX")
    trap 'rm -rf "$staging"' EXIT
    cp "$HERE/segment-node/package.json" "$LOCK" "$staging/"
    # --ignore-scripts: nothing from the registry runs at install time.
    status=0
    timeout --kill-after=5 "$TIMEOUT" npm ci --prefix "$staging" --no-audit --no-fund --ignore-scripts --loglevel=error \
        --fetch-retries=1 --fetch-timeout=30000 >&2 || status=$?
    if [ "$status" = 124 ] || [ "$status" = 137 ]; then  # 137: killed after ignoring the TERM
        fail "npm did not finish within $TIMEOUT seconds"
    elif [ "$status" != 0 ]; then
        fail "npm ci exited with status $status (its error is above)"
    fi
    mv -T "$staging" "$DIR" 2>/dev/null || [ -f "$PACKAGE" ] || fail "cannot move the installation to $DIR"
fi
grep -q "\"version\": \"$VERSION\"" "$PACKAGE" || fail "$PACKAGE is not version $VERSION"
echo "$DIR"
