#!/usr/bin/env bash
# Many nodes over SSH: DeepSpeed's launcher reads a hostfile and starts `bertdist train` on every host.
#
#   HOSTFILE=cluster/hostfile.example launch/multinode_hostfile.sh --config configs/bert-base.yaml
#   HOSTFILE=hosts NUM_NODES=2 GPUS_PER_NODE=8 MASTER_ADDR=10.0.0.1 launch/multinode_hostfile.sh --config ...
#
# The hostfile has one `hostname slots=<GPUs>` line per machine (see cluster/hostfile.example). The
# launcher reaches every host with pdsh over passwordless SSH, so the repository, the virtual environment
# and the data must be at the same paths on all hosts (a shared file system). Variables listed in
# ~/.deepspeed_env (NAME=value lines) are exported on the remote hosts, e.g. DS_ACCELERATOR or NCCL_*.
# Arguments go to `bertdist train` unchanged; `bertdist submit --backend deepspeed` runs this script.
set -euo pipefail

: "${HOSTFILE:?set HOSTFILE to a DeepSpeed hostfile (lines of: hostname slots=N)}"
[ -f "$HOSTFILE" ] || { echo "multinode_hostfile.sh: HOSTFILE=$HOSTFILE does not exist" >&2; exit 2; }
PYTHON=${PYTHON:-python3}
MASTER_PORT=${MASTER_PORT:-29500}
# Defaults: every host of the file, every slot of a host, and the first host as the rendezvous master.
NUM_NODES=${NUM_NODES:--1}
GPUS_PER_NODE=${GPUS_PER_NODE:--1}
MASTER_ADDR=${MASTER_ADDR:-$(awk '!/^[[:space:]]*(#|$)/ {print $1; exit}' "$HOSTFILE")}

for name in NUM_NODES GPUS_PER_NODE MASTER_PORT; do
    [[ ${!name} =~ ^-?[0-9]+$ ]] || { echo "multinode_hostfile.sh: $name=${!name} is not an integer" >&2; exit 2; }
done
[[ $MASTER_ADDR =~ ^[A-Za-z0-9.:-]+$ ]] || { echo "multinode_hostfile.sh: MASTER_ADDR=$MASTER_ADDR is not a host name or address" >&2; exit 2; }

# --no_local_rank: the trainer reads LOCAL_RANK from the environment instead of a --local_rank argument.
exec "$PYTHON" -m deepspeed.launcher.runner \
    --hostfile "$HOSTFILE" --num_nodes "$NUM_NODES" --num_gpus "$GPUS_PER_NODE" \
    --master_addr "$MASTER_ADDR" --master_port "$MASTER_PORT" \
    --no_local_rank --module bertdist train "$@"
