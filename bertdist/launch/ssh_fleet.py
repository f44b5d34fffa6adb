"""The hosts of a DeepSpeed hostfile as an elastic fleet: probed over SSH, each launch DeepSpeed's own.

Each launch runs launch/multinode_hostfile.sh (DeepSpeed's launcher, pdsh over SSH) on a hostfile of just
the hosts chosen for it, in its own session; its output goes to the job log line by line, and pdsh's
`HOST: ssh exited with exit code N` lines give each host's exit code. Hosts whose line is missing ended
with 0 (pdsh reports failures only).

Ranks are found on a host (in its network namespace, see `_pkill`) by their command line,
`-m bertdist train --config <this job's config>`: the config file is the job's own (runs/jobs/<unique stem>.yaml),
so the pattern names this job's ranks and nothing else, not even DeepSpeed's per-host launcher or the SSH
sessions that carry it (whose command lines hold `--module bertdist train`). Stopping sends SIGTERM to those
ranks (they checkpoint and exit 75); killing sends SIGKILL. Every host name comes from the hostfile, checked by
`parse_hostfile`.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from bertdist.launch.checks import parse_hostfile
from bertdist.launch.secret_env import carried_secrets, write_secrets
from bertdist.processes import sigterm_when_i_die

_PDSH_EXIT = re.compile(r"pdsh@\S+: (\S+): ssh exited with exit code (\d+)")


def ranks_pattern(config_file: str) -> str:
    """An extended regular expression (pkill -f) matching this job's rank processes only.

    Characters other than letters, digits and `_/@=,` are bracketed, so the path is literal, and the
    leading `[-]` keeps the pattern from matching the shell that carries it to the host.
    """
    literal = "".join(
        c if c.isalnum() or c in "_/@=," else f"[{c}]" for c in f"m bertdist train --config {config_file}"
    )
    return f"[-]{literal}"


class SshFleet:
    def __init__(
        self, hostfile: str, config_file: str, launch_script: str, master_port: int, stem: Path, probe_timeout_s: int
    ):
        self.slots = parse_hostfile(hostfile)
        self.launch_script = launch_script
        self.timeout_s = probe_timeout_s
        self.config_file = str(Path(config_file).resolve())
        self.master_port = master_port
        self.stem = stem
        """Path prefix of this job's files (runs/jobs/<stem>): each launch writes <stem>.hosts-<n>."""
        self.launches = 0
        self.secrets = carried_secrets(os.environ)
        self.secrets_file = Path(f"{stem}.secrets")
        """The secrets DeepSpeed would have put on the pdsh command line (bertdist.launch.secret_env)."""
        if self.secrets:
            write_secrets(self.secrets_file, self.secrets)

    def close(self) -> None:
        """The job is over: its secrets file goes."""
        self.secrets_file.unlink(missing_ok=True)

    def hosts(self) -> list[str]:
        return list(self.slots)

    def probe(self, hosts: list[str]) -> dict[str, str]:
        if not hosts:
            return {}
        with ThreadPoolExecutor(max_workers=min(64, len(hosts))) as pool:
            answers = dict(zip(hosts, pool.map(lambda h: _ssh(h, "true", self.timeout_s), hosts)))
        return {h: why for h, why in answers.items() if why}

    def clean(self, host: str) -> None:
        _ssh(host, _pkill("KILL", ranks_pattern(self.config_file)), self.timeout_s)

    def launch(self, hosts: list[str], ranks_per_host: int, trainer_args: list[str]) -> "SshAttempt":
        self.launches += 1
        hostfile = Path(f"{self.stem}.hosts-{self.launches}")
        hostfile.write_text("".join(f"{h} slots={ranks_per_host}\n" for h in hosts))
        env = {
            **{k: v for k, v in os.environ.items() if k not in self.secrets},
            "HOSTFILE": str(hostfile),
            "NUM_NODES": str(len(hosts)),
            "GPUS_PER_NODE": str(ranks_per_host),
            "MASTER_ADDR": hosts[0],
            "MASTER_PORT": str(self.master_port),
            "PYTHON": sys.executable,
        }
        carried = ["--secrets-file", str(self.secrets_file.resolve())] if self.secrets else []
        command = ["bash", self.launch_script, "--config", self.config_file, *carried, *trainer_args]
        return SshAttempt(hosts, command, env, ranks_pattern(self.config_file), self.timeout_s)


class SshAttempt:
    def __init__(self, hosts: list[str], command: list[str], env: dict[str, str], pattern: str, timeout_s: int):
        self.hosts, self.pattern, self.timeout_s = hosts, pattern, timeout_s
        self.codes: dict[str, int] = {}
        # Its own session: a signal to the supervisor's process group must not reach DeepSpeed's launcher,
        # which would kill the ranks at once; the supervisor stops them itself, with a checkpoint.
        self.proc = subprocess.Popen(
            command,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=sigterm_when_i_die(),  # the supervisor SIGKILLed: the launch stops too, not left unwatched
        )
        self.reader = threading.Thread(target=self._relay, daemon=True)
        self.reader.start()

    def _relay(self) -> None:
        """Copy the launch's output to the job log; note each host's exit code from pdsh."""
        for raw in self.proc.stdout:
            line = raw.decode("utf-8", errors="replace")
            sys.stdout.write(line)
            sys.stdout.flush()
            match = _PDSH_EXIT.search(line)
            if match and match.group(1) in self.hosts:
                self.codes[match.group(1)] = int(match.group(2))

    def wait(self, timeout_s: float) -> dict[str, int] | None:
        try:
            code = self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return None
        self.reader.join(timeout=10)
        if code and not self.codes:  # the launcher itself failed (no host was reached): every host's code
            return {h: code for h in self.hosts}
        return {h: self.codes.get(h, 0) for h in self.hosts}

    def request_stop(self) -> None:
        self._signal_ranks("TERM")

    def kill(self) -> None:
        self._signal_ranks("KILL")
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)  # the launcher, pdsh and the SSH sessions on this machine
        except ProcessLookupError:
            pass
        self.proc.wait()
        self.reader.join(timeout=10)

    def _signal_ranks(self, name: str) -> None:
        command = _pkill(name, self.pattern)
        with ThreadPoolExecutor(max_workers=min(64, len(self.hosts))) as pool:
            list(pool.map(lambda h: _ssh(h, command, self.timeout_s), self.hosts))


def pkill_argv(signal_name: str, pattern: str, namespace_of: str) -> list[str]:
    """pkill of the processes matching `pattern` in the network namespace of process `namespace_of`: a host
    is an address, and the processes behind one share its namespace (containers on one machine, and the
    test suite's hosts, share a process table but not a network namespace)."""
    return ["pkill", f"-{signal_name}", "--ns", namespace_of, "--nslist", "net", "-f", pattern]


def _pkill(signal_name: str, pattern: str) -> str:
    """`pkill_argv` as the command line an SSH session runs, in the namespace of its own shell ($$)."""
    return " ".join(a if a == "$$" else shlex.quote(a) for a in pkill_argv(signal_name, pattern, "$$")) + "; true"


def _ssh(host: str, command: str, timeout_s: int) -> str:
    """Run `command` on `host`; '' if it worked, else why not (one line)."""
    argv = ["ssh", "-o", "BatchMode=yes", "-o", f"ConnectTimeout={timeout_s}", host, command]
    try:
        result = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout_s + 5)
    except subprocess.TimeoutExpired:
        return f"ssh {host}: no answer in {timeout_s + 5} s"
    except FileNotFoundError:
        return "ssh: not found"
    if result.returncode:
        return (result.stderr.strip().splitlines() or [f"ssh exited with {result.returncode}"])[-1][:200]
    return ""
