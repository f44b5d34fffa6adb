"""Ray job entry point for training: the elastic supervisor over the nodes of a Ray cluster.

    bertdist submit --backend ray --nodes 2-4 --gpus-per-node 8 --config configs/bert-base.yaml
    # runs, on the cluster:  python -m bertdist.launch.ray_job --gpus-per-node 8 ...

The loop is `bertdist.launch.elastic`'s, the same as over a hostfile; this module is its fleet of Ray nodes:

- hosts: the alive nodes with the resources of one node's ranks (`--gpus-per-node` GPUs, or CPUs with
  `--cpu-only`), this driver's node first, so the rendezvous master stays put while it lives;
- a probe: Ray's node table (a node is lost when Ray marks it dead: its raylet stopped answering);
- a launch: one task per chosen node, pinned to it (node affinity, not soft), that starts the node's ranks of
  `bertdist train` itself with the torchrun variables (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, ...), and
  returns the worst of their exit codes, a signal as 128 + its number: a node whose ranks were killed is
  told from one whose ranks lost a peer (torchrun would report both as 1). A task that Ray loses with its
  node counts as 255, as SSH reports a lost host;
- stopping and killing: a task pinned to each node signals the ranks there, found by their command line.

Why not Ray Train: the trainer already reads the torchrun environment and owns its DeepSpeed setup,
checkpoints and resume, exactly as under SLURM or a hostfile. The resolved config arrives in the environment
variable BERTDIST_CONFIG_YAML (set by `bertdist submit`), so the cluster needs no copy of the submitter's
files; its paths (shards, vocabulary, train.output_dir) are read on the cluster and must be on storage every
node sees. The state for `bertdist status` is written to {train.output_dir}/elastic.json.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import secrets
import signal
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from bertdist.config import load_config
from bertdist.errors import USAGE_EXIT_CODE, UserError
from bertdist.launch.elastic import Supervisor
from bertdist.launch.ray import RAY_CONFIG_ENV
from bertdist.launch.ssh_fleet import pkill_argv, ranks_pattern

LOST_TASK_EXIT_CODE = 255
STATE_FILENAME = "elastic.json"


def _run_ranks(
    node_rank: int,
    nnodes: int,
    nproc: int,
    master_addr: str,
    master_port: int,
    config_file: str,
    config_yaml: str,
    trainer_args: list[str],
) -> int:
    """One node's ranks of `bertdist train`; the worst exit code, a signal as 128 + its number."""
    write_private(Path(config_file), config_yaml)
    procs = []
    for local in range(nproc):
        env = {
            **os.environ,
            "RANK": str(node_rank * nproc + local),
            "WORLD_SIZE": str(nnodes * nproc),
            "LOCAL_RANK": str(local),
            "LOCAL_WORLD_SIZE": str(nproc),
            "MASTER_ADDR": master_addr,
            "MASTER_PORT": str(master_port),
        }
        procs.append(
            subprocess.Popen(
                [sys.executable, "-u", "-m", "bertdist", "train", "--config", config_file, *trainer_args], env=env
            )
        )
    codes = [p.wait() for p in procs]
    return max((128 - c if c < 0 else c for c in codes), key=lambda c: (c != 0, c))


def write_private(path: Path, text: str) -> None:
    """`text` into `path`, in a directory of this user's alone: the path is in every rank's command line (`ps`) and
    reused on every node the job launches on, so another user could create the directory first, with the file a
    link to one of ours (overwritten with the config) or swapped before the ranks read it."""
    with contextlib.suppress(FileExistsError):
        path.parent.mkdir(mode=0o700)
    found = os.lstat(path.parent)
    if not stat.S_ISDIR(found.st_mode) or found.st_uid != os.getuid() or found.st_mode & 0o077:
        raise UserError(f"{path.parent}: refused for the job's config: not a directory of this user's alone (0700)")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)


def _signal_ranks(pattern: str, signum: int) -> None:
    """Signal this job's ranks on this node (its network namespace: see bertdist.launch.ssh_fleet)."""
    subprocess.run(
        pkill_argv(signal.Signals(signum).name[3:], pattern, str(os.getpid())), check=False, capture_output=True
    )


class RayFleet:
    def __init__(self, gpus_per_node: int, cpu_only: bool, master_port: int, config_yaml: str):
        self.bundle = {"num_cpus": gpus_per_node} if cpu_only else {"num_cpus": 1, "num_gpus": gpus_per_node}
        self.master_port, self.config_yaml = master_port, config_yaml
        # One path on every node, unique to this job: the ranks' command lines name it (ranks_pattern).
        self.config_file = str(Path(tempfile.gettempdir()) / f"bertdist-ray-{secrets.token_hex(6)}" / "config.yaml")
        self.pattern = ranks_pattern(self.config_file)
        self.here = ray.util.get_node_ip_address()

    def _nodes(self) -> dict[str, dict]:
        return {n["NodeManagerAddress"]: n for n in ray.nodes() if n["Alive"]}

    def hosts(self) -> list[str]:
        need = {"CPU": self.bundle["num_cpus"], "GPU": self.bundle.get("num_gpus", 0)}
        fit = [
            ip for ip, n in self._nodes().items() if all(n["Resources"].get(k, 0) >= v for k, v in need.items() if v)
        ]
        return sorted(fit, key=lambda ip: (ip != self.here, ip))

    def probe(self, hosts: list[str]) -> dict[str, str]:
        alive = self._nodes()
        return {h: "Ray marks the node dead" for h in hosts if h not in alive}

    def _on(self, host: str, fn, **resources):
        node_id = self._nodes()[host]["NodeID"]
        return ray.remote(fn).options(
            scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False), **resources
        )

    def _everywhere(self, hosts: list[str], signum: int) -> None:
        alive = [h for h in hosts if h in self._nodes()]
        refs = [self._on(h, _signal_ranks, num_cpus=0).remote(self.pattern, signum) for h in alive]
        ray.wait(refs, num_returns=len(refs), timeout=60)

    def clean(self, host: str) -> None:
        self._everywhere([host], signal.SIGKILL)

    def launch(self, hosts: list[str], ranks_per_host: int, trainer_args: list[str]) -> "RayAttempt":
        refs = [
            self._on(h, _run_ranks, **self.bundle).remote(
                i,
                len(hosts),
                ranks_per_host,
                hosts[0],
                self.master_port,
                self.config_file,
                self.config_yaml,
                trainer_args,
            )
            for i, h in enumerate(hosts)
        ]
        return RayAttempt(self, hosts, refs)


class RayAttempt:
    def __init__(self, fleet: RayFleet, hosts: list[str], refs: list):
        self.fleet, self.hosts, self.refs = fleet, hosts, refs

    def wait(self, timeout_s: float) -> dict[str, int] | None:
        done, _ = ray.wait(self.refs, num_returns=len(self.refs), timeout=timeout_s)
        if len(done) < len(self.refs):
            return None
        codes = {}
        for host, ref in zip(self.hosts, self.refs):
            try:
                codes[host] = ray.get(ref)
            except ray.exceptions.RayError:  # the node, its raylet or the task's worker is gone
                codes[host] = LOST_TASK_EXIT_CODE
        return codes

    def request_stop(self) -> None:
        self.fleet._everywhere(self.hosts, signal.SIGTERM)

    def kill(self) -> None:
        self.fleet._everywhere(self.hosts, signal.SIGKILL)
        for ref in self.refs:
            ray.cancel(ref, force=True)
        ray.wait(self.refs, num_returns=len(self.refs), timeout=60)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gpus-per-node", type=int, required=True)
    parser.add_argument("--cpu-only", action="store_true", help="ranks are CPU processes: reserve CPUs, not GPUs")
    args = parser.parse_args(argv)
    config_yaml = os.environ.get(RAY_CONFIG_ENV)
    if not config_yaml:
        print(f"ray_job: {RAY_CONFIG_ENV} is not set; submit with `bertdist submit --backend ray`", file=sys.stderr)
        return USAGE_EXIT_CODE
    try:
        with tempfile.NamedTemporaryFile("w", suffix=".yaml") as f:
            f.write(config_yaml)
            f.flush()
            cfg = load_config(f.name, [])
    except UserError as e:
        print(f"ray_job: {e}", file=sys.stderr)
        return USAGE_EXIT_CODE
    ray.init()
    fleet = RayFleet(args.gpus_per_node, args.cpu_only, cfg.launch.master_port, config_yaml)
    return Supervisor(cfg, fleet, Path(cfg.train.output_dir) / STATE_FILENAME).run()


if __name__ == "__main__":
    sys.exit(main())
