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
