"""Rank layout from each launcher's environment, and SLURM node-list expansion."""

from __future__ import annotations

import pytest

from bertdist.train.distributed import LaunchEnvironmentError, expand_nodelist, read_env


def test_no_launcher_is_a_single_local_rank():
    env = read_env({})
    assert (env.rank, env.world_size, env.local_rank, env.master_addr, env.launcher) == (0, 1, 0, "127.0.0.1", "none")
    assert env.is_main and env.nodes == 1


def test_torchrun_and_deepspeed_launcher_variables():
    env = read_env(
        {
            "RANK": "5",
            "WORLD_SIZE": "16",
            "LOCAL_RANK": "5",
            "MASTER_ADDR": "node1",
            "MASTER_PORT": "1234",
            "LOCAL_WORLD_SIZE": "8",
        }
    )
    assert (env.rank, env.world_size, env.local_rank, env.master_addr, env.master_port) == (5, 16, 5, "node1", 1234)
    assert env.nodes == 2 and env.launcher == "torchrun"
    assert read_env({"RANK": "1", "WORLD_SIZE": "4", "LOCAL_SIZE": "2"}).nodes == 2  # deepspeed launcher's name


def test_slurm_variables_take_the_first_host_as_master():
    env = read_env(
        {
            "SLURM_PROCID": "9",
            "SLURM_NTASKS": "16",
            "SLURM_LOCALID": "1",
            "SLURM_NODELIST": "gpu[07-08]",
            "SLURM_TASKS_PER_NODE": "8(x2)",
        },
        default_port=29600,
    )
    assert (env.rank, env.world_size, env.local_rank, env.master_addr, env.master_port) == (9, 16, 1, "gpu07", 29600)
    assert env.nodes == 2 and env.launcher == "slurm"


def test_torchrun_variables_win_over_the_outer_slurm_allocation():
    env = read_env({"RANK": "3", "WORLD_SIZE": "4", "SLURM_PROCID": "0", "SLURM_NTASKS": "1", "SLURM_NODELIST": "a"})
    assert (env.rank, env.world_size, env.launcher) == (3, 4, "torchrun")


@pytest.mark.parametrize(
    "environ, message",
    [
        ({"RANK": "4", "WORLD_SIZE": "4"}, "not within world size"),
        ({"RANK": "x", "WORLD_SIZE": "4"}, "RANK='x' is not an integer"),
        ({"WORLD_SIZE": "4"}, "RANK is not set"),
        ({"RANK": "0", "WORLD_SIZE": "2", "MASTER_PORT": "70000"}, "not a TCP port"),
    ],
)
def test_bad_launcher_environment_is_named(environ, message):
    with pytest.raises(LaunchEnvironmentError, match=message):
        read_env(environ)


@pytest.mark.parametrize(
    "nodelist, hosts",
    [
        ("node1", ["node1"]),
        ("gpu[01-03,07],login1", ["gpu01", "gpu02", "gpu03", "gpu07", "login1"]),
        ("a[8-10]", ["a8", "a9", "a10"]),
        ("rack[1-2]-n[01-02]", ["rack1-n01", "rack1-n02", "rack2-n01", "rack2-n02"]),
    ],
)
def test_expand_nodelist(nodelist, hosts):
    assert expand_nodelist(nodelist) == hosts


@pytest.mark.parametrize("nodelist", ["gpu[01-", "gpu[a-b]", ""])
def test_bad_nodelist_is_an_error(nodelist):
    with pytest.raises(LaunchEnvironmentError):
        expand_nodelist(nodelist)


def test_a_process_group_leaves_no_launcher_variables_behind(monkeypatch):
    """In-process runs (tests, notebooks) and jobs submitted afterwards must not inherit RANK/MASTER_PORT."""
    import os

    from bertdist.train.distributed import DistributedEnv, destroy_process_group, init_process_group
    from bertdist.train.ports import free_tcp_port

    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("MASTER_PORT", "12345")
    init_process_group(DistributedEnv(0, 1, 0, "127.0.0.1", free_tcp_port(), "none"), "gloo", rendezvous_timeout_s=10)
    assert os.environ["RANK"] == "0" and os.environ["MASTER_PORT"] != "12345"
    destroy_process_group()
    assert "RANK" not in os.environ and "WORLD_SIZE" not in os.environ and os.environ["MASTER_PORT"] == "12345"


def test_a_chosen_port_is_outside_the_range_connections_take_theirs_from(monkeypatch):
    """A port from the ephemeral range can be taken by any outgoing connection before rank 0 binds it (a CI
    run lost its rendezvous that way); one outside the range cannot. Seeding `random`, as every run does,
    does not make two processes choose alike."""
    import random

    from bertdist.train import ports

    first, last = ports._ephemeral_ports()
    if first <= ports.LOWEST_CHOSEN_PORT and last >= 65535:
        pytest.skip(f"this kernel hands out every port from {first} up")
    chosen = []
    for _ in range(10):
        random.seed(0)
        chosen.append(ports.free_tcp_port())
    assert all(ports.LOWEST_CHOSEN_PORT <= p < first or p > last for p in chosen), chosen
    assert len(set(chosen)) > 1, chosen
    monkeypatch.setattr(ports, "_ephemeral_ports", lambda: (1024, 65535))  # no room outside: port 0's choice
    assert 1024 <= ports.free_tcp_port() <= 65535


def _listening_addresses(port: int) -> list[str]:
    """Local addresses (hex, as /proc/net/tcp{,6} write them) of the sockets listening on `port`."""
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in open(table).read().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            address, hex_port = local.rsplit(":", 1)
            if state == "0A" and int(hex_port, 16) == port:  # 0A: LISTEN
                found.append(address)
    return found


def test_the_rendezvous_store_listens_on_the_master_address_only(monkeypatch):
    """torch's TCPStore listens on every interface, unauthenticated; a run with MASTER_ADDR=127.0.0.1 must not."""
    from bertdist.train.distributed import DistributedEnv, destroy_process_group, init_process_group
    from bertdist.train.ports import free_tcp_port

    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "TORCHELASTIC_USE_AGENT_STORE"):
        monkeypatch.delenv(name, raising=False)
    port = free_tcp_port()
    init_process_group(DistributedEnv(0, 1, 0, "127.0.0.1", port, "none"), "gloo", rendezvous_timeout_s=10)
    try:
        assert _listening_addresses(port) == ["0100007F"]  # 127.0.0.1, and nothing on 0.0.0.0 or [::]
    finally:
        destroy_process_group()


def test_a_process_no_launcher_started_says_it_trains_alone_when_the_config_plans_more():
    from bertdist.train.distributed import unlaunched_note

    alone = read_env({})
    note = unlaunched_note(alone, 2)
    assert "trains on 1 rank, not the 2 that launch.nodes x launch.gpus_per_node plan" in note and "\n" not in note
    assert unlaunched_note(alone, 1) == ""
    assert unlaunched_note(read_env({"RANK": "0", "WORLD_SIZE": "1"}), 2) == ""  # a launcher chose one rank
