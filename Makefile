# Two commands on a fresh machine: `make demo` and `make test` (ruff, mypy on inspector/, pytest).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
DEMO_DIR ?= build/demo
TORCH_PIN ?= torch==2.13.0

.PHONY: demo test lint format lab bench docs clean

# torch is installed before the project so that the `torch>=...` requirement is already
# satisfied and pip never resolves a CUDA build.
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet "$(TORCH_PIN)"
	$(PY) -m pip install --quiet -e ".[dev]"
	touch $(STAMP)

demo: $(STAMP)
	$(PY) -m inspector demo $(DEMO_DIR)
	@for d in $(DEMO_DIR)/*/; do \
		echo; echo "================ $$d"; \
		$(PY) -m inspector scan "$$d" || exit 1; \
		echo; $(PY) -m inspector check "$$d" --fail-on never || exit 1; \
	done

test: $(STAMP)
	$(PY) -m ruff check inspector widgets tests benchmarks
	$(PY) -m mypy
	$(PY) -m pytest

lint: $(STAMP)
	$(PY) -m ruff check inspector widgets tests benchmarks
	$(PY) -m ruff format --check inspector widgets tests benchmarks
	$(PY) -m mypy

format: $(STAMP)
	$(PY) -m ruff format inspector widgets tests benchmarks
	$(PY) -m ruff check --fix inspector widgets tests benchmarks

# docs/findings.md is generated from the code table in inspector/codes.py.
docs: $(STAMP)
	$(PY) -m inspector codes --markdown > docs/findings.md

bench: $(STAMP)
	$(PY) benchmarks/bench_scan.py

# The demo checkpoints the notebooks open, written once (`make demo` rewrites them).
LAB_DEMO := $(DEMO_DIR)/modelopt-1422-sidecar-drift/README.txt
$(LAB_DEMO): | $(STAMP)
	$(PY) -m inspector demo $(DEMO_DIR)

# JupyterLab on notebooks/ (local only); the kernelspec is this venv's python.
lab: $(STAMP) $(LAB_DEMO)
	$(PY) -m ipykernel install --sys-prefix >/dev/null
	CKPT_DEMO_DIR=$(abspath $(DEMO_DIR)) $(PY) -m jupyter lab --ServerApp.ip=127.0.0.1 \
		--ServerApp.root_dir=notebooks $(if $(filter 0,$(shell id -u)),--allow-root)

clean:
	rm -rf $(VENV) build .pytest_cache
