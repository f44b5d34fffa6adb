#!/usr/bin/env bash
# What `make gpu-check` needs on a GPU machine that has torch, transformers and tokenizers but none of bertdist's
# other dependencies and no network (the device image of docs/benchmarks.md), made here in one folder to carry:
#   DIR/whl       wheels of what the check imports there (DeepSpeed built pure-Python; JIT builds its ops there),
#                 pinned to this checkout's virtual environment, for CPython 3.12 on x86-64;
#   DIR/prepared  the GPU tests' tiny vocabulary and shards (`python -m tests.prepared`: needs Ray, here);
#   DIR/ttq       the time to quality's data (`time_to_quality.py --prepare-only`), from CORPUS files when given
#                 (the GPU needs tens of millions of tokens; Python's documentation, the default, is 280k).
# Then it prints the command to run there. DIR is ignored by git (.git/info/exclude) and must stay under the
# 64 MiB a device call carries; the sizes are printed.
#
#   scripts/gpu_bundle.sh [DIR] [CORPUS ...]        # DIR defaults to .gpu
#   python -m bertdist.data.manpages --output runs/man --languages en --max-docs-per-language 6000   # ~20 MB
#   scripts/gpu_bundle.sh .gpu runs/man/en/manpages.jsonl                                            # ~45 MB in all
set -euo pipefail
cd "$(dirname "$0")/.."
DIR=${1:-.gpu}
shift || true
if [[ ! "$DIR" =~ ^[A-Za-z0-9._-]+$ ]]; then
    echo "gpu_bundle: DIR must be a folder name in the repository root (letters, digits, . _ -), got '$DIR'" >&2
    exit 2
fi
PY=.venv/bin/python
[[ -x $PY ]] || { echo "gpu_bundle: no .venv here; run 'make install' first" >&2; exit 2; }
grep -qx "/$DIR/" .git/info/exclude 2>/dev/null || echo "/$DIR/" >> .git/info/exclude
rm -rf "$DIR/whl" && mkdir -p "$DIR/whl"

version() { $PY -c "import importlib.metadata as m, sys; print(m.version(sys.argv[1]))" "$1"; }
# What to carry: benchmarks/gpu_machine.py lists it (tests/test_gpu_check.py runs the check with only that and the
# image's packages). DeepSpeed is published as a source archive: built here into a pure-Python wheel (its ops are
# JIT-built there).
for name in $($PY benchmarks/gpu_machine.py BUILT); do
    $PY -m pip wheel -q --no-deps --no-build-isolation -w "$DIR/whl" "$name==$(version "$name")"
done
pins=()
for name in $($PY benchmarks/gpu_machine.py WHEELS); do
    pins+=("$name==$(version "$name")")
done
$PY -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d "$DIR/whl" "${pins[@]}"

$PY -m tests.prepared "$DIR/prepared"
corpus=()
[[ $# -gt 0 ]] && corpus=(--corpus "$@")
$PY benchmarks/time_to_quality.py --prepare-only --runs bert-fast,bert-trainer --output "$DIR/ttq" "${corpus[@]}"

du -sh "$DIR/whl" "$DIR/prepared" "$DIR/ttq/data"
install="python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site $DIR/whl/*.whl"
cat <<EOF
On the GPU machine (carry: ["$DIR"]), one call; gpu_check ends itself within 9 minutes, its stages in the order of
their priority (fast tests, time to quality, training steps, slow test, model steps, profiles), skipping what its
time cannot hold:
  $install && export PYTHONPATH=/tmp/site:\$PWD && python3 benchmarks/gpu_check.py --prepared $DIR/prepared --ttq $DIR/ttq/data --json \$OUT/gpu.json
The lease is 15 minutes with the machine's start: after that call about 3 are left, and a machine given back (idle
30 s) does not start again with under 4. So, at once, a second call of 2.5 minutes for one stage the first skipped:
  $install && export PYTHONPATH=/tmp/site:\$PWD && python3 benchmarks/gpu_check.py --stages model-steps --budget-minutes 2.5 --json \$OUT/gpu-2.json
EOF
