"""bertdist as a user gets it: a wheel installed in a fresh virtual environment, used from a directory
outside the checkout. The README's main command runs there (shortened: 20 steps instead of 1,000),
`bertdist submit --dry-run` renders a job for every backend, the run's dashboard opens in a real headless
Chromium in MLflow's training view with the loss charts first, and the exported model is the run's MLflow
Model and answers a fill-mask query.

What is not fresh, and why: the new environment borrows its dependencies (torch, deepspeed, ray, mlflow,
transformers: gigabytes) from the repository's environment through a .pth path entry, because CI has no
time to install them twice. bertdist itself comes only from the wheel: `pip install --no-deps WHEEL`, and
the test checks that `import bertdist` resolves inside the new environment. A .pth path entry does not run
the repository environment's own .pth files, so its editable bertdist stays invisible.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from bertdist.tracking.store import local_store_uri
from tests import browser
from tests.conftest import REPO

pytestmark = pytest.mark.slow
DEMO_STEPS = 20
SHIPPED = ("launch", "configs", "cluster")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    build = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out), str(REPO)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert build.returncode == 0, build.stderr[-3000:]
    (path,) = out.glob("bertdist-*.whl")
    return path


@pytest.fixture(scope="module")
def venv(wheel, tmp_path_factory) -> Path:
    """A new virtual environment with the wheel installed; returns its bin/ directory."""
    root = tmp_path_factory.mktemp("venv") / "env"
    subprocess.run([sys.executable, "-m", "venv", str(root)], check=True, timeout=300)
    python = root / "bin" / "python"
    purelib = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    ours = [p for p in sys.path if p.endswith("site-packages")]
    Path(purelib, "bertdist_test_dependencies.pth").write_text("\n".join(ours) + "\n")
    install = subprocess.run(
        [python, "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(wheel)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert install.returncode == 0, install.stderr[-3000:]
    return root / "bin"


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("user")


def run(
    venv: Path, workdir: Path, *argv: str, timeout: float = 300, accelerator: str | None = "cpu", **kwargs
) -> subprocess.CompletedProcess:
    """`argv` in the wheel's environment, from `workdir`; `accelerator` None: DS_ACCELERATOR unset, as a user has it."""
    env = {**os.environ, "PATH": f"{venv}:{os.environ['PATH']}", "PYTHONNOUSERSITE": "1"}
    env.pop("PYTHONPATH", None)
    env.pop("DS_ACCELERATOR", None)
    if accelerator:
        env["DS_ACCELERATOR"] = accelerator
    return subprocess.run(
        [str(venv / argv[0]), *argv[1:]],
        cwd=workdir,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        **kwargs,
    )


@pytest.fixture(scope="module")
def demo(venv, workdir) -> Path:
    # One fine-tuning epoch per start instead of three: the two fine-tunings were two thirds of the demo's time here.
    done = run(
        venv,
        workdir,
        *("bertdist", "demo", "--output", "runs/demo", "--steps", str(DEMO_STEPS), "--downstream-epochs", "1"),
        timeout=1200,
        accelerator=None,  # unset, as a user has it: DeepSpeed's import warned on the console that it chose the CPU
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    model_dir = (workdir / "runs" / "demo" / "model").resolve()
    assert "MLM accuracy (held-out)" in done.stdout and f"model (Hugging Face format): {model_dir}" in done.stdout
    # A quiet first run: the libraries' chatter is in the log, not on the console.
    console = done.stdout + done.stderr
    for chatter in (
        "[INFO]",
        "[WARNING]",
        "Processing zero checkpoint",
        "Token authentication",
        "UserWarning",
        "\x1b[",
        "\n\n\n",
    ):
        assert chatter not in console, f"{chatter!r} on the demo's console:\n{console[-3000:]}"
    assert "Processing zero checkpoint" in (workdir / "runs" / "demo" / "demo.log").read_text()
    assert (
        "    pretrained: epoch 1/1" in done.stdout and "    random init: epoch 1/1" in done.stdout
    )  # not minutes silent
    dashboard = (
        next(line for line in done.stdout.splitlines() if "dashboard: " in line)
        .split("dashboard: ")[1]
        .split("   (")[0]
    )
    assert dashboard.startswith(str(venv.parent)), dashboard  # runs as printed, without activating the venv
    # The fill-mask command as printed, from another directory (it held a relative model path).
    fill_mask = shlex.split(next(line for line in done.stdout.splitlines() if "fill-mask" in line))
    answered = subprocess.run(
        fill_mask,
        cwd=venv.parent,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    assert answered.returncode == 0 and "'token_str'" in answered.stdout, answered.stderr[-3000:]
    return workdir / "runs" / "demo"


def test_the_wheel_carries_every_subpackage_and_the_shipped_directories(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    packages = {str(p.relative_to(REPO)) for p in (REPO / "bertdist").rglob("__init__.py")}
    assert packages <= names, f"subpackages missing from pyproject.toml's list: {sorted(packages - names)}"
    tracked = subprocess.run(
        ["git", "ls-files", *SHIPPED], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout.split()
    assert tracked and {f"bertdist/_shipped/{f}" for f in tracked} <= names


def test_the_installed_package_is_the_wheel_not_the_checkout(venv, workdir):
    where = run(
        venv, workdir, "python", "-c", "import bertdist.resources as r; print(r.__file__); print(r.shipped('launch'))"
    )
    assert where.returncode == 0, where.stderr
    module, launch = where.stdout.split()
    assert (
        module.startswith(str(venv.parent))
        and launch.startswith(str(venv.parent))
        and launch.endswith("_shipped/launch")
    )


def test_the_suite_runs_against_the_installed_wheel_from_the_checkout(venv):
    """The README's test command for a wheel: the tests stay in the source tree (they need its scripts, configs and
    benchmarks), run with pytest's append import mode and without the current directory on sys.path (`python -P`),
    so that `import bertdist` is the installed wheel's, not the checkout's."""
    probe = "import bertdist, sys; print(bertdist.__file__)"
    where = subprocess.run([venv / "python", "-P", "-c", probe], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert where.stdout.startswith(str(venv.parent)), where.stdout + where.stderr
    command = [str(venv / "python"), "-P", "-m", "pytest", "--import-mode=append", "-q", "-p", "no:cacheprovider"]
    done = subprocess.run(
        [*command, "tests/config/test_schema.py"], cwd=REPO, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0 and " passed" in done.stdout, done.stdout[-3000:] + done.stderr[-3000:]


def test_the_demo_runs_from_the_wheel_and_leaves_a_loadable_tracked_model(demo):
    transformers = pytest.importorskip("transformers")
    from mlflow import MlflowClient

    model = transformers.BertForPreTraining.from_pretrained(demo / "model")
    tokenizer = transformers.AutoTokenizer.from_pretrained(demo / "model")
    batch = tokenizer(["Return a [MASK] of the list."], return_tensors="pt")
    assert model(**batch).prediction_logits.shape[-1] == model.config.vocab_size

    client = MlflowClient(local_store_uri(demo / "train"))
    (experiment,) = [e for e in client.search_experiments() if e.name != "Default"]
    assert experiment.tags["mlflow.experimentKind"] == "custom_model_development"
    runs_ = client.search_runs([experiment.experiment_id])
    (run_,) = [r for r in runs_ if "mlflow.parentRunId" not in r.data.tags]
    assert run_.info.status == "FINISHED" and re.fullmatch(r"bert-tiny-demo-\d{8}-\d{4}", run_.info.run_name)
    fine_tunings = [
        r for r in runs_ if r.data.tags.get("mlflow.parentRunId") == run_.info.run_id
    ]  # in one store, nested
    assert sorted(r.info.run_name for r in fine_tunings) == ["demo-adjacency-pretrained", "demo-adjacency-random-init"]
    assert client.get_metric_history(run_.info.run_id, "loss/train")[-1].step == DEMO_STEPS
    (logged,) = client.search_logged_models(experiment_ids=[experiment.experiment_id])
    assert logged.source_run_id == run_.info.run_id and logged.name == "model"


def test_the_exported_mlflow_model_answers_fill_mask_where_bertdist_is_not_imported(demo, venv, workdir):
    script = (
        "import mlflow, pandas, sys\n"
        f"mlflow.set_tracking_uri('{local_store_uri(demo / 'train')}')\n"
        "client = mlflow.MlflowClient()\n"
        "(e,) = [e for e in client.search_experiments() if e.name != 'Default']\n"
        "(m,) = client.search_logged_models(experiment_ids=[e.experiment_id])\n"
        "answers = mlflow.pyfunc.load_model(m.model_uri).predict("
        "pandas.DataFrame({'text': ['Return a [MASK] of the list.']}))\n"
        "assert 'bertdist' not in sys.modules, 'the model must load without bertdist'\n"
        "print(answers.to_json(orient='records'))\n"
    )
    done = run(venv, workdir, "python", "-c", script, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    answers = json.loads(done.stdout.strip().splitlines()[-1])
    assert len(answers) == 5 and all(a["token"] and 0 <= a["score"] <= 1 for a in answers)


@pytest.mark.parametrize("backend", ["local", "deepspeed", "slurm", "ray"])
def test_submit_dry_run_renders_every_backend_from_the_wheel(venv, workdir, backend):
    (workdir / "hostfile").write_text("localhost slots=2\n")
    extra = {"deepspeed": ["--hostfile", "hostfile"], "slurm": ["--cpu-only"], "ray": ["--ship-package"]}.get(
        backend, []
    )
    done = run(
        venv,
        workdir,
        "bertdist",
        "submit",
        "--backend",
        backend,
        "--gpus-per-node",
        "2",
        "--config",
        "bert-tiny",
        "--dry-run",
        *extra,
    )
    assert done.returncode == 0, done.stderr
    assert f"on backend {backend}" in done.stdout
    scripts = re.findall(r"\S+/_shipped/launch/[\w.]+", done.stdout)
    if backend == "ray":
        assert "python -m bertdist.launch.ray_job" in done.stdout and str(venv.parent) in done.stdout  # py_modules
    elif backend == "slurm":  # the batch script is the shipped template, rendered in full
        assert (
            "#SBATCH --requeue" in done.stdout
            and "srun --kill-on-bad-exit=0 --wait=120 bash -c" in done.stdout
            and f"rank {venv / 'python'} -m bertdist train --config" in done.stdout
        )
    else:
        assert scripts and all(Path(s).is_file() and s.startswith(str(venv.parent)) for s in scripts), done.stdout
    assert not (workdir / "runs" / "jobs").exists()  # a dry run writes nothing


def test_the_dashboard_opens_in_the_training_view_with_the_loss_first(demo, venv, workdir):
    reason = browser.unavailable_reason()
    if reason:
        pytest.skip(reason)
    from bertdist.train.ports import free_tcp_port

    env = {**os.environ, "PYTHONNOUSERSITE": "1"}
    ui = subprocess.Popen(
        [str(venv / "bertdist"), "ui", "--run-dir", str(demo / "train"), "--port", str(free_tcp_port())],
        cwd=workdir,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
    )
    try:
        page = ""
        for line in ui.stdout:
            if line.strip().startswith("latest run "):  # the link printed to open: the run's charts
                page = line.split(": ", 1)[1].strip()
                break
        from mlflow import MlflowClient

        client = MlflowClient(local_store_uri(demo / "train"))
        (run_,) = [
            r
            for r in client.search_runs([page.split("/experiments/")[1].split("/")[0]])
            if "mlflow.parentRunId" not in r.data.tags
        ]
        assert page.endswith(f"/runs/{run_.info.run_id}/model-metrics?workflowType=machine_learning"), page
        shot = Path(os.environ.get("BERTDIST_SCREENSHOT", demo / "dashboard.png"))
        text = browser.render(
            page, "document.querySelectorAll('.main-svg').length >= 2", "document.body.innerText", shot
        )
        assert shot.stat().st_size > 10_000
    finally:
        os.killpg(ui.pid, signal.SIGTERM)
        ui.wait(timeout=60)
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    assert "Evaluations" not in lines and lines[lines.index(run_.info.run_name) - 1] == "Runs"  # the training view
    sections = [lines[i - 1] for i, line in enumerate(lines) if re.fullmatch(r"\(\d+\)", line)]
    assert sections[0] == "loss" and {"mlm_accuracy", "throughput"} <= set(sections), sections
    assert "(loss/train)" in text  # a chart of the training loss is drawn
