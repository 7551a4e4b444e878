# featdump developer tasks. `make help` lists them.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
IMAGES ?= examples/images

.DEFAULT_GOAL := help
.PHONY: help install demo test test-all coverage lint bench clean

help: ## List the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk 'BEGIN {FS = ":.*## "}; {printf "  make %-9s %s\n", $$1, $$2}'

$(BIN)/featdump: pyproject.toml constraints.txt
	@echo "make install: $(VENV) with featdump and every extra (PyTorch pinned by constraints.txt). From PyPI's"
	@echo "  default index torch is the CUDA build: about 7 GB installed (3.2 GB of it NVIDIA libraries), 3-10"
	@echo "  minutes on a fresh machine. CPU only: make install TORCH_INDEX=https://download.pytorch.org/whl/cpu"
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(if $(TORCH_INDEX),$(BIN)/python -m pip install --progress-bar on -c constraints.txt --index-url $(TORCH_INDEX) torch torchvision)
	rm -rf featdump.egg-info  # a stale one beside the code would hide the entry points pyproject.toml declares
	$(BIN)/python -m pip install --progress-bar on -c constraints.txt -e '.[dev]'
	@echo "make install: done; $(VENV) holds $$(du -sh $(VENV) | cut -f1)."
	touch $@

install: $(BIN)/featdump ## Create .venv and install featdump with torch/torchvision pinned (TORCH_INDEX=URL: the CPU build)

demo: install ## Extract two layers of a random resnet18 over the sample images into demo.h5, draw one as demo.png
	$(BIN)/featdump extract --model resnet18 --weights none --layers layer1,avgpool --overwrite $(IMAGES) demo.h5
	$(BIN)/featdump info demo.h5
	$(BIN)/featdump show demo.h5 --layer layer1 --index 2 -o demo.png

# test-all on two pytest workers, each a test file at a time (a file's fixtures made once): much of a slow test's
# time is a process starting or waiting (20:12-20:47 against 23:49 in one process, on one Xeon). The quick suite
# computes in this process and runs no faster so (2:41 against 2:24): it stays in one. WORKERS=0: one process.
WORKERS ?= 2
PARALLEL := $(if $(filter 0,$(WORKERS)),,-n $(WORKERS) --dist loadfile)

test: install ## Run the quick suite: every test but the ones marked slow (soaks, compiles, kills), about 2-3 minutes
	$(BIN)/python -m pytest -q -m "not slow"

test-all: install ## Run every test, the slow ones included (what CI runs; FEATDUMP_FAULT_TRIALS=200 for a longer soak)
	$(BIN)/python -m pytest -q $(PARALLEL)

coverage: install ## Run every test under coverage.py (featdump processes too) and report featdump's line coverage
	rm -f .coverage .coverage.*
	$(BIN)/coverage run -m pytest -q -p no:cacheprovider
	$(BIN)/coverage combine -q
	$(BIN)/coverage report --skip-covered --sort=cover

lint: install ## Check style with ruff
	$(BIN)/ruff check .

bench: install ## Run the benchmarks and print their tables (see benchmarks/README.md)
	$(BIN)/python -m benchmarks.run
	$(BIN)/python -m benchmarks.compression

clean: ## Remove caches and demo output (keeps .venv)
	rm -rf .pytest_cache .ruff_cache .coverage .coverage.* demo.h5 demo.h5.partial demo.png tour.h5 fmap.png benchmarks/data
	find . -name __pycache__ -not -path './$(VENV)/*' -prune -exec rm -rf {} +
