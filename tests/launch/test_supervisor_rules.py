"""The supervisor's rules over more hosts than this machine can make (tests/launch/test_elastic.py runs it over
two real hosts): which node count it takes when hosts are lost, when it gives up, and what it never retries.
The fleet is a script of exit codes and probe answers, standing in for hosts that cannot exist here; the
Supervisor, its config and its state file are the real ones."""

from __future__ import annotations

import io
import json

from bertdist.config import load_config
from bertdist.launch.elastic import Supervisor

HOSTS = ["h1", "h2", "h3", "h4"]


class ScriptedFleet:
    """Each launch ends at once with the next scripted exit codes; `down` hosts fail every probe."""

    def __init__(self, outcomes: list[dict[str, int]], down: set[str] = frozenset()):
        self.outcomes, self.down, self.launched, self.cleaned = list(outcomes), set(down), [], []

    def hosts(self) -> list[str]:
        return list(HOSTS)

    def probe(self, hosts: list[str]) -> dict[str, str]:
        return {h: "scripted: down" for h in hosts if h in self.down}

    def clean(self, host: str) -> None:
        self.cleaned.append(host)

    def launch(self, hosts: list[str], ranks_per_host: int, trainer_args: list[str]):
        self.launched.append((list(hosts), list(trainer_args)))
        codes = self.outcomes.pop(0)
        return _Ended({h: codes.get(h, 1) for h in hosts})


class _Ended:
    def __init__(self, codes: dict[str, int]):
        self.codes = codes

    def wait(self, timeout_s: float) -> dict[str, int]:
        return self.codes

    def request_stop(self) -> None:
        pass

    def kill(self) -> None:
        pass


def _supervisor(tmp_path, fleet: ScriptedFleet, *overrides: str) -> tuple[Supervisor, io.StringIO]:
    cfg = load_config(
        "bert-tiny",
        [
            f"train.output_dir={tmp_path / 'out'}",
            "data.phases.0.micro_batch_size=8",
            "launch.nodes=4",
            "launch.gpus_per_node=1",
            "launch.restart_backoff_s=0",
            "launch.host_probe_interval_s=0.01",
            *overrides,
        ],
    )
    out = io.StringIO()
    return Supervisor(cfg, fleet, tmp_path / "state.json", out), out


def test_a_node_count_that_cannot_keep_the_global_batch_is_skipped_for_a_smaller_one(tmp_path):
    """Global batch 32, micro batch 8, one rank per node: 4 and 2 nodes divide it, 3 does not. One of four
    hosts lost: the job continues on two, at gradient accumulation 2 instead of 1."""
    fleet = ScriptedFleet([{"h1": 1, "h2": 1, "h3": 1, "h4": 137}, {"h1": 0, "h2": 0}])
    supervisor, out = _supervisor(tmp_path, fleet, "launch.min_nodes=1")
    assert supervisor.node_counts == [1, 2, 4]
    assert supervisor.run() == 0, out.getvalue()
    assert [hosts for hosts, _ in fleet.launched] == [HOSTS, ["h1", "h2"]]
    assert "restart 1: lost h4: its ranks were killed (exit code 137); world size 4 -> 2" in out.getvalue()
    relaunch_args = fleet.launched[1][1]
    assert relaunch_args[0] == "checkpoint.resume=auto" and relaunch_args[1] == "--restart-event"
    state = json.loads((tmp_path / "state.json").read_text())
    assert state["state"] == "succeeded" and state["world_size"] == 2 and state["lost_hosts"] == ["h4"]


def test_no_node_count_left_that_keeps_the_batch_stops_naming_the_field(tmp_path):
    fleet = ScriptedFleet([{"h1": 1, "h2": 1, "h3": 1, "h4": 137}])
    supervisor, out = _supervisor(tmp_path, fleet, "launch.min_nodes=3")
    assert supervisor.run() == 1
    (line,) = [ln for ln in out.getvalue().splitlines() if "stopping:" in ln]
    assert (
        "3 node(s): train.global_batch_size: 32 is not divisible by data.phases.0.micro_batch_size x world size" in line
    )


def test_stalls_are_relaunched_until_max_restarts(tmp_path):
    fleet = ScriptedFleet([{h: 75 for h in HOSTS}] * 3)
    supervisor, out = _supervisor(tmp_path, fleet, "launch.max_restarts=2")
    assert supervisor.run() == 1
    assert len(fleet.launched) == 3 and "launch.max_restarts=2 time(s) already" in out.getvalue()


def test_bad_input_and_a_failed_run_are_not_retried(tmp_path):
    for codes, exit_code in (({h: 2 for h in HOSTS}, 2), ({h: 1 for h in HOSTS}, 1)):
        fleet = ScriptedFleet([codes])
        supervisor, out = _supervisor(tmp_path, fleet)
        assert supervisor.run() == exit_code and len(fleet.launched) == 1, out.getvalue()


def test_hosts_that_do_not_answer_at_the_start_are_left_out_down_to_min_nodes(tmp_path):
    fleet = ScriptedFleet([{"h1": 0, "h2": 0}], down={"h3"})
    supervisor, out = _supervisor(tmp_path, fleet, "launch.min_nodes=2")
    assert supervisor.run() == 0
    assert (
        fleet.launched[0][0] == ["h1", "h2"] and "h3 does not answer (scripted: down): leaving it out" in out.getvalue()
    )


class _Ticking:
    """A launch that runs: each wait() is one probe interval; `events` are what each interval brings (None,
    a checkpoint's step, or the ranks' exit codes); asked to stop, the ranks exit 75 at the next wait."""

    def __init__(self, world: "TickFleet", hosts: list[str], events: list):
        self.world, self.hosts, self.events, self.codes = world, hosts, list(events), None

    def wait(self, timeout_s: float) -> dict[str, int] | None:
        if self.codes is None and timeout_s > 0:
            self.world.tick += 1
            event = self.events.pop(0) if self.events else None
            if isinstance(event, int):
                self.world.checkpoint = f"step_{event:08d}"
            elif event is not None:
                self.codes = event
        return self.codes

    def request_stop(self) -> None:
        self.codes = self.codes or {h: 75 for h in self.hosts}
        self.world.stops += 1

    def kill(self) -> None:
        self.codes = self.codes or {h: 137 for h in self.hosts}


class TickFleet(ScriptedFleet):
    """Hosts whose answers follow the clock (`down(host, tick)`); launch i plays `script[i]`'s events."""

    def __init__(self, hosts: list[str], script: list[list], down=lambda host, tick: False):
        super().__init__([])
        self.all, self.script, self.down_at = hosts, list(script), down
        self.tick, self.stops, self.checkpoint = 0, 0, ""

    def hosts(self) -> list[str]:
        return list(self.all)

    def probe(self, hosts: list[str]) -> dict[str, str]:
        return {h: "scripted: down" for h in hosts if self.down_at(h, self.tick)}

    def launch(self, hosts: list[str], ranks_per_host: int, trainer_args: list[str]):
        self.launched.append((list(hosts), list(trainer_args)))
        return _Ticking(self, hosts, self.script.pop(0))


def _ticking(tmp_path, monkeypatch, fleet: TickFleet, *overrides: str) -> tuple[Supervisor, io.StringIO, list]:
    from bertdist.launch import elastic

    monkeypatch.setattr(elastic, "_latest_checkpoint", lambda cfg: fleet.checkpoint)
    supervisor, out = _supervisor(tmp_path, fleet, "launch.readmit_after_s=0", *overrides)
    slept: list[float] = []
    supervisor._sleep = slept.append
    return supervisor, out, slept


def test_ranks_that_finished_as_a_host_went_down_end_the_job_succeeded(tmp_path, monkeypatch):
    """The second failed probe of h2 came as every rank had exited 0: the launch was killed, taken for a lost
    host, and the job ended failed (or relaunched a finished run)."""
    done = {h: 0 for h in HOSTS[:2]}

    class Finishing(_Ticking):
        def wait(self, timeout_s):
            return done if self.world.tick >= 2 else super().wait(timeout_s)

    fleet = TickFleet(HOSTS[:2], [[None] * 10], down=lambda h, t: h == "h2" and t >= 1)
    fleet.launch = lambda hosts, n, args: fleet.launched.append(hosts) or Finishing(fleet, hosts, [None] * 10)
    supervisor, out, _ = _ticking(tmp_path, monkeypatch, fleet, "launch.nodes=2")
    assert supervisor.run() == 0, out.getvalue()
    assert json.loads((tmp_path / "state.json").read_text())["state"] == "succeeded"


def test_a_launch_that_wrote_checkpoints_before_failing_backs_off_no_longer(tmp_path, monkeypatch):
    """The backoff doubled at every failure although each launch had checkpointed: only a checkpoint of the last
    probe interval counted as progress."""
    fleet = TickFleet(
        HOSTS,
        [[1000 * (i + 1), None, {"h1": 1, "h2": 1, "h3": 1, "h4": 137}] for i in range(3)]
        + [[dict.fromkeys(HOSTS, 0)]],
    )
    supervisor, out, slept = _ticking(tmp_path, monkeypatch, fleet, "launch.min_nodes=1", "launch.restart_backoff_s=10")
    assert supervisor.run() == 0, out.getvalue()
    assert slept == [] and "backing off" not in out.getvalue()


def test_a_host_that_sat_a_launch_out_counts_toward_growing_back(tmp_path, monkeypatch):
    """h4 lost, 3 nodes do not keep the batch: the job went on 2 with h3 answering, unused and unsaid; h4 back
    made 4 with h3, but only lost hosts were counted and the job never grew back."""
    grow = [1, 2, 3, 4, 5, 6]
    fleet = TickFleet(HOSTS, [[{"h1": 1, "h2": 1, "h3": 1, "h4": 137}], grow, [dict.fromkeys(HOSTS, 0)]])
    supervisor, out, _ = _ticking(tmp_path, monkeypatch, fleet, "launch.min_nodes=1")
    assert supervisor.run() == 0, out.getvalue()
    assert [hosts for hosts, _ in fleet.launched] == [HOSTS, ["h1", "h2"], HOSTS]
    assert "h3 answer(s) but sit this launch out: 3 node(s): train.global_batch_size: 32 is not divisible" in (
        out.getvalue()
    )


def test_growing_back_is_left_when_it_would_take_the_last_relaunch(tmp_path, monkeypatch):
    """max_restarts=1, spent on h2's loss: h2 answering again stopped the healthy ranks to grow back, and the
    relaunch was refused: the job ended failed. It finishes on h1."""
    fleet = TickFleet(HOSTS[:2], [[{"h1": 1, "h2": 137}], [1, 2, 3, {"h1": 0}]])
    supervisor, out, _ = _ticking(
        tmp_path, monkeypatch, fleet, "launch.nodes=2", "launch.min_nodes=1", "launch.max_restarts=1"
    )
    assert supervisor.run() == 0, out.getvalue()
    assert fleet.stops == 0 and [hosts for hosts, _ in fleet.launched] == [["h1", "h2"], ["h1"]]


def test_a_host_lost_again_waits_twice_as_long_to_be_taken_back(tmp_path, monkeypatch):
    """A flapping host was readmitted after the same wait each time: every cycle cost two relaunches until
    max_restarts ended a job the other hosts could have carried."""
    from bertdist.launch import elastic

    supervisor, _ = _supervisor(tmp_path, ScriptedFleet([]), "launch.readmit_after_s=60", "launch.min_nodes=1")
    monkeypatch.setattr(elastic.time, "monotonic", lambda: 1000.0)
    supervisor.away = {"h4": 1000.0 - 90}  # answering for 90 s
    for losses, ready in ((1, ["h4"]), (2, []), (3, [])):
        supervisor.losses = {"h4": losses}
        assert supervisor._ready_to_return(running=3) == ready, losses
