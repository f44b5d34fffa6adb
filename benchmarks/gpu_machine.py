"""The GPU machine's Python as the check meets it: the distributions its image holds, those scripts/gpu_bundle.sh
carries there, and here a Python that has those and nothing else (`device_like_python`).

A device lease is 15 minutes, and a check that fails there on an import (`bertdist train` once reached blingfire,
which the image lacks and whose 42 MB wheel is too large to carry) spends it on nothing. The same check run here
under `device_like_python` fails on the same import, with no lease spent: tests/test_gpu_check.py does that.

    python benchmarks/gpu_machine.py NAME   # the list NAME (BUILT, WHEELS, PINS, UNPINNED) or PYTHON, for scripts
"""

from __future__ import annotations

import importlib.metadata
import re
import sys
import sysconfig
import venv
from pathlib import Path

IMAGE = frozenset(
    """
    absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs botorch build certifi
    charset-normalizer chex click cloudpickle cmake colorama contourpy coverage cuda-bindings cuda-core
    cuda-pathfinder cuda-toolkit cupy-cuda13x cycler cython diffrax e3nn einops equinox etils execnet filelock
    flatbuffers flax fonttools formulaic frozenlist fsspec gpytorch grpcio h11 h5py hf-xet httpcore httpx
    huggingface-hub humanize hypothesis idna imageio iniconfig interface-meta jax jax-cuda13-pjrt jax-cuda13-plugin
    jaxlib jaxtyping jinja2 joblib kiwisolver lazy-loader lightning lightning-utilities linear-operator lineax
    llvmlite lxml markdown markdown-it-py markupsafe matplotlib mdurl meson ml-dtypes mpi4py mpmath msgpack
    multidict multipledispatch mypy-extensions nanobind narwhals networkx ninja numba numba-cuda numpy numpyro
    nvidia-cublas nvidia-cuda-cupti nvidia-cuda-nvrtc nvidia-cuda-runtime nvidia-cudnn-cu13 nvidia-cufft
    nvidia-cufile nvidia-curand nvidia-cusolver nvidia-cusparse nvidia-cusparselt-cu13 nvidia-ml-py
    nvidia-nccl-cu13 nvidia-nvjitlink nvidia-nvshmem-cu13 nvidia-nvtx onnx onnx-ir onnxruntime onnxscript
    opencv-python-headless optax opt-einsum opt-einsum-fx optimistix orbax-checkpoint packaging pandas pathspec
    patsy peft pillow pip pluggy portalocker prometheus-client propcache protobuf psutil pyarrow pybind11
    py-cpuinfo pygments pyparsing pyproject-hooks pyre-extensions pytest pytest-benchmark pytest-cov pytest-mock
    pytest-timeout pytest-xdist python-dateutil pytorch-lightning pyyaml regex requests rich sacrebleu safetensors
    scikit-build-core scikit-image scikit-learn scipy seaborn sentencepiece sentence-transformers setuptools
    shellingham simplejson six sortedcontainers statsmodels sympy tabulate tensorboard tensorboard-data-server
    tensorstore threadpoolctl tifffile tiktoken timm tokenizers toolz torch torchaudio torchdiffeq torch-geometric
    torchmetrics torchvision tqdm transformers treescope triton typer typing-extensions typing-inspect urllib3
    uvloop wadler-lindig werkzeug wheel wrapt xarray xxhash yarl zipp
    """.split()
)
"""The device image's distributions, as the device tool's KINDS.md lists them (read on a machine running the image,
2026-11-17). Its versions differ from this machine's (torch 2.11 and transformers 5.17 there): the import closure is
what a CPU run can check, the versions are not."""

PINS = (
    "torch==2.11.0",
    "triton==3.6.0",
    "transformers==5.17.0",
    "tokenizers==0.23.2",
    "sentence-transformers==6.0.1",
    "accelerate==1.15.0",
    "huggingface-hub==1.33.0",
    "safetensors==0.8.0",
    "numpy==2.5.2",
)
"""The image's versions of what the check runs on, as KINDS.md's pip list gives them (November 2026): what
scripts/gpu_rehearse.sh installs, with UNPINNED."""
UNPINNED = ("pytest", "pyyaml", "tqdm", "psutil", "py-cpuinfo", "ninja", "msgpack", "matplotlib")
"""IMAGE's other packages the check imports, at whatever version pip picks (KINDS.md gives none)."""
PYTHON = "3.12"
"""The image's CPython (3.12.3 there)."""

BUILT = ("deepspeed",)
"""Carried as wheels built here (DeepSpeed is published as a source archive; its ops are JIT-built there)."""
WHEELS = ("hjson", "pydantic", "pydantic-core", "annotated-types", "typing-inspection", "webdataset", "braceexpand")
"""Carried as the binary wheels PyPI has for the machine's CPython 3.12, pinned to this environment's versions."""


def normalized(name: str) -> str:
    """A distribution's name as PyPI compares them (PEP 503)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def with_requirements(names: set[str], installed: dict) -> set[str]:
    """`names` and, among `installed` distributions, everything they require (extras aside), transitively: the
    image's packages are newer here and may need what their older copies there did not (transformers 5.24 needs
    httpx2, 5.17 did not); their own needs are theirs, not the check's."""
    found, todo = set(), [name for name in names if name in installed]
    while todo:
        name = todo.pop()
        if name in found:
            continue
        found.add(name)
        for requirement in installed[name].requires or ():
            if "extra ==" not in requirement:
                needed = normalized(re.match(r"[A-Za-z0-9._-]+", requirement).group())
                todo += [needed] if needed in installed else []
    return found


def device_like_python(directory: Path) -> Path:
    """A virtual environment at `directory` whose site-packages holds links to this environment's installed copies
    of the distributions the GPU machine has (IMAGE, BUILT, WHEELS) and to nothing else; returns its python.

    bertdist itself is not among them: there it runs from the checkout (`PYTHONPATH=$PWD`), and so must a run of
    this python (set PYTHONPATH to the repository's root)."""
    venv.create(directory, with_pip=False, symlinks=True)
    site = directory / Path(sysconfig.get_path("purelib")).relative_to(sysconfig.get_path("data"))
    installed = {normalized(dist.metadata["Name"]): dist for dist in importlib.metadata.distributions()}
    there = with_requirements(IMAGE | set(map(normalized, BUILT + WHEELS)), installed)
    owners: dict[str, set[str]] = {}
    for name, dist in installed.items():
        for file in dist.files or ():
            owners.setdefault(file.parts[0], set()).add(name)
    for name in sorted(there):
        dist = installed[name]
        for file in dist.files or ():
            if file.parts[0] == "..":
                continue
            # A folder that a distribution the machine lacks shares (a namespace: google/ holds protobuf and
            # google-auth) is made here, holding links to the entries of those it has only.
            depth = 1 if owners[file.parts[0]] <= there else min(2, len(file.parts))
            entry = Path(*file.parts[:depth])
            if not (site / entry).is_symlink():
                (site / entry).parent.mkdir(parents=True, exist_ok=True)
                (site / entry).symlink_to(Path(dist.locate_file(entry)).resolve())
    return directory / "bin" / "python"


if __name__ == "__main__":
    value = getattr(sys.modules[__name__], sys.argv[1])
    print(value if isinstance(value, str) else " ".join(value))
