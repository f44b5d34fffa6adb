"""Where DeepSpeed's ops are built (`bertdist.train.extensions`): in the environment that holds DeepSpeed unless
TORCH_EXTENSIONS_DIR says otherwise, and never behind a build lock that nobody holds."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from bertdist.train import extensions

# What torch's FileBaton does while it builds: create the lock exclusively, keep it open, remove it when done.
BUILDER = """
import os, sys, time
fd = os.open(sys.argv[1], os.O_CREAT | os.O_EXCL)
print("holding", flush=True)
time.sleep(float(sys.argv[2]))
os.close(fd)
time.sleep(float(sys.argv[3]) if len(sys.argv) > 3 else 0)
os.remove(sys.argv[1])
"""


@pytest.fixture
def lock(tmp_path, monkeypatch) -> Path:
    """The lock path of an op's build directory under a TORCH_EXTENSIONS_DIR of the test's own."""
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    monkeypatch.setattr(extensions, "POLL_S", 0.05)
    monkeypatch.setattr(extensions, "UNHELD_S", 0.5)
    (tmp_path / "deepspeed_shm_comm").mkdir()
    return tmp_path / "deepspeed_shm_comm" / "lock"


def test_the_ops_are_built_in_the_environment_that_holds_deepspeed(monkeypatch):
    monkeypatch.delenv("TORCH_EXTENSIONS_DIR", raising=False)
    expected = Path(sys.prefix).resolve() / "var" / "torch_extensions"  # the suite's environment holds DeepSpeed
    assert extensions.installation_directory() == expected
    assert extensions.prepare() == expected and os.environ["TORCH_EXTENSIONS_DIR"] == str(expected)


def test_an_environment_linking_to_this_ones_deepspeed_builds_in_its_own(tmp_path):
    """Its build commands name the linked paths, so sharing this environment's directory made each side rebuild
    the op the other had built (the GPU check's smoke does this: benchmarks/gpu_machine.py)."""
    import venv

    import deepspeed

    linked = tmp_path / "env"
    venv.create(linked, with_pip=False, symlinks=True)
    site = linked / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
    (site / "deepspeed").symlink_to(Path(deepspeed.__file__).parent)
    code = "from bertdist.train import extensions; print(extensions.installation_directory())"
    env = {k: v for k, v in os.environ.items() if k != "TORCH_EXTENSIONS_DIR"}
    done = subprocess.run(
        [str(linked / "bin" / "python"), "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        env={**env, "PYTHONPATH": str(Path(extensions.__file__).parents[2])},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert Path(done.stdout.strip()) == linked.resolve() / "var" / "torch_extensions"


def test_a_directory_the_user_chose_is_kept(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    assert extensions.prepare() == tmp_path and os.environ["TORCH_EXTENSIONS_DIR"] == str(tmp_path)


def test_a_read_only_environment_builds_in_a_cache_folder_of_its_own(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(extensions, "_writable", lambda directory: False)
    directory = extensions.installation_directory()
    assert directory.parent == tmp_path / "torch_extensions"  # not the folder every environment shares
    assert directory.name.startswith(f"py{sys.version_info.major}{sys.version_info.minor}-")


def test_a_lock_no_process_holds_is_removed_and_said_in_one_line(lock):
    lock.touch()
    said = []
    extensions.prepare(said.append)
    assert not lock.exists()
    assert len(said) == 1 and str(lock) in said[0] and "stale" in said[0], said


def test_a_build_in_progress_is_waited_for_not_broken(lock):
    """Another rank's build holds the lock: it is waited for (one line naming the process), and released by
    its builder, which would fail removing a lock someone else had removed."""
    builder = subprocess.Popen([sys.executable, "-c", BUILDER, str(lock), "1.0"], stdout=subprocess.PIPE, text=True)
    assert builder.stdout.readline() == "holding\n"
    said = []
    started = time.monotonic()
    extensions.prepare(said.append)
    assert builder.wait(timeout=10) == 0 and time.monotonic() - started > 0.5
    assert len(said) == 1 and f"process {builder.pid}" in said[0] and str(lock) in said[0], said


def test_a_lock_its_builder_has_closed_but_not_yet_removed_is_left_to_the_builder(lock, monkeypatch):
    """torch's builder closes its lock, then removes it: a lock seen unheld in that gap (widened here to 0.2 s)
    is not stale, and taking it would fail the builder's own removal (seen in CI as a false 'stale' line).
    The builder holds the lock for 1 s, so that `prepare` sees it held even on a loaded machine, and a lock is
    stale after 1 s unheld, five times the gap."""
    monkeypatch.setattr(extensions, "UNHELD_S", 1.0)
    builder = subprocess.Popen(
        [sys.executable, "-c", BUILDER, str(lock), "1.0", "0.2"], stdout=subprocess.PIPE, text=True
    )
    assert builder.stdout.readline() == "holding\n"
    said = []
    extensions.prepare(said.append)
    assert builder.wait(timeout=10) == 0
    assert len(said) == 1 and "stale" not in said[0] and f"process {builder.pid}" in said[0], said


def test_a_build_holding_its_lock_too_long_stops_the_run_in_one_line(lock):
    fd = os.open(lock, os.O_CREAT | os.O_EXCL)
    try:
        old = time.time() - extensions.BUILD_TIMEOUT_S - 1
        os.utime(lock, (old, old))
        with pytest.raises(extensions.ExtensionBuildError) as raised:
            extensions.prepare(print)
    finally:
        os.close(fd)
    assert (
        "\n" not in str(raised.value)
        and f"process {os.getpid()}" in str(raised.value)
        and str(lock) in str(raised.value)
    )


def test_on_a_shared_filesystem_an_unheld_lock_is_stale_only_once_older_than_any_build(lock, monkeypatch):
    """No process here holds it, but one on another host mounting the same directory may. (A build is taken
    to last 2 s here, long enough that a loaded machine's first look still finds the lock younger.)"""
    monkeypatch.setattr(extensions, "_host_local", lambda directory: False)
    monkeypatch.setattr(extensions, "BUILD_TIMEOUT_S", 2.0)
    lock.touch()
    said = []
    waiter = threading.Thread(target=extensions.prepare, args=(said.append,))
    waiter.start()
    deadline = time.monotonic() + 10
    while not said and time.monotonic() < deadline:
        time.sleep(0.01)
    assert lock.exists() and len(said) == 1 and "another host" in said[0], said
    waiter.join(timeout=15)
    assert not lock.exists() and len(said) == 2 and "stale" in said[1], said


def test_the_holders_of_a_file_are_the_processes_that_have_it_open(tmp_path):
    path = tmp_path / "lock"
    path.touch()
    assert extensions.holders_of(path) == []
    with path.open():
        assert extensions.holders_of(path) == [os.getpid()]


@pytest.mark.parametrize(
    ("given", "want"),
    [("9.0a", "9.0"), ("8.0 9.0a;10.0f+PTX", "8.0;9.0;10.0+PTX"), ("9.0;9.0a", "9.0"), ("7.5;8.6+PTX", "7.5;8.6+PTX")],
)
def test_the_arch_list_deepspeed_builds_from_has_no_architecture_suffix(monkeypatch, given, want):
    """DeepSpeed's JIT builder fails on '9.0a' (int('0a')): FusedAdam did not build on an H200 that named it."""
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", given)
    extensions.plain_arch_list()
    assert os.environ["TORCH_CUDA_ARCH_LIST"] == want


@pytest.fixture
def packaged() -> str:
    binary = extensions._packaged_ninja()
    if binary is None:
        pytest.skip("no ninja distribution installed")
    return binary


def test_every_build_finds_the_packaged_ninja_first(tmp_path, monkeypatch, packaged):
    """The install built with the system's ninja (PATH without the virtual environment) and a run started from
    .venv/bin with pip's: its newer build log made torch rebuild the op (~3 minutes, silently); the wheel's
    environment, which borrows the suite's packages, did the same to the suite's runs. prepare() puts a folder
    holding only a link to the ninja distribution's binary first, once; a link left to another binary is
    replaced."""
    import shutil

    links = tmp_path / ".ninja"
    links.mkdir()
    (links / "ninja").symlink_to("/nonexistent/ninja")
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    monkeypatch.setenv("PATH", os.pathsep.join(["/usr/bin", str(links), "/bin", ""]))
    extensions.prepare()
    found = shutil.which("ninja")
    assert os.path.realpath(found) == packaged and Path(found).parent == links
    assert os.environ["PATH"].split(os.pathsep) == [str(links), "/usr/bin", "/bin"]
    assert os.listdir(links) == ["ninja"]


def test_a_folder_it_cannot_write_leaves_path_as_it_was(tmp_path, monkeypatch, packaged):
    monkeypatch.setattr(extensions.shutil, "which", lambda name: None)  # whatever this machine has on PATH
    monkeypatch.setenv("PATH", "/usr/bin")
    monkeypatch.setattr(Path, "mkdir", lambda self, **kwargs: (_ for _ in ()).throw(PermissionError(13, "denied")))
    extensions.packaged_ninja_first(tmp_path / "read-only")
    assert os.environ["PATH"] == "/usr/bin"


def _environment(tmp_path: Path, links: list[Path]) -> tuple[Path, Path]:
    """A virtual environment with `links` in its site-packages, and that site-packages."""
    import venv

    env = tmp_path / "env"
    venv.create(env, with_pip=False, symlinks=True)
    site = env / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
    for target in links:
        (site / target.name).symlink_to(target)
    return env, site


FIND_NINJA = (
    "import os, shutil\n"
    "from bertdist.train import extensions\n"
    "os.environ['PATH'] = '/usr/bin:/bin'\n"
    "extensions.packaged_ninja_first(extensions.Path(os.environ['ROOT']))\n"
    "print(os.path.realpath(shutil.which('ninja')))\n"
)


@pytest.mark.parametrize("how", ["pth entry", "links"])
def test_an_environment_borrowing_the_packages_builds_with_their_ninja(tmp_path, packaged, how):
    """The wheel's environment of the suite reaches this one's packages through a .pth entry, the GPU check's
    smoke environment through links: the ninja package's own BIN_DIR is empty in both (it looks beside the
    running interpreter), and the link's record names a binary beside the link."""
    import importlib.metadata

    repo = Path(extensions.__file__).parents[2]
    record = next(f for f in importlib.metadata.distribution("ninja").files if f.name == "RECORD")
    dist_info = Path(os.path.realpath(record.locate())).parent
    env, site = _environment(tmp_path, [dist_info] if how == "links" else [])
    ours = [p for p in sys.path if p.endswith("site-packages")] if how == "pth entry" else []
    (site / "borrowed.pth").write_text("\n".join([*ours, str(repo)]) + "\n")
    done = subprocess.run(
        [str(env / "bin" / "python"), "-c", FIND_NINJA],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "ROOT": str(tmp_path / "root")},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == packaged
