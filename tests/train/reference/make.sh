#!/usr/bin/env bash
# Write tests/train/reference/bert_zero1.json by running tests/train/test_reference.py at COMMIT (default
# 30a5372, the code before the model registry) with this checkout's virtual environment.
set -euo pipefail
here="$(cd "$(dirname "$0")/../../.." && pwd)"
commit="${1:-30a5372}"
tree="$(mktemp -d)/before"
git -C "$here" worktree add --detach "$tree" "$commit"
trap 'git -C "$here" worktree remove --force "$tree"' EXIT
cp "$here/tests/train/test_reference.py" "$tree/tests/train/"
mkdir -p "$tree/tests/train/reference"
cp "$here/tests/train/reference/vocab.txt" "$tree/tests/train/reference/"
cd "$tree"
imported="$("$here/.venv/bin/python" -c "import bertdist, os; print(os.path.dirname(bertdist.__file__))")"
[ "$imported" = "$tree/bertdist" ] || { echo "make.sh: bertdist imports from $imported, not $tree" >&2; exit 1; }
BERTDIST_WRITE_REFERENCE="$here/tests/train/reference/bert_zero1.json" DS_ACCELERATOR=cpu \
    "$here/.venv/bin/python" -m pytest -q -p no:cacheprovider tests/train/test_reference.py -rs
