#!/usr/bin/env bash
# Makes sure Debian's chromium and chromium-driver are installed, for the browser tests of the
# live events page (tests/ui/). Called by scripts/test-services.sh; the tests drive the browser
# with Selenium through /usr/bin/chromedriver (never a downloaded browser or driver).
#
#   scripts/chromium.sh            # installs both when missing (needs root), else does nothing
set -euo pipefail

BROWSER=/usr/bin/chromium
DRIVER=/usr/bin/chromedriver

[ -x "$BROWSER" ] && [ -x "$DRIVER" ] && exit 0
if [ "$(id -u)" -ne 0 ]; then
    echo "chromium is not installed and installing it needs root: apt-get install -y chromium chromium-driver" >&2
    exit 1
fi
# Update the package lists only when they do not know the package yet.
if ! apt-cache policy chromium-driver 2>/dev/null | grep -q 'Candidate: [0-9]'; then
    apt-get update -q >&2
fi
DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends chromium chromium-driver >&2
for binary in "$BROWSER" "$DRIVER"; do
    [ -x "$binary" ] || { echo "chromium packages installed no $binary" >&2; exit 1; }
done
