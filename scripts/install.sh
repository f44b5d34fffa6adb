#!/usr/bin/env bash
# Installs bertdist into ./.venv on a fresh machine or a GPU cluster node.
#
# Why a script and not just `pip install -e .`:
# - On a machine without CUDA an unpinned torch pulls several GB of CUDA wheels, so the CPU
#   build (torch==2.13.0) goes in first. On a GPU node the CUDA torch that is already there
#   (system site-packages, visible through --system-site-packages) is kept.
# - DeepSpeed ships as an sdist whose setup.py imports torch; with pip's build isolation it
#   would install a second (CUDA) torch into the build environment, so it builds without it.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
VENV=${VENV:-.venv}
EXTRAS=${EXTRAS:-test}

if [ ! -x "$VENV/bin/python" ]; then
    "$PYTHON" -m venv --system-site-packages "$VENV"
fi
PY="$VENV/bin/python"
"$PY" -m pip install -q --upgrade pip setuptools wheel

cpu_torch=0
if "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
    echo "install: keeping the CUDA torch already installed ($("$PY" -c 'import torch; print(torch.__version__)'))"
elif command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi >/dev/null 2>&1; then
    echo "install: a GPU is present but no CUDA torch is installed; installing torch from the index"
    "$PY" -m pip install -q "torch>=2.4"
else
    echo "install: no CUDA here, installing the CPU build of torch first"
    "$PY" -m pip install -q "torch==${TORCH_CPU_VERSION:-2.13.0}"
    cpu_torch=1
fi

"$PY" -m pip install -q --no-build-isolation -e ".[${EXTRAS}]"

# DeepSpeed's CPU ranks all-reduce through an op it compiles at first use (~30-90 s); compiled now, into the
# environment that holds DeepSpeed (bertdist.train.extensions), no run or test pays it. Not fatal: a run tries again.
if [ "$cpu_torch" = 1 ]; then
    mkdir -p "$VENV/var"
    if DS_ACCELERATOR=cpu "$PY" -m bertdist.train.extensions >"$VENV/var/deepspeed-ops.log" 2>&1; then
        echo "install: DeepSpeed's CPU collectives op built"
    else
        echo "install: DeepSpeed's CPU collectives op did not build (see $VENV/var/deepspeed-ops.log); the first CPU run will try again"
    fi
fi
echo "install: done ($("$PY" -c 'import torch, deepspeed, ray; print("torch", torch.__version__, "deepspeed", deepspeed.__version__, "ray", ray.__version__)' 2>/dev/null))"
