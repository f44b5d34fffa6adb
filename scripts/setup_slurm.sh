#!/usr/bin/env bash
# Starts a single-node SLURM cluster (munged + slurmctld + slurmd on 127.0.0.1) on this machine, so the
# SLURM tests submit real jobs with `bertdist submit --backend slurm` instead of faking sbatch.
#
# Why a script: the test suite must not need a cluster, and CI machines start bare. This installs
# Debian's slurm-wlm and munge with apt-get when they are missing, writes a one-node slurm.conf, and
# starts the daemons. It is idempotent and returns in well under a second when the cluster already
# answers. It never fails the build: where it cannot work (not root, no apt-get, daemons refuse to
# start) it prints why, writes the reason to $SLURM_SKIP_FILE, and exits 0; the SLURM tests then skip
# with that reason.
#
# The configuration suits a sandbox, not production (see cluster/slurm/slurm.conf.example for a site):
#   ProctrackType=proctrack/linuxproc, TaskPlugin=task/none   no cgroups (not available in containers)
#   AuthInfo=cred_expire=10   a requeued job waits cred_expire seconds before it may start again (default
#                             120); short here so the requeue test takes seconds, not minutes
#   SlurmUser=root            one user owns everything on a throwaway test machine
set -uo pipefail

SLURM_CONF=${SLURM_CONF:-/etc/slurm/slurm.conf}
SLURM_SKIP_FILE=${SLURM_SKIP_FILE:-/tmp/bertdist-slurm-unavailable}
STATE_DIR=${SLURM_STATE_DIR:-/var/lib/slurm}
LOG_DIR=${SLURM_LOG_DIR:-/var/log/slurm}
# Written on the first line of our slurm.conf: a file without it belongs to someone else and is left alone.
MARKER="# written by bertdist scripts/setup_slurm.sh"

skip() {
    echo "setup_slurm: SLURM tests will be skipped: $*" >&2
    echo "$*" >"$SLURM_SKIP_FILE"
    exit 0
}

cluster_answers() {
    timeout 10 sinfo -h -o '%T' 2>/dev/null | grep -qE '^(idle|mixed|allocated|completing)'
}

rm -f "$SLURM_SKIP_FILE"
if command -v sinfo >/dev/null 2>&1 && cluster_answers; then
    echo "setup_slurm: a SLURM cluster already answers ($(sinfo -h -o '%N %T' | head -n 1))"
    exit 0
fi

if ! command -v slurmctld >/dev/null 2>&1 || ! command -v slurmd >/dev/null 2>&1 \
    || ! command -v sbatch >/dev/null 2>&1 || ! command -v munged >/dev/null 2>&1; then
    [ "$(id -u)" -eq 0 ] || skip "slurm-wlm/munge are not installed and installing them needs root (uid $(id -u))"
    command -v apt-get >/dev/null 2>&1 || skip "slurm-wlm/munge are not installed and there is no apt-get here"
    echo "setup_slurm: installing slurm-wlm and munge with apt-get (about a minute)"
    export DEBIAN_FRONTEND=noninteractive
    if ! { apt-get update -qq && apt-get install -y -qq --no-install-recommends slurm-wlm munge; } >/tmp/bertdist-slurm-apt.log 2>&1; then
        skip "apt-get install slurm-wlm munge failed (log: /tmp/bertdist-slurm-apt.log: $(tail -n 1 /tmp/bertdist-slurm-apt.log))"
    fi
fi
[ "$(id -u)" -eq 0 ] || skip "starting slurmctld/slurmd needs root (uid $(id -u)) and no cluster answers"

if [ -e "$SLURM_CONF" ] && ! head -n 1 "$SLURM_CONF" | grep -qF "$MARKER"; then
    skip "$SLURM_CONF exists and was not written by this script; not touching a real site configuration"
fi

# munge: the key is made by the Debian package; make one if it is missing.
if [ ! -s /etc/munge/munge.key ]; then
    mkdir -p /etc/munge
    dd if=/dev/urandom of=/etc/munge/munge.key bs=1 count=1024 status=none
    chown munge:munge /etc/munge/munge.key 2>/dev/null || true
    chmod 400 /etc/munge/munge.key
fi
mkdir -p /run/munge /var/log/munge /var/lib/munge
chown munge:munge /run/munge /var/log/munge /var/lib/munge 2>/dev/null || true
if ! munge -n </dev/null 2>/dev/null | unmunge >/dev/null 2>&1; then
    if id munge >/dev/null 2>&1; then
        runuser -u munge -- munged 2>/tmp/bertdist-munged.err || munged --force 2>>/tmp/bertdist-munged.err
    else
        munged --force 2>/tmp/bertdist-munged.err
    fi
    for _ in $(seq 50); do munge -n </dev/null 2>/dev/null | unmunge >/dev/null 2>&1 && break; sleep 0.1; done
    munge -n </dev/null 2>/dev/null | unmunge >/dev/null 2>&1 || skip "munged does not start: $(tail -n 1 /tmp/bertdist-munged.err)"
fi

# The node line is what slurmd detects (`slurmd -C`), so the node never drains for a hardware mismatch.
NODE_LINE=$(slurmd -C 2>/dev/null | head -n 1)
case "$NODE_LINE" in
    NodeName=*) ;;
    *) skip "slurmd -C does not describe this machine: $NODE_LINE" ;;
esac
NODE_NAME=$(sed -E 's/^NodeName=([^ ]+).*/\1/' <<<"$NODE_LINE")

mkdir -p "$(dirname "$SLURM_CONF")" "$STATE_DIR/slurmctld" "$STATE_DIR/slurmd" "$LOG_DIR"
cat >"$SLURM_CONF.new" <<EOF
$MARKER
ClusterName=bertdist-test
SlurmctldHost=$NODE_NAME(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=cred_expire=10
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
ReturnToService=2
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
JobRequeue=1
MinJobAge=600
KillWait=10
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.pid
SlurmdSpoolDir=$STATE_DIR/slurmd
StateSaveLocation=$STATE_DIR/slurmctld
SlurmctldLogFile=$LOG_DIR/slurmctld.log
SlurmdLogFile=$LOG_DIR/slurmd.log
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
$NODE_LINE NodeAddr=127.0.0.1 State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOF
sed -i '/^UpTime=/d' "$SLURM_CONF.new"
mv "$SLURM_CONF.new" "$SLURM_CONF"

pgrep -x slurmctld >/dev/null || slurmctld 2>/tmp/bertdist-slurmctld.err || skip "slurmctld does not start: $(tail -n 1 /tmp/bertdist-slurmctld.err)"
pgrep -x slurmd >/dev/null || slurmd 2>/tmp/bertdist-slurmd.err || skip "slurmd does not start: $(tail -n 1 /tmp/bertdist-slurmd.err)"
for _ in $(seq 100); do cluster_answers && break; sleep 0.2; done
if ! cluster_answers; then
    # A node left DOWN by an earlier, killed slurmd comes back with an explicit resume.
    scontrol update NodeName="$NODE_NAME" State=RESUME >/dev/null 2>&1
    sleep 1
    cluster_answers || skip "slurmctld and slurmd run but the node is not usable: $(sinfo -h -o '%N %T %E' 2>&1 | head -n 1)"
fi
echo "setup_slurm: single-node SLURM cluster up ($(sinfo -h -o '%N %T %c CPUs' | head -n 1))"
