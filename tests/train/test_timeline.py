"""bertdist.train.timeline: a launch's time counts from its process's start, as the forecast's start-up does."""

import subprocess
import sys


def test_a_launch_counts_its_time_from_the_process_start_not_from_the_trainer():
    """The forecast's start-up is its calibration process's whole wall time less what it timed; the run's time
    was counted from the trainer's build, after its imports, process group and engine (4.6 s on a tiny run)."""
    code = (
        "import time; time.sleep(1.5)\n"
        "from bertdist.train.timeline import process_started\n"
        "print(time.monotonic() - process_started())"
    )
    ran_s = float(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)
    assert 1.5 <= ran_s < 60, ran_s
