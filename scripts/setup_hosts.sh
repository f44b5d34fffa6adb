#!/usr/bin/env bash
# Installs what the multi-host tests (tests/launch/test_hosts.py) need to make two separate network hosts
# on this machine: iproute2 (`ip netns`), openssh-server (an sshd inside each namespace) and pdsh (how
# DeepSpeed's launcher reaches hosts). Nothing is started here; the tests make and remove the namespaces.
#
# Idempotent, and never fails the build: where it cannot work (not root, no apt-get, the install fails) it
# says why, writes the reason to $HOSTS_SKIP_FILE, and exits 0; the multi-host tests then skip with it.
set -uo pipefail

HOSTS_SKIP_FILE=${HOSTS_SKIP_FILE:-/tmp/bertdist-hosts-unavailable}

skip() {
    echo "setup_hosts: multi-host tests will be skipped: $*" >&2
    echo "$*" >"$HOSTS_SKIP_FILE"
    exit 0
}

rm -f "$HOSTS_SKIP_FILE"
missing=()
command -v ip >/dev/null 2>&1 || missing+=(iproute2)
[ -x /usr/sbin/sshd ] || missing+=(openssh-server)
command -v pdsh >/dev/null 2>&1 || missing+=(pdsh)
command -v ssh >/dev/null 2>&1 || missing+=(openssh-client)
if [ ${#missing[@]} -eq 0 ]; then
    echo "setup_hosts: ip, sshd, ssh and pdsh are installed"
    exit 0
fi
[ "$(id -u)" -eq 0 ] || skip "${missing[*]} not installed and installing needs root (uid $(id -u))"
command -v apt-get >/dev/null 2>&1 || skip "${missing[*]} not installed and there is no apt-get here"
echo "setup_hosts: installing ${missing[*]} with apt-get"
if ! { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"; } \
        >/tmp/bertdist-hosts-apt.log 2>&1; then
    skip "apt-get install ${missing[*]} failed (log: /tmp/bertdist-hosts-apt.log: $(tail -n 1 /tmp/bertdist-hosts-apt.log))"
fi
echo "setup_hosts: installed ${missing[*]}"
