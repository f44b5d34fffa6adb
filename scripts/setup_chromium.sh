#!/usr/bin/env bash
# Installs Debian's headless Chromium for the tests that open pages as a person would (the MLflow
# dashboard). Like setup_slurm.sh it never fails the build: where it cannot install (not root, no apt-get,
# the package cannot be fetched) it writes the reason to $CHROMIUM_SKIP_FILE and exits 0, and those tests
# skip with that reason. Idempotent: returns at once when chromium is already installed.
set -uo pipefail

CHROMIUM_SKIP_FILE=${CHROMIUM_SKIP_FILE:-/tmp/bertdist-chromium-unavailable}

skip() {
    echo "setup_chromium: browser tests will be skipped: $*" >&2
    echo "$*" >"$CHROMIUM_SKIP_FILE"
    exit 0
}

rm -f "$CHROMIUM_SKIP_FILE"
if command -v chromium >/dev/null 2>&1; then
    echo "setup_chromium: $(chromium --version 2>/dev/null | head -n 1)"
    exit 0
fi
[ "$(id -u)" -eq 0 ] || skip "chromium is not installed and installing it needs root (apt-get install chromium)"
command -v apt-get >/dev/null 2>&1 || skip "chromium is not installed and there is no apt-get to install it"
echo "setup_chromium: installing Debian's chromium (apt-get)"
if ! DEBIAN_FRONTEND=noninteractive timeout 900 apt-get install -y -q --no-install-recommends chromium >/tmp/bertdist-chromium-install.log 2>&1; then
    timeout 300 apt-get update -q >>/tmp/bertdist-chromium-install.log 2>&1
    DEBIAN_FRONTEND=noninteractive timeout 900 apt-get install -y -q --no-install-recommends chromium >>/tmp/bertdist-chromium-install.log 2>&1 \
        || skip "apt-get install chromium failed (see /tmp/bertdist-chromium-install.log)"
fi
echo "setup_chromium: $(chromium --version 2>/dev/null | head -n 1)"
