#!/usr/bin/env bash
# The GPU machine's command (what scripts/gpu_bundle.sh prints), rehearsed here on the CPU before a lease is
# spent on them: CPython 3.12 with the image's versions of torch, transformers, tokenizers, sentence-transformers and
# accelerate (benchmarks/gpu_machine.py's PINS), the carried wheels installed the way the machine installs them
# (pip --target, PYTHONPATH), and `gpu_check.py --smoke` with every stage, plus the GPU test files (their CPU tests
# run, the GPU ones are collected and skipped). tests/test_gpu_check.py checks the same on this checkout's own
# versions in every test run; this catches what only the image's versions break (an API renamed in torch 2.13).
#
#   scripts/gpu_bundle.sh .gpu && scripts/gpu_rehearse.sh [.gpu]
#
# The first run downloads ~3.5 GB (PyPI has no CPU build of torch 2.11 for Linux: its CUDA build runs on a CPU
# too) into REHEARSAL_VENV (default ~/.cache/bertdist/gpu-rehearsal); later runs reuse it. Needs a CPython 3.12
# (PYTHON312, else python3.12, else pyenv's). Reports go to runs/gpu-rehearsal/.
set -euo pipefail
cd "$(dirname "$0")/.."
DIR=${1:-.gpu}
[[ -d $DIR/whl && -d $DIR/prepared && -d $DIR/ttq/data ]] || {
    echo "gpu_rehearse: no bundle in '$DIR' (whl/, prepared/, ttq/data/); run scripts/gpu_bundle.sh $DIR first" >&2
    exit 2
}
PY=.venv/bin/python
machine() { $PY benchmarks/gpu_machine.py "$1"; }
want=$(machine PYTHON)
PY312=""
for candidate in "${PYTHON312:-}" python3.12 "$(pyenv root 2>/dev/null)/versions/$want"*/bin/python3.12; do
    if [[ -n $candidate ]] && "$candidate" -c "import sys; assert sys.version.startswith('$want.')" 2>/dev/null; then
        PY312=$candidate
        break
    fi
done
[[ -n $PY312 ]] || { echo "gpu_rehearse: no CPython $want here (PYTHON312, python3.12, pyenv); set PYTHON312" >&2; exit 2; }

VENV=${REHEARSAL_VENV:-$HOME/.cache/bertdist/gpu-rehearsal}
[[ -x $VENV/bin/python ]] || "$PY312" -m venv "$VENV"
# the image's pins, and the image's packages the check imports at any version
# shellcheck disable=SC2046
"$VENV/bin/python" -m pip install -q $(machine PINS) $(machine UNPINNED)
SITE=$(mktemp -d)
trap 'rm -rf "$SITE"' EXIT
"$VENV/bin/python" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$SITE" "$DIR"/whl/*.whl
export PYTHONPATH=$SITE:$PWD
OUT=runs/gpu-rehearsal
mkdir -p $OUT
"$VENV/bin/python" -c "import torch, transformers; print('rehearsing on torch', torch.__version__, 'transformers', transformers.__version__)"
# shellcheck disable=SC2046
"$VENV/bin/python" -m pytest -q -p no:cacheprovider $("$VENV/bin/python" -c "import sys; sys.path.insert(0, 'benchmarks'); from gpu_check import GPU_TESTS; print(*GPU_TESTS)")
"$VENV/bin/python" benchmarks/gpu_check.py --smoke --prepared "$DIR/prepared" --ttq "$DIR/ttq/data" --ttq-minutes 0.25 \
    --json $OUT/gpu.json
echo "gpu_rehearse: the device command ran on the image's versions (CPU); report in $OUT/"
