#!/usr/bin/env bash
# Installs Debian's translated manual pages and groff, the multilingual text `bertdist demo --multilingual` and
# its test read (bertdist.data.manpages). Like setup_chromium.sh it never fails the build: where it cannot install
# (not root, no apt-get, the packages cannot be fetched) it says why and exits 0; the corpus is then whatever
# translations the machine's other packages ship, and a test that needs a language it lacks skips saying so.
# Idempotent: returns at once when the packages are installed.
set -uo pipefail

PACKAGES=(groff-base manpages-de manpages-fr manpages-es manpages-ja manpages-zh)
skip() {
    echo "setup_manpages: not installing ${PACKAGES[*]}: $*" >&2
    exit 0
}

missing=()
for package in "${PACKAGES[@]}"; do
    dpkg -s "$package" >/dev/null 2>&1 || missing+=("$package")
done
[ ${#missing[@]} -eq 0 ] && { echo "setup_manpages: ${PACKAGES[*]} installed"; exit 0; }
[ "$(id -u)" -eq 0 ] || skip "installing needs root (apt-get install ${missing[*]})"
command -v apt-get >/dev/null 2>&1 || skip "there is no apt-get"
echo "setup_manpages: installing ${missing[*]} (apt-get)"
log=/tmp/bertdist-manpages-install.log
if ! DEBIAN_FRONTEND=noninteractive timeout 600 apt-get install -y -q --no-install-recommends "${missing[@]}" >"$log" 2>&1; then
    timeout 300 apt-get update -q >>"$log" 2>&1
    DEBIAN_FRONTEND=noninteractive timeout 600 apt-get install -y -q --no-install-recommends "${missing[@]}" >>"$log" 2>&1 \
        || skip "apt-get install failed (see $log)"
fi
echo "setup_manpages: installed ${missing[*]}"
