"""What user-supplied values may reach a shell, a batch script or a command line, and the templates they fill.

Everything that reaches a script is checked here against a strict, anchored, ASCII-only pattern first, and
then quoted with shlex.quote by the backend; commands run as argv lists, never through `shell=True`.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from bertdist.errors import UserError

_HOST_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
HOST_RE = re.compile(rf"(?=.{{1,253}}$){_HOST_LABEL}(?:\.{_HOST_LABEL})*", re.ASCII)
JOB_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}", re.ASCII)
JOB_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}", re.ASCII)
PATH_RE = re.compile(r"[A-Za-z0-9_./+@=,][A-Za-z0-9_./+@=,-]*", re.ASCII)
SLURM_NAME_RE = re.compile(r"[A-Za-z0-9_.-]{1,64}", re.ASCII)
TIME_RE = re.compile(r"(\d{1,3}):([0-5]\d):([0-5]\d)", re.ASCII)
OVERRIDE_KEY_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z0-9_]+)*", re.ASCII)
RAY_ADDRESS_RE = re.compile(rf"https?://{HOST_RE.pattern}(?::\d{{1,5}})?/?", re.ASCII)
_RULES = {
    "host": "a host name or IPv4 address",
    "job name": "1-64 letters, digits, '_', '.', '-', starting with a letter or digit",
    "job id": "letters, digits, '_', '.', '-'",
    "path": "letters, digits and _ . / + @ = , - (no spaces or shell characters), not starting with '-'",
    "slurm name": "1-64 letters, digits, '_', '.', '-'",
    "time": "HH:MM:SS, e.g. 24:00:00",
    "override key": "key.sub=value with a dotted key of letters, digits and '_'",
    "ray address": "the HTTP address of the Ray dashboard, e.g. http://127.0.0.1:8265",
}


def check_remote_paths(problems: list[str], jobs_dir: str) -> None:
    """The working directory and the resolved jobs dir, which a batch script (an #SBATCH line no quoting
    protects) or DeepSpeed's pdsh runner (`cd {cwd}; ... --config {jobs_dir}/...`, unquoted, on every host) put
    into a shell on the job's nodes."""
    check(problems, "working directory", os.getcwd(), PATH_RE, "path")
    check(problems, "--jobs-dir (resolved)", jobs_dir, PATH_RE, "path")


class SubmitError(UserError, ValueError):
    """A job that cannot be submitted as asked, or a job that cannot be found; one problem per line."""

    def __init__(self, problems: list[str] | str):
        self.problems = [problems] if isinstance(problems, str) else list(problems)
        super().__init__(
            "\n".join(self.problems)
            if len(self.problems) == 1
            else "cannot submit:\n" + "\n".join(f"  - {p}" for p in self.problems)
        )


def check(problems: list[str], what: str, value: str, pattern: re.Pattern, rule: str) -> str:
    """Record a problem unless `value` matches `pattern` entirely; return the value either way."""
    if not pattern.fullmatch(value):
        problems.append(f"{what}: {value!r} is not allowed ({_RULES[rule]})")
    return value


def check_job_id(job_id: str) -> str:
    """A job id as typed by the user; it names a file under runs/jobs/, so no path may hide in it."""
    problems: list[str] = []
    check(problems, "job id", job_id, JOB_ID_RE, "job id")
    if problems:
        raise SubmitError(problems)
    return job_id


def time_limit_seconds(text: str) -> int:
    match = TIME_RE.fullmatch(text)
    if not match:
        raise SubmitError(f"--time: {text!r} is not allowed ({_RULES['time']})")
    hours, minutes, seconds = (int(g) for g in match.groups())
    return hours * 3600 + minutes * 60 + seconds


def printable(problems: list[str], what: str, value: str) -> str:
    """Free text that is quoted into a command line still may not carry newlines or control characters."""
    if any(ord(c) < 32 or ord(c) == 127 for c in value):
        problems.append(f"{what}: {value!r} contains a control character or newline")
    return value


def parse_hostfile(path: str) -> dict[str, int]:
    """A DeepSpeed hostfile (`host slots=N` per line, # comments) as {host: slots}, every host checked."""
    try:
        lines = Path(path).read_text().splitlines()
    except OSError as e:
        raise SubmitError(f"--hostfile {path}: cannot read ({e.strerror})") from None
    except UnicodeDecodeError as e:
        raise SubmitError(
            f"--hostfile {path}: not UTF-8 text (byte {e.start}); a hostfile is `host slots=N` lines"
        ) from None
    hosts: dict[str, int] = {}
    problems: list[str] = []
    for number, line in enumerate(lines, 1):
        text = line.split("#", 1)[0].strip()
        if not text:
            continue
        match = re.fullmatch(r"(\S+)\s+slots=(\d+)", text)
        if not match:
            problems.append(f"--hostfile {path}:{number}: expected 'hostname slots=N', got {line.strip()!r}")
            continue
        host, slots = match.group(1), int(match.group(2))
        check(problems, f"--hostfile {path}:{number}: host", host, HOST_RE, "host")
        if host in hosts:
            problems.append(f"--hostfile {path}:{number}: host {host} is listed twice")
        if slots < 1:
            problems.append(f"--hostfile {path}:{number}: slots must be at least 1, got {slots}")
        hosts[host] = slots
    if not hosts and not problems:
        problems.append(f"--hostfile {path}: names no host")
    if problems:
        raise SubmitError(problems)
    return hosts


def render_template(text: str, values: dict[str, str], source: str = "template") -> str:
    """Fill `{{name}}` fields. Every field must have a value and every value a field: a typo in a template
    or a renamed field fails here, not as a literal `{{...}}` inside a job. A line that is only a field
    whose value is empty disappears (optional #SBATCH directives)."""
    fields = set(re.findall(r"\{\{(\w+)\}\}", text))
    missing, unused = fields - values.keys(), values.keys() - fields
    if missing or unused:
        raise SubmitError(
            f"{source}: fields without a value: {sorted(missing)}; values without a field: {sorted(unused)}"
        )
    lines = [
        line
        for line in text.splitlines(keepends=True)
        if not (re.fullmatch(r"\{\{(\w+)\}\}\n?", line) and not values[line.strip()[2:-2]])
    ]
    return re.sub(r"\{\{(\w+)\}\}", lambda m: values[m.group(1)], "".join(lines))
