"""The elastic supervisor: a multi-host job that continues on the hosts it has left, and grows back.

    python -m bertdist.launch.elastic --config JOB.yaml --hostfile HOSTS --state-file JOB.elastic.json \
        --launch-script launch/multinode_hostfile.sh
    # what `bertdist submit --backend deepspeed` runs, detached, on the submitting machine

One loop, whatever starts the ranks (a `Fleet`: SSH hosts from a hostfile here, Ray nodes in
`bertdist.launch.ray_job`):

1. probe every host; take the first ones that answer, as many as `launch.nodes`, and never a number of nodes
   whose world size cannot keep the global batch (validation, as at submit: gradient accumulation rises as
   nodes go, and a micro batch that no longer divides the batch is refused, so a smaller count is taken);
2. launch the ranks on them (a relaunch with `checkpoint.resume=auto`: the newest verified checkpoint,
   resharded to the new world size by the trainer, with the epoch's position kept);
3. watch: the ranks' exit codes, and every host probed each `launch.host_probe_interval_s`;
   - a host that fails two probes in a row, or whose ranks were killed (an exit code of 128 or more: a
     signal, or SSH losing the host), is lost: the others are stopped (killed: their collectives are
     broken anyway) and the job is relaunched without it, after `launch.restart_backoff_s` (doubling after
     each failure that brought no new checkpoint);
   - ranks that stopped for a stall (the trainer's watchdog) or a preemption (exit 75) are relaunched on the
     hosts that still answer; a bad input (exit 2) or a failed run (exit 1 on every host: non-finite loss)
     ends the job, as a relaunch would fail the same way;
   - a lost host that has answered every probe for `launch.readmit_after_s` is taken back (`grow_back`):
     the ranks are asked to stop (SIGTERM: they finish the step, checkpoint and exit 75), and the job is
     relaunched with it: the next checkpoint is the one it asks for, so no step is redone;
4. fewer hosts than `launch.min_nodes`, or more than `launch.max_restarts` relaunches: one line naming the
   reason and the last checkpoint, and the job ends (exit 1).

Every change is one line in the job log, the state (hosts, world size, restarts, events) is in the state
file that `bertdist status` reads, and the relaunched trainer records the event in the MLflow run
(`bertdist.train.restart_event`). Work redone after a failure is at most one checkpoint interval.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TextIO

from bertdist import storage
from bertdist.config import Config, ConfigError, load_config, validate
from bertdist.errors import FAILED_EXIT_CODE, OK_EXIT_CODE, REQUEUE_EXIT_CODE, USAGE_EXIT_CODE, UserError
from bertdist.launch.fleet import Attempt, Fleet
from bertdist.train.restart_event import RestartEvent

PROBES_TO_LOSE = 2
"""Failed probes in a row that lose a host: one can be a dropped packet, two at the probe interval are not."""
MAX_BACKOFF_S = 600.0


@dataclass
class _Outcome:
    kind: str
    """done, failed (end the job), lost (relaunch without `hosts`), retry (relaunch on what answers), grow."""
    reason: str
    hosts: list[str] = field(default_factory=list)
    exit_code: int = OK_EXIT_CODE


class Supervisor:
    def __init__(self, cfg: Config, fleet: Fleet, state_file: str | Path, out: TextIO | None = None):
        self.cfg, self.fleet, self.state_file, self.out = cfg, fleet, Path(state_file), out or sys.stdout
        lc = cfg.launch
        self.ranks_per_host = lc.gpus_per_node
        self.node_counts = [
            n for n in range(lc.fewest_nodes(), lc.nodes + 1) if not batch_problems(cfg, n * lc.gpus_per_node)
        ]
        self.restarts = 0
        self.events: list[dict] = []
        self.away: dict[str, float] = {}
        """Lost hosts, and since when each has answered every probe (0: it does not answer)."""
        self.failed_probes: dict[str, int] = {}
        self.losses: dict[str, int] = {}
        """How often each host was lost: its wait before being taken back doubles each time (a flapping host)."""
        self.idle: list[str] = []
        """Hosts that answer but sat out the launch (their number would not keep the global batch); they count
        toward growing back as a returning host does."""
        self.checkpoint = (_latest_checkpoint(cfg), time.time())
        self.stop_signal = 0

    # --- the loop ----------------------------------------------------------------------------------
    def run(self) -> int:
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1):
            signal.signal(sig, self._on_signal)
        stopped: tuple[_Outcome, int, float] | None = None  # what ended the last launch, its world size, when
        failures_in_a_row = 0
        while not self.stop_signal:
            hosts, why_not = self._choose()
            if not hosts:
                return self._give_up(why_not)
            trainer_args: list[str] = []
            if stopped is not None:
                self.restarts += 1
                outcome, world_before, stopped_at = stopped
                event = RestartEvent(
                    restart=self.restarts,
                    reason=outcome.reason,
                    world_size_before=world_before,
                    world_size=len(hosts) * self.ranks_per_host,
                    hosts=hosts,
                    stopped_at_step=_last_logged_step(self.cfg),
                    resumed_step=_step_of(self.checkpoint[0]),
                    checkpoint_seen_at=self.checkpoint[1],
                    stopped_at=stopped_at,
                )
                self.events.append(asdict(event))
                self.say(event.line())
                trainer_args = ["checkpoint.resume=auto", "--restart-event", event.encode()]
            self._save_state("running", hosts)
            self.say(
                f"launching {len(hosts) * self.ranks_per_host} rank(s) on {len(hosts)} host(s): {', '.join(hosts)}"
            )
            launched_from = self.checkpoint[0]
            outcome = self._watch(self.fleet.launch(hosts, self.ranks_per_host, trainer_args), hosts)
            if outcome.kind in ("done", "failed"):
                self._save_state("succeeded" if outcome.kind == "done" else "failed", hosts)
                self.say(
                    f"done after {self.restarts} restart(s)"
                    if outcome.kind == "done"
                    else f"stopping: {outcome.reason}; last checkpoint: {self._checkpoint_name()}"
                )
                return outcome.exit_code
            if self.stop_signal:
                break
            if self.restarts >= self.cfg.launch.max_restarts:
                self._save_state("failed", hosts)
                self.say(
                    f"stopping: {outcome.reason}, and the job has been relaunched launch.max_restarts="
                    f"{self.cfg.launch.max_restarts} time(s) already; last checkpoint: {self._checkpoint_name()}"
                )
                return FAILED_EXIT_CODE
            for host in outcome.hosts:
                self.away.setdefault(host, 0.0)
                self.losses[host] = self.losses.get(host, 0) + 1
            stopped = (outcome, len(hosts) * self.ranks_per_host, time.time())
            self._refresh_checkpoint()
            progressed = self.checkpoint[0] != launched_from  # checkpoints the watch loop saw count too
            failures_in_a_row = 0 if outcome.kind == "grow" or progressed else failures_in_a_row + 1
            if failures_in_a_row:
                backoff_s = min(MAX_BACKOFF_S, self.cfg.launch.restart_backoff_s * 2 ** (failures_in_a_row - 1))
                self.say(
                    f"{outcome.reason}; backing off {backoff_s:.0f} s "
                    f"({failures_in_a_row} failure(s) in a row without a new checkpoint)"
                )
                self._sleep(backoff_s)
        self._save_state("stopped", [])
        self.say(
            f"stopped by signal {self.stop_signal}; last checkpoint: {self._checkpoint_name()} "
            "(submit again with --resume auto to continue)"
        )
        return REQUEUE_EXIT_CODE

    def _watch(self, attempt: Attempt, hosts: list[str]) -> _Outcome:
        interval_s = self.cfg.launch.host_probe_interval_s
        waiting_from: str | None = None  # hosts to take back: the checkpoint after which they are
        while True:
            codes = attempt.wait(interval_s)
            if codes is not None:
                return self._classify(codes, hosts, asked_to_stop=False)
            if self.stop_signal:
                attempt.request_stop()
                return self._classify(self._stopped(attempt, hosts), hosts, asked_to_stop=True)
            self._refresh_checkpoint()
            lost = self._probe(hosts)
            if lost:
                codes = attempt.wait(0)  # the ranks may have finished as the host went: a finished job is done
                if codes is not None:
                    return self._classify(codes, hosts, asked_to_stop=False)
                attempt.kill()
                return _Outcome("lost", "; ".join(f"lost {h}: {why}" for h, why in lost.items()), list(lost))
            # Growing back costs a relaunch: only while one is left after it for a failure on the larger world
            back = self._ready_to_return(len(hosts)) if self.restarts + 1 < self.cfg.launch.max_restarts else []
            if not back:
                waiting_from = None
                continue
            if waiting_from is None:  # taken back at the next checkpoint: the launch's work so far is kept
                waiting_from = self.checkpoint[0]
                self.say(f"{', '.join(back)} answer(s) again: taking them back at the next checkpoint")
            if self.checkpoint[0] == waiting_from:
                continue
            for host in back:
                self.fleet.clean(host)  # ranks of an earlier launch that were cut off with the host
                self.away.pop(host, None)
                self.failed_probes[host] = 0
            self.say(f"checkpoint {self.checkpoint[0]} written: asking the ranks to stop at the next step to grow back")
            attempt.request_stop()
            outcome = self._classify(self._stopped(attempt, hosts), hosts, asked_to_stop=True)
            return (
                _Outcome("grow", f"{', '.join(back)} answer(s) again: growing back")
                if outcome.kind == "retry"
                else outcome
            )

    def _stopped(self, attempt: Attempt, hosts: list[str]) -> dict[str, int]:
        """The exit codes of ranks asked to stop, killed after launch.stop_timeout_s (128 + SIGKILL if even
        that is not seen within a minute)."""
        codes = attempt.wait(self.cfg.launch.stop_timeout_s)
        if codes is None:
            self.say(
                f"the ranks did not stop within launch.stop_timeout_s={self.cfg.launch.stop_timeout_s:g} s: "
                "killing them"
            )
            attempt.kill()
            codes = attempt.wait(60) or {h: 128 + signal.SIGKILL for h in hosts}
        return codes

    def _classify(self, codes: dict[str, int], hosts: list[str], asked_to_stop: bool) -> _Outcome:
        """What the ranks' exit codes mean for the job (see the module docstring)."""
        if all(code == OK_EXIT_CODE for code in codes.values()):
            return _Outcome("done", "finished")
        killed = {} if asked_to_stop else {h: c for h, c in codes.items() if c >= 128 or c < 0}
        lost = {
            **{h: f"its ranks were killed (exit code {c})" for h, c in killed.items()},
            **self._probe(hosts, probes=PROBES_TO_LOSE),
        }
        if lost:
            return _Outcome("lost", "; ".join(f"lost {h}: {why}" for h, why in lost.items()), list(lost))
        if any(code == USAGE_EXIT_CODE for code in codes.values()):
            return _Outcome(
                "failed", "the trainer refused its input (exit 2, the reason is above)", exit_code=USAGE_EXIT_CODE
            )
        if any(code == REQUEUE_EXIT_CODE for code in codes.values()) or asked_to_stop:
            return _Outcome("retry", "the ranks stopped with a checkpoint (a stall, or asked to)")
        worst = max(codes.values())
        return _Outcome(
            "failed", f"the run failed (exit codes {codes}; the reason is above)", exit_code=worst or FAILED_EXIT_CODE
        )

    # --- hosts -------------------------------------------------------------------------------------
    def _choose(self) -> tuple[list[str], str]:
        """The hosts of the next launch, or [] and why there are not enough."""
        candidates = [h for h in self.fleet.hosts() if h not in self.away]
        down = self.fleet.probe(candidates)
        for host, why in down.items():
            self.say(f"{host} does not answer ({why}): leaving it out")
            self.away[host] = 0.0
        answering = [h for h in candidates if h not in down]
        counts = [n for n in self.node_counts if n <= len(answering)]
        if counts:
            used, self.idle = answering[: counts[-1]], answering[counts[-1] : max(self.node_counts)]
            if self.idle:
                n = len(used) + len(self.idle)
                self.say(
                    f"{', '.join(self.idle)} answer(s) but sit this launch out: {n} node(s): "
                    f"{batch_problems(self.cfg, n * self.cfg.launch.gpus_per_node)[0]}"
                )
            return used, ""
        lc = self.cfg.launch
        if len(answering) >= lc.fewest_nodes():
            skipped = [n for n in range(lc.fewest_nodes(), len(answering) + 1) if n not in self.node_counts]
            return [], "; ".join(f"{n} node(s): {batch_problems(self.cfg, n * lc.gpus_per_node)[0]}" for n in skipped)
        return [], (
            f"{len(answering)} host(s) answer ({', '.join(answering) or 'none'}), fewer than launch.min_nodes="
            f"{lc.fewest_nodes()}"
        )

    def _probe(self, hosts: list[str], probes: int = 1) -> dict[str, str]:
        """Hosts that have now failed PROBES_TO_LOSE probes in a row (`probes` more are made here), and why."""
        why: dict[str, str] = {}
        for _ in range(probes):
            down = self.fleet.probe(hosts)
            for host in hosts:
                self.failed_probes[host] = self.failed_probes.get(host, 0) + 1 if host in down else 0
            why.update(down)
        return {h: f"does not answer ({why[h]})" for h in hosts if self.failed_probes[h] >= PROBES_TO_LOSE}

    def _ready_to_return(self, running: int) -> list[str]:
        """Lost hosts that have answered for launch.readmit_after_s (doubled for each time the host was lost
        before), with the hosts that sat the launch out and still answer, when taking them adds nodes."""
        lc = self.cfg.launch
        if not (self.away or self.idle) or not lc.grow_back:
            return []
        now = time.monotonic()
        down = self.fleet.probe([*self.away, *self.idle])
        for host, since in self.away.items():
            self.away[host] = 0.0 if host in down else (since or now)
        ready = [
            h
            for h, since in self.away.items()
            if since and now - since >= lc.readmit_after_s * 2 ** (self.losses.get(h, 1) - 1)
        ] + [h for h in self.idle if h not in down]
        return ready if [n for n in self.node_counts if running < n <= running + len(ready)] else []

    # --- reporting ---------------------------------------------------------------------------------
    def _give_up(self, why: str) -> int:
        self._save_state("failed", [])
        self.say(
            f"stopping: {why}; last checkpoint: {self._checkpoint_name()} (intact; submit again with "
            "--resume auto when enough hosts are back)"
        )
        return FAILED_EXIT_CODE

    def _refresh_checkpoint(self) -> bool:
        """Note a new checkpoint and when it was first seen; True if there is one."""
        tag = _latest_checkpoint(self.cfg)
        if tag != self.checkpoint[0]:
            self.checkpoint = (tag, time.time())
            return True
        return False

    def _checkpoint_name(self) -> str:
        return self.checkpoint[0] or "none"

    def _save_state(self, state: str, hosts: list[str]) -> None:
        self.state_file.parent.mkdir(parents=True, exist_ok=True)
        storage.write_json(
            self.state_file,
            {
                "state": state,
                "hosts": hosts,
                "world_size": len(hosts) * self.ranks_per_host,
                "restarts": self.restarts,
                "lost_hosts": sorted(self.away),
                "events": self.events,
            },
            indent=2,
        )

    def say(self, text: str) -> None:
        print(f"bertdist elastic: {time.strftime('%H:%M:%S')} {text}", file=self.out, flush=True)

    def _on_signal(self, signum: int, _frame) -> None:
        self.stop_signal = signum

    def _sleep(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline and not self.stop_signal:
            time.sleep(min(1.0, deadline - time.monotonic()))


def elastic_summary(state_file: str) -> str:
    """`bertdist status`'s words for an elastic job's state file ('' when there is none to read)."""
    try:
        state = json.loads(Path(state_file).read_text()) if state_file else None
    except (OSError, ValueError):
        return ""
    if not state:
        return ""
    events = state.get("events") or []
    last = f"; last: {events[-1]['reason']}" if events else ""
    lost = f"; lost: {', '.join(state['lost_hosts'])}" if state.get("lost_hosts") else ""
    hosts = ", ".join(state["hosts"]) or "no host"
    return f"; world size {state['world_size']} on {hosts}; {state['restarts']} restart(s){last}{lost}"


def batch_problems(cfg: Config, world_size: int) -> list[str]:
    """Why `cfg` cannot run on `world_size` ranks (the global batch does not split), or []."""
    try:
        validate(cfg, world_size=world_size, check_files=False)
    except ConfigError as e:
        return e.problems
    return []


def _latest_checkpoint(cfg: Config) -> str:
    """The tag the job would resume from (the store's `latest` with checkpoint.uri), or ''."""
    from bertdist.train import checkpoint, remote

    try:
        if cfg.checkpoint.uri:
            return remote.latest_in_store(cfg.checkpoint.uri) or ""
        found = checkpoint.latest(checkpoint.checkpoints_dir(cfg.train.output_dir))
        return found.name if found else ""
    except (UserError, OSError):  # a marker being replaced, a store that does not answer: known again next time
        return ""


def _step_of(tag: str) -> int:
    return int(tag.split("_")[1]) if tag else 0


def _last_logged_step(cfg: Config) -> int:
    """The last step in the run's metrics.jsonl (rank 0 appends one line per log interval), or -1."""
    from bertdist.train.console import METRICS_FILENAME

    path = Path(cfg.train.output_dir) / METRICS_FILENAME
    try:
        with open(path, "rb") as f:
            f.seek(max(0, path.stat().st_size - 65536))
            lines = f.read().decode("utf-8", errors="replace").splitlines()
    except OSError:
        return -1
    for line in reversed(lines):
        try:
            return int(json.loads(line)["step"])
        except (ValueError, KeyError, TypeError):
            continue
    return -1


def main(argv: list[str] | None = None) -> int:
    from bertdist.launch.ssh_fleet import SshFleet

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", required=True, help="the job's resolved config (written by bertdist submit)")
    parser.add_argument("--hostfile", required=True, help="DeepSpeed hostfile: every host the job may use")
    parser.add_argument("--state-file", required=True, help="JSON state for `bertdist status`")
    parser.add_argument("--launch-script", required=True, help="what starts each launch: launch/multinode_hostfile.sh")
    args = parser.parse_args(argv)
    try:
        cfg = load_config(args.config, [])
        # A probe waits as long as the probe interval, 2 to 10 s: a host too busy to accept SSH in 10 s is not well.
        timeout_s = int(min(10, max(2, cfg.launch.host_probe_interval_s)))
        fleet = SshFleet(
            args.hostfile,
            args.config,
            args.launch_script,
            cfg.launch.master_port,
            Path(args.state_file).with_suffix(""),
            timeout_s,
        )
        try:
            return Supervisor(cfg, fleet, args.state_file).run()
        finally:
            fleet.close()
    except UserError as e:
        print(f"bertdist elastic: {e}", file=sys.stderr)
        return USAGE_EXIT_CODE


if __name__ == "__main__":
    sys.exit(main())
