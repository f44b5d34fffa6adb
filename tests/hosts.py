"""Two separate network hosts on one machine, for the multi-host tests: two network namespaces joined by
a veth pair, each with its own address and an `sshd` that accepts a key made here.

Each namespace's end of the pair is named `bd0`, so one GLOO_SOCKET_IFNAME serves every rank. The
addresses are in 10.231.0.0/16, derived from the pid; tests address only these two and 127.0.0.1. The
namespaces share this machine's file system, as the hosts of a cluster share a network file system.
Everything started inside a namespace is killed when it is removed. Needs root, `ip` (iproute2), sshd
(openssh-server) and pdsh: `scripts/setup_hosts.sh` installs them; without them the tests skip, saying why.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

IFNAME = "bd0"
SKIP_FILE = Path(tempfile.gettempdir()) / "bertdist-hosts-unavailable"


def unavailable() -> str | None:
    """Why separate hosts cannot be made here, or None."""
    if os.geteuid() != 0:
        return f"network namespaces need root (uid {os.geteuid()})"
    if SKIP_FILE.exists():
        return SKIP_FILE.read_text().strip()
    missing = [tool for tool in ("ip", "pdsh", "ssh", "ssh-keygen") if shutil.which(tool) is None]
    missing += [] if Path("/usr/sbin/sshd").exists() else ["/usr/sbin/sshd"]
    return f"missing {', '.join(missing)} (scripts/setup_hosts.sh installs them)" if missing else None


@dataclass(frozen=True)
class Host:
    namespace: str
    address: str

    def command(self, argv: list[str]) -> list[str]:
        """`argv` run inside this host's network namespace."""
        return ["ip", "netns", "exec", self.namespace, *argv]


class TwoHosts:
    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        tag = f"{os.getpid() % 100000}"
        subnet = f"10.231.{os.getpid() % 250}"
        self.hosts = [Host(f"bdhost{tag}{n}", f"{subnet}.{n + 1}") for n in range(2)]
        self.ssh_config = workdir / "ssh_config"
        self.bin = workdir / "bin"  # `ssh` that reads ssh_config: DeepSpeed's ssh check and pdsh call plain `ssh`
        try:
            self._network(tag)
            self._ssh()
        except BaseException:
            self.remove()
            raise

    def _network(self, tag: str) -> None:
        a, b = (h.namespace for h in self.hosts)
        for ns in (a, b):
            _run("ip", "netns", "add", ns)
        _run("ip", "link", "add", f"bdv{tag}a", "type", "veth", "peer", "name", f"bdv{tag}b")
        for host, end in zip(self.hosts, (f"bdv{tag}a", f"bdv{tag}b")):
            _run("ip", "link", "set", end, "netns", host.namespace)
            _run(*host.command(["ip", "link", "set", end, "name", IFNAME]))
            _run(*host.command(["ip", "addr", "add", f"{host.address}/24", "dev", IFNAME]))
            _run(*host.command(["ip", "link", "set", IFNAME, "up"]))
            _run(*host.command(["ip", "link", "set", "lo", "up"]))

    def _ssh(self) -> None:
        key = self.workdir / "id_ed25519"
        _run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key))
        (self.workdir / "authorized_keys").write_text(Path(f"{key}.pub").read_text())
        Path("/run/sshd").mkdir(exist_ok=True)  # sshd's privilege separation directory
        for host in self.hosts:
            host_key = self.workdir / f"host_key_{host.namespace}"
            _run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(host_key))
            config = self.workdir / f"sshd_config_{host.namespace}"
            config.write_text(
                f"ListenAddress {host.address}\nPort 22\nHostKey {host_key}\n"
                f"PidFile {self.workdir}/sshd_{host.namespace}.pid\n"
                f"AuthorizedKeysFile {self.workdir}/authorized_keys\nPermitRootLogin prohibit-password\n"
                "PasswordAuthentication no\nKbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\n"
            )
            _run(
                *host.command(
                    ["/usr/sbin/sshd", "-f", str(config), "-E", str(self.workdir / f"sshd_{host.namespace}.log")]
                )
            )
        self.ssh_config.write_text(
            "Host 10.231.*\n"
            f"  IdentityFile {key}\n  IdentitiesOnly yes\n  StrictHostKeyChecking no\n  UserKnownHostsFile /dev/null\n"
            "  BatchMode yes\n  LogLevel ERROR\n  ConnectTimeout 10\n"
        )
        self.bin.mkdir(exist_ok=True)
        wrapper = self.bin / "ssh"
        wrapper.write_text(f'#!/bin/sh\nexec /usr/bin/ssh -F {self.ssh_config} "$@"\n')
        wrapper.chmod(0o755)
        deadline = time.monotonic() + 30
        for host in self.hosts:  # sshd daemonizes before it listens
            while subprocess.run(
                self.hosts[0].command([str(wrapper), host.address, "true"]), capture_output=True
            ).returncode:
                if time.monotonic() > deadline:
                    raise AssertionError(
                        f"sshd on {host.address} does not accept the test key: "
                        f"{(self.workdir / f'sshd_{host.namespace}.log').read_text()[-2000:]}"
                    )
                time.sleep(0.2)

    def env(self, **extra: str) -> dict[str, str]:
        """This environment with the ssh wrapper first on PATH."""
        return {**os.environ, "PATH": f"{self.bin}{os.pathsep}{os.environ.get('PATH', '')}", **extra}

    def remove(self) -> None:
        """Kill everything running in the namespaces (SIGKILL also ends stopped processes), then remove them."""
        for host in self.hosts:
            pids = subprocess.run(
                ["ip", "netns", "pids", host.namespace], capture_output=True, text=True
            ).stdout.split()
            for pid in pids:
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except (ProcessLookupError, ValueError):
                    pass
            subprocess.run(["ip", "netns", "del", host.namespace], capture_output=True)


def _run(*argv: str) -> None:
    result = subprocess.run(list(argv), capture_output=True, text=True, timeout=60)
    if result.returncode != 0:
        raise AssertionError(f"{' '.join(argv)} failed: {result.stderr.strip()[-1000:]}")


def kill_processes_mentioning(marker: str) -> None:
    """End every process whose command line contains `marker`, and their descendants (TERM, then KILL).

    For Ray, whose `ray stop` ends every Ray on the machine: a session's processes all name its temp dir.
    """
    table = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                ppid = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            table[int(entry)] = (ppid, cmdline)
    ours = {pid for pid, (_, cmd) in table.items() if marker in cmd and pid != os.getpid()}
    grew = True
    while grew:
        children = {pid for pid, (ppid, _) in table.items() if ppid in ours} - ours
        ours |= children
        grew = bool(children)
    for sig, grace_s in ((signal.SIGTERM, 3.0), (signal.SIGKILL, 2.0)):
        for pid in ours:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline and any(_alive(pid) for pid in ours):
            time.sleep(0.2)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


@contextlib.contextmanager
def ray_cluster(
    two: TwoHosts, env: dict[str, str], head_cpus: int, worker_cpus: int, port: int = 6380
) -> Iterator[str]:
    """A Ray head in the first host and a worker node in the second (both started with `env`, which their
    workers inherit); yields the head's address. Everything is stopped after, without touching other Rays."""
    ray_cli = str(Path(sys.executable).parent / "ray")
    head, worker = two.hosts
    temp_dirs = [Path(f"/tmp/bdray-{host.namespace}") for host in two.hosts]  # short: Ray's socket paths
    try:
        for host, temp_dir, extra in (
            (head, temp_dirs[0], ["--head", f"--port={port}", "--include-dashboard=false", f"--num-cpus={head_cpus}"]),
            (worker, temp_dirs[1], [f"--address={head.address}:{port}", f"--num-cpus={worker_cpus}"]),
        ):
            started = subprocess.run(
                host.command(
                    [
                        ray_cli,
                        "start",
                        *extra,
                        f"--node-ip-address={host.address}",
                        f"--temp-dir={temp_dir}",
                        "--disable-usage-stats",
                    ]
                ),
                env=env,
                capture_output=True,
                text=True,
                timeout=240,
            )
            assert started.returncode == 0, started.stdout[-2000:] + started.stderr[-2000:]
        yield f"{head.address}:{port}"
    finally:
        for temp_dir in temp_dirs:
            kill_processes_mentioning(str(temp_dir))
            subprocess.run(["rm", "-rf", str(temp_dir)], check=False)
