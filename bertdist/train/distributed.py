"""Who am I in the job: rank, world size and rendezvous address from whichever launcher started us.

Supported launchers and the environment they set:

- `deepspeed` and `torchrun`: RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT.
- SLURM's `srun` (one task per GPU): SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, SLURM_NODELIST; the
  master is the first host of the node list and the port comes from MASTER_PORT or the config.
- no launcher: a single process, rank 0 of 1, on 127.0.0.1.

The torchrun-style variables win when both are present, because `srun deepspeed ...` or `srun torchrun
...` set them per rank while SLURM's describe the outer allocation. This module only reads the
environment and starts torch.distributed (having pointed the ops DeepSpeed builds at this installation first:
bertdist.train.extensions); it knows nothing about the model.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import re
import shutil
import socket
import subprocess
import sys
import warnings
from dataclasses import dataclass
from typing import Mapping

from bertdist import lease, ownership, storage
from bertdist.errors import UserError, first_line
from bertdist.train import extensions

DEFAULT_MASTER_PORT = 29500


class LaunchEnvironmentError(UserError, RuntimeError):
    """The launcher's environment is incomplete or contradictory."""


@dataclass(frozen=True)
class DistributedEnv:
    rank: int
    world_size: int
    local_rank: int
    master_addr: str
    master_port: int
    launcher: str
    """torchrun (also the deepspeed launcher), slurm or none."""
    local_world_size: int = 1
    """Ranks on this node."""

    @property
    def nodes(self) -> int:
        return max(1, -(-self.world_size // self.local_world_size))

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def read_env(environ: Mapping[str, str] | None = None, default_port: int = DEFAULT_MASTER_PORT) -> DistributedEnv:
    """The rank layout described by `environ` (default: os.environ)."""
    env = os.environ if environ is None else environ
    if "RANK" in env or "WORLD_SIZE" in env:
        rank = _int(env, "RANK")
        world_size = _int(env, "WORLD_SIZE")
        local_rank = _int(env, "LOCAL_RANK", default=rank)
        addr = env.get("MASTER_ADDR", "127.0.0.1")
        port = _int(env, "MASTER_PORT", default=default_port)
        launcher = "torchrun"
        local_world = _int(env, "LOCAL_WORLD_SIZE", default=_int(env, "LOCAL_SIZE", default=world_size))
    elif "SLURM_PROCID" in env and "SLURM_NTASKS" in env:
        rank = _int(env, "SLURM_PROCID")
        world_size = _int(env, "SLURM_NTASKS")
        local_rank = _int(env, "SLURM_LOCALID", default=0)
        addr = env.get("MASTER_ADDR") or first_host(env.get("SLURM_NODELIST") or env.get("SLURM_JOB_NODELIST", ""))
        port = _int(env, "MASTER_PORT", default=default_port)
        launcher = "slurm"
        local_world = _tasks_on_this_node(env.get("SLURM_TASKS_PER_NODE", ""), world_size)
    else:
        return DistributedEnv(0, 1, 0, "127.0.0.1", _int(env, "MASTER_PORT", default=default_port), "none")
    if world_size < 1 or not 0 <= rank < world_size:
        raise LaunchEnvironmentError(
            f"rank {rank} is not within world size {world_size} (from the {launcher} environment)"
        )
    if not 1 <= port <= 65535:
        raise LaunchEnvironmentError(f"MASTER_PORT={port} is not a TCP port")
    return DistributedEnv(rank, world_size, local_rank, addr, port, launcher, local_world)


def unlaunched_note(env: DistributedEnv, planned_ranks: int) -> str:
    """A line for a process that no launcher started (no RANK/WORLD_SIZE or SLURM variables) while the config
    plans several ranks: it trains alone, which the dry run's "world size" did not say; '' otherwise."""
    if env.launcher != "none" or planned_ranks <= 1:
        return ""
    return (
        f"bertdist train: no launcher started this process (no RANK/WORLD_SIZE or SLURM variables), so it trains "
        f"on 1 rank, not the {planned_ranks} that launch.nodes x launch.gpus_per_node plan; `bertdist submit "
        "--config ...` starts them all (or deepspeed/torchrun/srun)"
    )


def _tasks_on_this_node(tasks_per_node: str, world_size: int) -> int:
    """First count of SLURM_TASKS_PER_NODE ("8(x2),4" -> 8); the whole world when it is not set."""
    match = re.match(r"^(\d+)", tasks_per_node)
    return int(match.group(1)) if match else world_size


def _int(env: Mapping[str, str], name: str, default: int | None = None) -> int:
    text = env.get(name)
    if text is None or text == "":
        if default is None:
            raise LaunchEnvironmentError(
                f"environment variable {name} is not set but the launcher's other variables are"
            )
        return default
    try:
        return int(text)
    except ValueError:
        raise LaunchEnvironmentError(f"environment variable {name}={text!r} is not an integer") from None


# ---------------------------------------------------------------------------------------------
# SLURM node lists: "gpu[01-03,07],login1" -> gpu01 gpu02 gpu03 gpu07 login1


def first_host(nodelist: str) -> str:
    """The first host of a SLURM node list; `scontrol show hostnames` when available, else our parser."""
    if not nodelist:
        raise LaunchEnvironmentError("SLURM_NODELIST is empty: cannot tell which host is the master")
    scontrol = shutil.which("scontrol")
    if scontrol:
        result = subprocess.run([scontrol, "show", "hostnames", nodelist], capture_output=True, text=True, check=False)
        if result.returncode == 0 and result.stdout.split():
            return result.stdout.split()[0]
    return expand_nodelist(nodelist)[0]


_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")


def expand_nodelist(nodelist: str) -> list[str]:
    """Expand SLURM's compressed host list syntax, keeping the zero padding of ranges.

    Handles several bracket groups per name (`rack[1-2]-node[01-02]`), which `scontrol` also accepts.
    """
    hosts: list[str] = []
    for item in _split_top_level(nodelist):
        hosts.extend(_expand_item(item, nodelist))
    if not hosts:
        raise LaunchEnvironmentError(f"SLURM node list {nodelist!r} names no host")
    return hosts


def _split_top_level(text: str) -> list[str]:
    items, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
        elif ch == "," and depth == 0:
            items.append(text[start:i])
            start = i + 1
    items.append(text[start:])
    return [s.strip() for s in items if s.strip()]


def _expand_item(item: str, whole: str) -> list[str]:
    open_at = item.find("[")
    if open_at < 0:
        return [item]
    close_at = item.find("]", open_at)
    if close_at < 0:
        raise LaunchEnvironmentError(f"SLURM node list {whole!r}: unbalanced '[' in {item!r}")
    prefix, body, rest = item[:open_at], item[open_at + 1 : close_at], item[close_at + 1 :]
    suffixes = _expand_item(rest, whole) if rest else [""]
    names = []
    for part in body.split(","):
        match = _RANGE.match(part.strip())
        if not match:
            raise LaunchEnvironmentError(f"SLURM node list {whole!r}: cannot read range {part!r}")
        lo, hi = match.group(1), match.group(2) or match.group(1)
        width = len(lo)
        for n in range(int(lo), int(hi) + 1):
            names.extend(f"{prefix}{n:0{width}d}{s}" for s in suffixes)
    return names


# ---------------------------------------------------------------------------------------------


def init_process_group(
    env: DistributedEnv, backend: str, rendezvous_timeout_s: float = 300.0, collective_timeout_s: float = 1800.0
) -> None:
    """Start torch.distributed for `env` with `backend` (nccl on GPU, gloo on CPU).

    Two timeouts, because one is wrong for both: the rendezvous (every rank reaching rank 0's store)
    should fail within minutes when a rank never starts or MASTER_ADDR is unreachable, while a collective
    of a healthy job may legitimately wait longer (a slow checkpoint on one rank). The store is built here
    with the first and the process group with the second. Sets the torchrun-style variables first,
    because DeepSpeed reads them again when it initialises; `destroy_process_group` (or a failure here)
    puts them back, so that a later run in the same process, or a job it submits, does not inherit them.
    Every rank of every launcher, and every in-process run, comes here before it builds an optimizer or an
    engine: where DeepSpeed's op builds are pointed at this installation and stale build locks cleared.
    """
    import torch.distributed as dist

    if not _ENV_BEFORE:
        _ENV_BEFORE.update({name: os.environ.get(name) for name in _LAUNCH_VARIABLES})
    os.environ.update(
        RANK=str(env.rank),
        WORLD_SIZE=str(env.world_size),
        LOCAL_RANK=str(env.local_rank),
        MASTER_ADDR=env.master_addr,
        MASTER_PORT=str(env.master_port),
    )
    # DeepSpeed's ZeRO collectives call these deprecated torch functions on every step, and the warning is
    # printed again and again (something resets the warning registry): a ZeRO-3 epoch wrote hundreds of lines.
    warnings.filterwarnings(
        "ignore", r"`torch\.distributed\.(reduce_scatter_tensor|all_gather_into_tensor)` is deprecated", FutureWarning
    )
    if not dist.is_initialized():
        try:
            _start(env, backend, rendezvous_timeout_s, collective_timeout_s)
        except BaseException:
            _restore_env()
            raise
    extensions.prepare()  # after the rendezvous, whose timeout is shorter than a build this may wait for


_LAUNCH_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
_ENV_BEFORE: dict[str, str | None] = {}


def standalone_environment(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment for a process this rank starts that is a job of its own, not a rank of this one
    (the demo's fine-tuning runs, a downstream evaluation): no launcher or SLURM task variables."""
    env = os.environ if environ is None else environ
    return {k: v for k, v in env.items() if k not in _LAUNCH_VARIABLES and not k.startswith("SLURM_")}


def _restore_env() -> None:
    for name, value in _ENV_BEFORE.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    _ENV_BEFORE.clear()


def _start(env: DistributedEnv, backend: str, rendezvous_timeout_s: float, collective_timeout_s: float) -> None:
    import torch.distributed as dist

    where = f"{env.master_addr}:{env.master_port}"
    try:
        serves = env.rank == 0 and not _agent_store()
        listen_fd = _listening_socket(env.master_addr, env.master_port) if serves else None
        store = dist.TCPStore(
            env.master_addr,
            env.master_port,
            env.world_size,
            is_master=serves,
            timeout=datetime.timedelta(seconds=rendezvous_timeout_s),
            wait_for_workers=True,
            master_listen_fd=listen_fd,
        )
    except (dist.DistError, OSError) as e:
        if env.rank == 0 and isinstance(
            e, (dist.DistNetworkError, OSError)
        ):  # the port is taken, or the address is not ours
            raise LaunchEnvironmentError(
                f"rank 0 cannot open the rendezvous at {where} ({first_line(e)}); "
                "pick a free port (launch.master_port, --master_port, MASTER_PORT)"
            ) from None
        if env.rank == 0:
            joined = re.search(r"(\d+)/(\d+) clients joined", str(e))
            count = (
                f"{int(joined.group(1)) - 1} of the other {env.world_size - 1}" if joined else "not all of the other"
            )
            problem = f"rank 0 waited {rendezvous_timeout_s:g} s at {where} and {count} ranks arrived"
            hint = "the missing ranks did not start, or cannot reach this address"
        else:
            problem = f"rank {env.rank} could not reach the rendezvous at {where} within {rendezvous_timeout_s:g} s"
            hint = "rank 0 did not start, or MASTER_ADDR is not an address of rank 0's host that this host can reach"
        raise LaunchEnvironmentError(
            f"{problem} (train.rendezvous_timeout_s): {hint} ({first_line(e)[:160]})"
        ) from None
    if env.rank != 0 and store.check([_REFUSAL_KEY]):
        store.add(_REFUSAL_SEEN_KEY, 1)
        raise LaunchEnvironmentError(store.get(_REFUSAL_KEY).decode("utf-8", "replace"))
    dist.init_process_group(
        backend=backend,
        store=store,
        rank=env.rank,
        world_size=env.world_size,
        timeout=datetime.timedelta(seconds=collective_timeout_s),
    )


def own_output(
    stack: contextlib.ExitStack,
    directory: str | os.PathLike,
    env: DistributedEnv,
    uri: str = "",
    lease_timeout_s: float = 0.0,
) -> lease.StoreLease | None:
    """Rank 0 owns `directory` (bertdist.ownership) and the checkpoint store `uri`, if any (bertdist.lease:
    a URL's lease is returned, for the uploads to check before they publish), until `stack` closes; when
    another run owns either, every rank stops with the same line."""
    if not env.is_main:
        return None
    try:
        stack.enter_context(ownership.owned(directory))
        if uri and not storage.is_url(uri):
            stack.enter_context(ownership.owned(uri))
        elif uri:
            return stack.enter_context(lease.leased(uri, os.fspath(directory), lease_timeout_s))
    except (ownership.DirectoryBusyError, lease.LeaseBusyError) as e:
        _refuse_for_all_ranks(env, str(e))
        raise
    return None


_REFUSAL_KEY = "bertdist/refused"
_REFUSAL_SEEN_KEY = "bertdist/refusal_seen"


def _refuse_for_all_ranks(env: DistributedEnv, message: str, timeout_s: float = 30.0) -> None:
    """Rank 0 cannot start the job (its output directory is another run's): tell the other ranks through the
    rendezvous, so that each stops with the same line at once instead of waiting out the rendezvous timeout
    for a rank 0 that is gone. Serves the store until every rank has connected, at most `timeout_s`; does
    nothing alone, or when the port is not free (the ranks then time out as for a missing rank 0)."""
    import time

    import torch.distributed as dist

    if env.world_size == 1:
        return
    try:
        if _agent_store():
            store = dist.TCPStore(
                env.master_addr, env.master_port, None, is_master=False, timeout=datetime.timedelta(seconds=timeout_s)
            )
        else:
            store = dist.TCPStore(
                env.master_addr,
                env.master_port,
                None,
                is_master=True,
                wait_for_workers=False,
                timeout=datetime.timedelta(seconds=timeout_s),
                master_listen_fd=_listening_socket(env.master_addr, env.master_port),
            )
    except (dist.DistError, OSError):
        return
    store.set(_REFUSAL_KEY, message)
    deadline = time.monotonic() + timeout_s
    while store.add(_REFUSAL_SEEN_KEY, 0) < env.world_size - 1 and time.monotonic() < deadline:
        time.sleep(0.2)


def _agent_store() -> bool:
    """Under torchrun the store is its agent's, already listening on MASTER_PORT; the ranks are its clients."""
    return os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"


def _listening_socket(addr: str, port: int) -> int:
    """A socket listening on `addr`:`port` only, for rank 0's store; its file descriptor, owned by the store.

    torch's TCPStore listens on every interface of the host, and anyone who reaches that port can read and
    write the store (it has no authentication), which for a run on one host with MASTER_ADDR=127.0.0.1 means
    every machine on the network. Binding to the master address keeps a one-host run on loopback and a
    multi-host one on the interface the ranks use (docs/reliability.md: keep it on a private network).
    torchrun's agent hosts its own store on every interface before any rank starts, which bertdist cannot
    change: under torchrun the ranks use that one.
    """
    last: OSError | None = None
    candidates = socket.getaddrinfo(addr.strip("[]"), port, type=socket.SOCK_STREAM)
    for family, kind, proto, _, sockaddr in sorted(candidates, key=lambda c: c[0] != socket.AF_INET):
        sock = socket.socket(family, kind, proto)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(sockaddr)
            sock.listen(1024)
        except OSError as e:
            sock.close()
            last = e
            continue
        return sock.detach()
    assert last is not None
    raise last


def lost_peer(error: BaseException) -> bool:
    """A collective failed because a peer is gone (killed, crashed, its host lost), not because of a bug."""
    import torch.distributed as dist

    text = str(error)
    return isinstance(error, dist.DistError) or any(
        words in text
        for words in (
            "Connection closed by peer",
            "Connection reset by peer",
            "Broken pipe",
            "NCCL communicator was aborted",
        )
    )


def destroy_process_group() -> None:
    """End torch.distributed (if it was started) and put back the launcher variables `init_process_group` set."""
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()
    groups = sys.modules.get("deepspeed.utils.groups")
    if groups is not None:  # DeepSpeed keeps clones of the world group; a later run in this process needs new ones
        groups._release_process_group_references(group=None)
    _restore_env()
