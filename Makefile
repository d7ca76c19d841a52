# Two commands do all set-up from a fresh clone:
#   make demo   create .venv if missing, install torch + the project, train examples/digits.py on the CPU
#   make test   same set-up, then the whole test suite
#   make gpu-check  on a CUDA machine: the CUDA-only tests and benchmarks/gpt.py at a GPU size (docs/performance.md)
# TORCH=... overrides the torch requirement (default: the CPU build that installs from local disk here).
# EXTRAS: the optional dependencies installed too, so their tests run instead of skipping: deepspeed (ZeRO on CPU
# ranks), s3 (fsspec, s3fs and moto's S3 server on 127.0.0.1 for the remote-checkpoint tests), hf (transformers)
# and titan (torchtitan's Llama-3) for the deferred-initialisation tests against the real libraries; ray (a local
# Ray cluster), submitit, ft (torchft and its lighthouse) and data (torchdata, datasets) for the cluster,
# fault-tolerance and data-resume tests; peers (lightning, accelerate) for the tests that compare a
# script's numbers on them with ours.
PYTHON ?= python3
VENV ?= .venv
TORCH ?= torch==2.13.0
EXTRAS ?= test,s3,deepspeed,hf,titan,ray,submitit,ft,data,peers
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
PYTEST_ARGS ?=
# torch's JIT extensions (DeepSpeed's CPU collectives) build into this environment's own folder, not the shared
# ~/.cache/torch_extensions, where another environment's build (or a killed one's lock) would be picked up;
# tests/conftest.py takes the same default when it is not set.
export TORCH_EXTENSIONS_DIR ?= $(abspath $(VENV))/torch_extensions
EXTENSIONS_STAMP := $(TORCH_EXTENSIONS_DIR)/.built
# gpu-check builds its own venv on top of a Python whose torch has CUDA (its packages are used as they are).
GPU_PYTHON ?= python3
GPU_VENV ?= .venv-gpu

.PHONY: demo test install bench gpu-check clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(STAMP): pyproject.toml setup.py | $(BIN)/python
	$(BIN)/python -m pip install --quiet "$(TORCH)"
	$(BIN)/python -m pip install --quiet -e ".[$(EXTRAS)]"
	touch $@

# DeepSpeed compiles its CPU collectives on first use; do it here, not inside the first test's time limit.
$(EXTENSIONS_STAMP): $(STAMP)
	if $(BIN)/python -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('deepspeed') is None)"; then \
		$(BIN)/python -m trainer.strategies.data_parallel.deepspeed; fi
	mkdir -p $(TORCH_EXTENSIONS_DIR)
	touch $@

install: $(STAMP) $(EXTENSIONS_STAMP)

demo: $(STAMP)
	$(BIN)/python examples/digits.py

test: $(STAMP) $(EXTENSIONS_STAMP)
	$(BIN)/python -m pytest tests $(PYTEST_ARGS)

bench: $(STAMP)
	$(BIN)/python benchmarks/import_time.py
	$(BIN)/python benchmarks/overhead.py

gpu-check:
	$(GPU_PYTHON) -m venv --system-site-packages $(GPU_VENV)
	$(GPU_VENV)/bin/python benchmarks/check_gpu.py
	$(GPU_VENV)/bin/python -m pip install --quiet --no-build-isolation -e ".[test]" \
	    || $(GPU_VENV)/bin/python -m pip install --quiet --no-build-isolation --no-deps -e .
	$(GPU_VENV)/bin/python -m pytest tests -m cuda -q -p no:cacheprovider
	$(GPU_VENV)/bin/python benchmarks/gpt.py --size gpu

clean:
	rm -rf $(VENV) $(GPU_VENV) *.egg-info .pytest_cache
