"""Ray job entry point for training: one torchrun per node of a Ray cluster, each running `bertdist train`.

    bertdist submit --backend ray --nodes 2 --gpus-per-node 8 --config configs/bert-base.yaml
    # runs, on the cluster:  python -m bertdist.launch.ray_job --nodes 2 --gpus-per-node 8 ...

Why torchrun under Ray and not Ray Train: the trainer already reads the torchrun environment and owns its
DeepSpeed setup, checkpoints and resume, exactly as under SLURM or a hostfile. Ray only has to find the
machines: a placement group reserves one bundle per node (STRICT_SPREAD: distinct machines), the node of
the first bundle is the rendezvous master, and each node's task runs launch/single_node.sh with
NNODES / NODE_RANK / MASTER_ADDR, the same node-rank route the other launchers take. Ray sets
CUDA_VISIBLE_DEVICES for each task's GPUs, and torchrun's ranks inherit it.

The resolved config arrives in the environment variable BERTDIST_CONFIG_YAML (set by `bertdist submit`),
so the cluster needs no copy of the submitter's files; its paths (shards, vocabulary, train.output_dir) are
read on the cluster and must be on storage every node sees. The job's exit code is the worst of the
nodes'; a preempted run exits with bertdist.train.REQUEUE_EXIT_CODE and resumes when submitted again.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import ray
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from bertdist.launch.job import RAY_CONFIG_ENV
from bertdist.resources import shipped


def _node_address() -> str:
    return ray.util.get_node_ip_address()


def _run_node(node_rank: int, nnodes: int, nproc: int, master_addr: str, master_port: int, config_yaml: str) -> int:
    """One node's share: torchrun with `nproc` ranks of `bertdist train` on the resolved config."""
    launch = shipped("launch") / "single_node.sh"
    with tempfile.TemporaryDirectory(prefix="bertdist-") as tmp:
        config = Path(tmp) / "config.yaml"
        config.write_text(config_yaml)
        env = {**os.environ, "NNODES": str(nnodes), "NODE_RANK": str(node_rank), "NPROC_PER_NODE": str(nproc),
               "MASTER_ADDR": master_addr, "MASTER_PORT": str(master_port), "PYTHON": sys.executable}
        return subprocess.run(["bash", str(launch), "--config", str(config)], env=env, check=False).returncode


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, required=True)
    parser.add_argument("--gpus-per-node", type=int, required=True)
    parser.add_argument("--master-port", type=int, default=29500)
    parser.add_argument("--cpu-only", action="store_true", help="ranks are CPU processes: reserve CPUs, not GPUs")
    args = parser.parse_args(argv)
    config_yaml = os.environ.get(RAY_CONFIG_ENV)
    if not config_yaml:
        print(f"ray_job: {RAY_CONFIG_ENV} is not set; submit with `bertdist submit --backend ray`", file=sys.stderr)
        return 2

    ray.init()
    bundle = {"CPU": args.gpus_per_node} if args.cpu_only else {"CPU": 1, "GPU": args.gpus_per_node}
    pg = placement_group([dict(bundle) for _ in range(args.nodes)],
                         strategy="STRICT_SPREAD" if args.nodes > 1 else "PACK")
    ray.get(pg.ready())
    try:
        def on_bundle(fn, index: int):
            options = dict(scheduling_strategy=PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=index),
                           num_cpus=bundle["CPU"], num_gpus=bundle.get("GPU", 0))
            return ray.remote(fn).options(**options)

        master_addr = ray.get(on_bundle(_node_address, 0).remote())
        print(f"ray_job: {args.nodes} node(s) x {args.gpus_per_node} rank(s), master {master_addr}:{args.master_port}",
              flush=True)
        codes = ray.get([
            on_bundle(_run_node, i).remote(i, args.nodes, args.gpus_per_node, master_addr, args.master_port, config_yaml)
            for i in range(args.nodes)
        ])
    finally:
        remove_placement_group(pg)
    print(f"ray_job: node exit codes {codes}", flush=True)
    return max(codes, key=lambda code: (code != 0, code))


if __name__ == "__main__":
    sys.exit(main())
