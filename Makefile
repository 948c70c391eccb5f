# Two commands on a fresh machine: `make demo` and `make test` (ruff, mypy on inspector/ and
# widgets/, the documentation site, pytest).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
DOCS_STAMP := $(VENV)/.docs-stamp
MKDOCS_BUILD := NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict --quiet --site-dir build/site
DEMO_DIR ?= build/demo
TORCH_PIN ?= torch==2.13.0

.PHONY: demo test coverage fuzz lint format lab lab-notebooks bench bench-checkpoint docs docs-screenshot \
	clean fixtures \
	vendor-plotly

# torch is installed first, by pip, so that the `torch>=...` requirement is already satisfied
# and no resolver ever picks a CUDA build; TORCH_PIN is also passed as a constraint to the
# rest. The rest is installed by uv (a maintained, pip-compatible installer, itself from
# PyPI): the same versions pip resolves, in about 15 s where pip took about 3 minutes.
# tests/constraints.txt pins the few packages whose requirements make a resolver backtrack.
# Where PYTHONDONTWRITEBYTECODE is set (as in many CI images, and here) no import writes
# bytecode: every process would compile torch, transformers and pandas from source again
# (measured: `import inspector` 3.0 s of CPU instead of 0.8 s, torch + transformers 17 s
# instead of 6 s, and the tests start hundreds of processes). So the processes of these
# targets may write it: each module is compiled once, the first time anything imports it.
# (Compiling the whole of site-packages ahead took 72 s of CPU, most of it for modules nothing
# here imports.)
unexport PYTHONDONTWRITEBYTECODE
UV := $(VENV)/bin/uv
UV_INSTALL := $(UV) pip install --python $(PY) --quiet -c tests/constraints.txt \
	-c $(VENV)/torch-pin.txt
# vLLM for `check --engine vllm` (the [vllm] extra holds the packages it needs on CPU): its
# wheel, without its CUDA requirements, over the CPU torch; VLLM_PIN is the release
# inspector/_internal/load/engine.py is written against (a test keeps the two equal).
# Measured on the 2-core machine, uv's cache warm: 3.5 s to install the extra and the two
# wheels; vLLM's modules compile when first imported; a cold cache adds the download of
# vLLM's 336 MB wheel. The vLLM tests share one vLLM import per test run (tests/conftest.py
# `vllm_cases`): about 15 s of CPU, case models included.
VLLM_PIN ?= vllm==0.33.0
VLLM_INSTALL = VLLM_TARGET_DEVICE=cpu $(UV) pip install --python $(PY) --quiet --no-deps \
	"$(VLLM_PIN)" xgrammar==0.2.8
# Each step says what it does and how long it takes, and the downloads show their progress
# (pip's and uv's own): `make demo` on a fresh machine printed nothing for 3.5 minutes.
$(STAMP): pyproject.toml tests/constraints.txt
	@echo "== 1/3 $(TORCH_PIN) (CPU) and uv into $(VENV): the longest step, pip shows its download"
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --no-compile --disable-pip-version-check --progress-bar on \
		"$(TORCH_PIN)" uv
	echo "$(TORCH_PIN)" > $(VENV)/torch-pin.txt
	@echo "== 2/3 the project and its [dev,vllm] extras (uv: about 15 s once downloaded)"
	$(subst --quiet,,$(UV_INSTALL)) -e ".[dev,vllm]"
	@echo "== 3/3 $(VLLM_PIN) for check --engine vllm (its wheel is 336 MB the first time)"
	$(subst --quiet,,$(VLLM_INSTALL))
	touch $(STAMP)
	@echo "== installed into $(VENV)"

demo: $(STAMP)
	$(PY) -m inspector demo $(DEMO_DIR)
	@for d in $(DEMO_DIR)/*/; do \
		echo; echo "================ $$d"; \
		$(PY) -m inspector scan "$$d" || exit 1; \
		echo; $(PY) -m inspector check "$$d" --fail-on never || exit 1; \
	done

# Each phase says how long it took (`== phase: N s`), so a slow CI run shows where the time went.
PHASE = bash .ci/phase.sh
# mypy, the docs build and the fuzz run go after pytest, side by side with each other. Beside
# pytest they only slowed it: its three workers keep both cores busy (1.9-2.0 of 2 in a
# /proc/stat sampler, 29 Nov 2026), so the checks' CPU (about 14 + 4 + 13 CPU-s) lengthened
# pytest by about the wall they take after it. After it they run
# at full priority, and no busy pytest stretches the fuzz run's wall-clock limits. Either
# failing fails `make test`, after both have run.
test: $(STAMP) $(DOCS_STAMP)
	@$(PHASE) ruff $(PY) -m ruff check inspector widgets tests benchmarks notebooks
	@$(PHASE) pytest $(PY) -m pytest -n $(PYTEST_WORKERS) --dist loadfile; tests=$$?; \
	$(PHASE) "mypy, docs and fuzz" $(MAKE) --no-print-directory -j2 -Otarget typecheck \
		docs-fuzz; checked=$$?; \
	test $$tests = 0 && test $$checked = 0

# Single-threaded checks side by side (`make test` runs them after pytest): a cold mypy
# takes about 14 s of CPU, the docs build about 4 s and the fuzz run about 13 s, so the docs
# and the fuzz run one after the other beside mypy. (-Otarget keeps each one's output
# together.)
.PHONY: typecheck docs-build docs-fuzz
typecheck: $(STAMP)
	$(PY) -m mypy
docs-build: $(DOCS_STAMP)
	env $(MKDOCS_BUILD)
docs-fuzz: docs-build
	$(PY) tests/fuzz/run.py --short --seconds $(CI_FUZZ_SECONDS) --timeout $(CI_FUZZ_TIMEOUT)

# The tests run in this many processes (pytest-xdist), each taking a whole test file at a time
# so a file's module fixtures (models built by real writers) are built once. `make test
# PYTEST_WORKERS=0` runs them in this process. Three on two cores, because the tests wait
# (JupyterLab pages, kernels, servers' deadlines): in two fresh-clone `.ci/run`s in the same
# hour (29 Nov, load 0.5-4), two workers kept 1.61 cores busy and pytest took 388 s; three
# kept 1.81 busy for 52 CPU-s more (each worker pays its imports and session fixtures) and
# took 371 s.
PYTEST_WORKERS ?= 3

# Line coverage of inspector/ and widgets/ over the whole suite (pytest-cov; about 1.5x a
# `make test` pytest run, so never part of it). The processes the tests start measure
# themselves too (CLI runs, the load check's and the engine's children, notebook kernels):
# pyproject's [tool.coverage.run] says how. pytest-cov combines what ended before pytest did;
# the files of children that end later are added after. Prints the table of
# tests/coverage_table.py (by folder, then inspector/, widgets/, both); the per-file report
# is build/coverage/html/index.html. Fails when pytest failed, after the report.
# `make coverage COVERAGE_TESTS=tests/test_x.py` measures some files only.
COVERAGE_DIR := build/coverage
coverage: $(STAMP)
	rm -rf $(COVERAGE_DIR) && mkdir -p $(COVERAGE_DIR)
	@$(PHASE) "pytest with coverage" $(PY) -m pytest -n $(PYTEST_WORKERS) --dist loadfile \
		--cov --cov-report= $(COVERAGE_TESTS); tests=$$?; \
	$(PY) -m coverage combine --append --quiet 2>/dev/null; \
	$(PY) -m coverage json --quiet -o $(COVERAGE_DIR)/coverage.json && \
	$(PY) -m coverage html --quiet -d $(COVERAGE_DIR)/html && \
	$(PY) tests/coverage_table.py $(COVERAGE_DIR)/coverage.json && \
	test $$tests = 0

# Coverage-guided fuzzing of the untrusted-input readers (atheris; hypothesis where atheris is
# not installed). `make test` runs each target a fixed number of inputs (`--short`: SHORT_RUNS
# in tests/fuzz/run.py, leaving out the targets that would only replay their corpus), bounded by
# work, not time: a time budget would run fewer inputs the busier the machine. Each count is the
# smallest that reached the edges the former 2 s per target reached (measured over 10 CPU-s per
# target, the counts and what 10 s added are in run.py: 0-28 edges of 45-950 per target), about
# 13 CPU-s of fuzzing for 28 before, beside the one-time instrumenting and set-up. The search is
# seeded (--seed 1) from the committed corpus, so a run repeats the last one's inputs unless the
# code changed. CI_FUZZ_SECONDS only caps the short run, as a safety net: each target's share,
# about 170 s, is about twice what bin_pickle's 200 inputs would take on a machine at load 18 (a
# 43 s share cut it at 96 inputs); the summary line says when the cap cut a target short. The
# corpus replay in pytest guards regressions; `make fuzz` is the longer hunt, bounded by time
# (`make fuzz FUZZ_SECONDS=3600` longer still), whose finds are added to the corpus.
CI_FUZZ_SECONDS ?= 2400
# libFuzzer's per-input timeout is a wall clock: on a busy machine (load 20-34, when the run
# went beside pytest) a first input of remote_answer and engine_answer went past 10 s (hangs
# that were not), so the short run allows 60 s; an input that loops still fails it, and each
# corpus input is held to 10 CPU-s by tests/test_fuzz_corpus.py. `make fuzz` keeps 10 s.
CI_FUZZ_TIMEOUT ?= 60
FUZZ_SECONDS ?= 600
fuzz: $(STAMP)
	$(PY) tests/fuzz/run.py --seconds $(FUZZ_SECONDS)

lint: $(STAMP)
	$(PY) -m ruff check inspector widgets tests benchmarks notebooks
	$(PY) -m ruff format --check inspector widgets tests benchmarks notebooks
	$(PY) -m mypy

format: $(STAMP)
	$(PY) -m ruff format inspector widgets tests benchmarks notebooks
	$(PY) -m ruff check --fix inspector widgets tests benchmarks notebooks

# The documentation site: docs/ (mkdocs.yml) built into build/site with warnings as errors
# (strict: a broken internal link or anchor, a page outside the nav, a docstring the API
# pages cannot render all fail; tests/test_docs.py checks the README's links and that external
# links are well-formed, without fetching them). The docs tools are the `docs` extra, added to
# the same virtual environment (the API pages import nothing, but read the installed package).
$(DOCS_STAMP): $(STAMP)
	$(UV_INSTALL) -e ".[docs]"
	touch $(DOCS_STAMP)

# docs/findings.md is generated from the code table in inspector/_internal/findings/codes.py
# (`ckpt-inspect codes --markdown`) first.
docs: $(STAMP) $(DOCS_STAMP)
	$(PY) -m inspector codes --markdown > docs/findings.md
	$(MKDOCS_BUILD)
	@echo "the site is in build/site: open build/site/index.html (search needs a server:"
	@echo "  $(PY) -m http.server -d build/site 8000, then http://127.0.0.1:8000)"

# docs/dashboard.png, the README's picture: the real dashboard in JupyterLab and Chromium.
docs-screenshot: $(STAMP)
	$(PY) tests/dashboard_screenshot.py docs/dashboard.png

bench: $(STAMP)
	$(PY) benchmarks/bench_scan.py

# The sparse synthetic checkpoint the benchmarks and docs measure (headers only, holes for the
# data), cached under benchmarks/.cache: `make bench-checkpoint TENSORS=300000 LOST=40:17-19`.
TENSORS ?= 300000
LOST ?=
bench-checkpoint: $(STAMP)
	$(PY) benchmarks/_synthetic.py --tensors $(TENSORS) $(if $(LOST),--lost $(LOST))

# The demo checkpoints the notebooks open, written once (`make demo` rewrites them).
LAB_DEMO := $(DEMO_DIR)/modelopt-1422-sidecar-drift/README.txt
$(LAB_DEMO): | $(STAMP)
	$(PY) -m inspector demo $(DEMO_DIR)

# JupyterLab (local only) rooted in LAB_DIR, outside the clone: what the notebooks write
# (exports, reports, repaired copies) lands there, never in the repository. The example
# notebooks are copied there once; a notebook a person edited there is kept. The kernelspec
# is this venv's python.
LAB_DIR ?= $(HOME)/checkpoint-inspector-lab
lab-notebooks:
	@case "$(abspath $(LAB_DIR))/" in "$(CURDIR)/"*) \
		echo "LAB_DIR=$(LAB_DIR) is inside the repository: choose a folder outside it"; exit 2;; esac
	mkdir -p "$(LAB_DIR)"
	@for nb in notebooks/*.ipynb; do \
		[ -e "$(LAB_DIR)/$${nb##*/}" ] || cp "$$nb" "$(LAB_DIR)/" || exit 1; \
	done
	@echo "notebooks in $(abspath $(LAB_DIR))"

# The venv's JupyterLab asks for no news and checks for no update: no toast over the
# dashboard, no request to another host (settings overrides of this installation only).
LAB_OVERRIDES := $(VENV)/share/jupyter/lab/settings/overrides.json
lab: $(STAMP) $(LAB_DEMO) lab-notebooks
	$(PY) -m ipykernel install --sys-prefix >/dev/null
	mkdir -p $(dir $(LAB_OVERRIDES))
	echo '{"@jupyterlab/apputils-extension:notification": {"fetchNews": "false", "checkForUpdates": false}}' > $(LAB_OVERRIDES)
	CKPT_DEMO_DIR=$(abspath $(DEMO_DIR)) $(PY) -m jupyter lab --ServerApp.ip=127.0.0.1 \
		--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate \
		--ServerApp.root_dir="$(abspath $(LAB_DIR))" $(if $(filter 0,$(shell id -u)),--allow-root)

# The real writers (megatron-core, nvidia-modelopt, NeMo AutoModel, transformers, PyTorch DCP,
# gguf) live in their own virtual environment, pinned by tests/writers/constraints.txt; two
# writers whose pins conflict with it have one each: transformers 4.x for PyTorch .bin
# (constraints-tf4.txt) and llm-compressor / compressed-tensors (constraints-llmc.txt).
# `make test` never needs them: the tests read the committed fixtures and MANIFEST.json.
WRITERS_VENV ?= build/writers-venv
WPY := $(WRITERS_VENV)/bin/python
WSTAMP := $(WRITERS_VENV)/.installed-stamp
WRITERS_PINS := tests/writers/constraints.txt
TF4_VENV ?= build/writers-venv-tf4
TF4_STAMP := $(TF4_VENV)/.installed-stamp
LLMC_VENV ?= build/writers-venv-llmc
LLMC_STAMP := $(LLMC_VENV)/.installed-stamp
# venv:script, run in this order (each script rewrites all of its cases).
WRITER_RUNS := $(WRITERS_VENV):write_megatron $(WRITERS_VENV):write_modelopt \
	$(WRITERS_VENV):write_automodel $(WRITERS_VENV):write_torch_dcp \
	$(WRITERS_VENV):write_dcp_test_models \
	$(WRITERS_VENV):write_transformers $(WRITERS_VENV):write_quant_layouts \
	$(WRITERS_VENV):write_gguf $(TF4_VENV):write_bin $(LLMC_VENV):write_llmcompressor

$(WSTAMP): $(WRITERS_PINS)
	$(PYTHON) -m venv $(WRITERS_VENV)
	$(WPY) -m pip install --quiet "$(TORCH_PIN)"
	$(WPY) -m pip install --quiet -c $(WRITERS_PINS) megatron-core nvidia-modelopt transformers \
		safetensors psutil requests accelerate gguf
	$(WPY) -m pip install --quiet --no-deps -c $(WRITERS_PINS) nemo-automodel
	touch $(WSTAMP)

$(TF4_STAMP): tests/writers/constraints-tf4.txt
	$(PYTHON) -m venv $(TF4_VENV)
	$(TF4_VENV)/bin/python -m pip install --quiet "$(TORCH_PIN)"
	$(TF4_VENV)/bin/python -m pip install --quiet -c tests/writers/constraints-tf4.txt \
		transformers safetensors numpy
	touch $(TF4_STAMP)

$(LLMC_STAMP): tests/writers/constraints-llmc.txt
	$(PYTHON) -m venv $(LLMC_VENV)
	$(LLMC_VENV)/bin/python -m pip install --quiet "$(TORCH_PIN)"
	$(LLMC_VENV)/bin/python -m pip install --quiet -c tests/writers/constraints-llmc.txt \
		llmcompressor
	touch $(LLMC_STAMP)

# Rewrites every golden fixture and tests/fixtures/writers/MANIFEST.json from scratch (about
# ten minutes on 2 cores, most of it imports). PYTHONHASHSEED pins set/dict orders that
# Python-side writers may use.
fixtures: $(WSTAMP) $(TF4_STAMP) $(LLMC_STAMP)
	rm -rf tests/fixtures/writers
	@for run in $(WRITER_RUNS); do \
		venv=$${run%%:*}; s=$${run#*:}; \
		echo "== $$s ($$venv)"; \
		PYTHONHASHSEED=0 PYTHONWARNINGS=ignore $$venv/bin/python tests/writers/$$s.py || exit 1; \
	done
	@du -sh tests/fixtures/writers

clean:
	rm -rf $(VENV) build .pytest_cache

# plotly.js's cartesian bundle, fetched again from npm and checked against the sha256 that
# widgets/vendor/README.md records (the dashboard's figures load it: widgets/plot.py).
PLOTLY_CARTESIAN := plotly.js-cartesian-dist-min-4.1.1
PLOTLY_CARTESIAN_SHA256 := 79542150855a52c567260e3137095dbe2b744e6d702a5cabe67da246942fba7a
vendor-plotly:
	curl -sSL https://registry.npmjs.org/plotly.js-cartesian-dist-min/-/$(PLOTLY_CARTESIAN).tgz \
		| tar -xzO package/plotly-cartesian.min.js > widgets/vendor/plotly-cartesian.min.js.new
	echo "$(PLOTLY_CARTESIAN_SHA256)  widgets/vendor/plotly-cartesian.min.js.new" | sha256sum -c -
	mv widgets/vendor/plotly-cartesian.min.js.new widgets/vendor/plotly-cartesian.min.js
