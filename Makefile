# The two commands of the README:
#   make demo   install, then run the whole pipeline on the embedded corpus (CPU, ~10 minutes)
#   make test   install, then run the test suite (CPU)
VENV ?= .venv
PY := $(VENV)/bin/python
export DS_ACCELERATOR ?= cpu

.PHONY: install test lint test-services demo bench gpu-check gpu-rehearse clean

install:
	bash scripts/install.sh

test: install lint test-services
	$(PY) -m pytest -q -rs --durations=30

# The formatter and the linter (ruff, configured in pyproject.toml): a formatting or lint error fails `make test`.
lint: install
	$(VENV)/bin/ruff format --check bertdist tests benchmarks
	$(VENV)/bin/ruff check bertdist tests benchmarks

# What the suite uses that pip cannot install: a one-node SLURM cluster (scripts/setup_slurm.sh: apt-get
# slurm-wlm + munge when missing and root), a headless Chromium for the dashboard test
# (scripts/setup_chromium.sh), sshd + pdsh for the multi-host tests in network namespaces
# (scripts/setup_hosts.sh), and Debian's translated manual pages for the multilingual demo
# (scripts/setup_manpages.sh). Where one cannot be set up, its script says why and those tests skip.
test-services:
	bash scripts/setup_slurm.sh
	bash scripts/setup_chromium.sh
	bash scripts/setup_hosts.sh
	bash scripts/setup_manpages.sh

demo: install
	$(VENV)/bin/bertdist demo

# Speed against references measured in the same run (docs/benchmarks.md); minutes, not part of the tests.
BENCHMARKS := model_step train_step finetune_step packing prepare_throughput loader_throughput storage_throughput tracking_overhead forecast_accuracy startup_overhead
bench: install
	set -e; for b in $(BENCHMARKS); do echo "== benchmarks/$$b.py"; $(PY) benchmarks/$$b.py; done

# On a machine with NVIDIA GPUs: the GPU-marked tests, FusedAdam, BERT-Large and ModernBERT-base training steps
# against transformers on each attention kernel, a report on one screen and in docs/gpu/<date>-<device>.json and
# .md (to commit). Without a GPU: one line, exit 0; `benchmarks/gpu_check.py --smoke` runs it on the CPU. For a GPU
# machine with torch but none of bertdist's other dependencies: scripts/gpu_bundle.sh here, then what it prints there.
gpu-check:
	$(PY) benchmarks/gpu_check.py

# Before a GPU lease: the bundle for a GPU machine without bertdist's dependencies (scripts/gpu_bundle.sh), and its
# device command rehearsed here on the CPU under the machine's own versions of torch and transformers
# (downloads ~3.5 GB once).
gpu-rehearse: install
	bash scripts/gpu_bundle.sh .gpu
	bash scripts/gpu_rehearse.sh .gpu

clean:
	rm -rf $(VENV) runs .pytest_cache
