#!/usr/bin/env bash
# One node's share of a bertdist training run: torchrun starts NPROC_PER_NODE ranks of `bertdist train`.
#
#   a laptop, 2 CPU ranks:  DS_ACCELERATOR=cpu NPROC_PER_NODE=2 launch/single_node.sh --config configs/bert-tiny.yaml
#   one node, 8 GPUs:       NPROC_PER_NODE=8 launch/single_node.sh --config configs/bert-base.yaml
#   node i of N, by hand:   NNODES=N NODE_RANK=i MASTER_ADDR=<node 0's address> NPROC_PER_NODE=8 \
#                               launch/single_node.sh --config configs/bert-base.yaml
#
# Arguments go to `bertdist train` unchanged. torchrun exports RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and
# MASTER_PORT, which the trainer reads (bertdist/distributed.py). The last form is the node-rank route that
# SLURM and hostfile launchers automate; `bertdist submit --backend local` runs this script.
set -euo pipefail

NPROC_PER_NODE=${NPROC_PER_NODE:-1}
NNODES=${NNODES:-1}
NODE_RANK=${NODE_RANK:-0}
MASTER_ADDR=${MASTER_ADDR:-127.0.0.1}
MASTER_PORT=${MASTER_PORT:-29500}
PYTHON=${PYTHON:-python3}

for name in NPROC_PER_NODE NNODES NODE_RANK MASTER_PORT; do
    [[ ${!name} =~ ^[0-9]+$ ]] || { echo "single_node.sh: $name=${!name} is not a non-negative integer" >&2; exit 2; }
done
[[ $MASTER_ADDR =~ ^[A-Za-z0-9.:-]+$ ]] || { echo "single_node.sh: MASTER_ADDR=$MASTER_ADDR is not a host name or address" >&2; exit 2; }
(( NODE_RANK < NNODES )) || { echo "single_node.sh: NODE_RANK=$NODE_RANK must be below NNODES=$NNODES" >&2; exit 2; }

exec "$PYTHON" -m torch.distributed.run \
    --nnodes "$NNODES" --node-rank "$NODE_RANK" --nproc-per-node "$NPROC_PER_NODE" \
    --master-addr "$MASTER_ADDR" --master-port "$MASTER_PORT" \
    --module bertdist train "$@"
