# Horde Chat: two commands on a fresh machine — `make run` and `make test`.
# Every target installs what it needs on first use (uv, then the locked workspace).

SHELL := /bin/bash
UV := uv
LINT_TYPED := libs/horde-contract/src libs/horde-core/src libs/horde-store/src libs/horde-testing/src \
	services/admission/src services/dispatch/src services/submit/src services/janitor/src services/oai-front/src worker/src
LINT_TESTS := libs/horde-contract/tests libs/horde-core/tests libs/horde-store/tests libs/horde-testing/tests \
	services/admission/tests services/dispatch/tests services/submit/tests services/janitor/tests \
	services/oai-front/tests worker/tests $(filter-out %/__pycache__/,$(wildcard tests/*/)) $(wildcard tests/*.py)
# Tests are type-checked, not held to strict: the bodies of unannotated functions too (--check-untyped-defs).
# The config file is left out (its strict is for src); a type: ignore needed only under strict may stay.
MYPY_TESTS := $(UV) run --no-sync mypy --config-file= --python-version 3.11 --ignore-missing-imports \
	--check-untyped-defs --cache-dir .mypy_cache/tests

.PHONY: help setup run test test-quick test-e2e test-replicas test-clients test-fuzz lint proto-lint proto proto-check bench k8s-check clean

help:
	@echo "make run         start the local stack (embedded stores, 5 services, a reference worker); REPLICAS=2: two of each"
	@echo "make test        set up and run the whole test suite"
	@echo "make run-llm     the local stack with a real model (llama.cpp, gemma3-270m) as the worker"
	@echo "make test-llm    the model tests (compiles llama.cpp on first use, ~7 min)"
	@echo "make test-fuzz   the long no-5xx run (schemathesis + body fuzz; HORDE_FUZZ_EXAMPLES=500)"
	@echo "make test-quick  the tests without e2e and slow ones"
	@echo "make test-replicas  the two-replica stacks: completions, failover, restart (CI runs it)"
	@echo "make test-clients   real client libraries (OpenAI Node SDK, Vercel AI SDK, LangChain, LiteLLM, horde_sdk) and"
	@echo "                    the docs pages in headless Chromium, against a local stack (CI runs it)"
	@echo "make lint        ruff, format, complexity, mypy (src strict, tests), buf lint;  make proto / proto-check: regenerate / check gRPC code;  make k8s-check"
	@echo "make bench       run the benchmarks in bench/"

.venv/.synced: uv.lock pyproject.toml */pyproject.toml */*/pyproject.toml
	@command -v uv >/dev/null 2>&1 || python3 -m pip install --quiet uv
	@$(UV) sync --locked --quiet
	@touch $@

setup: .venv/.synced

# The Procfile's processes under supervisord, REPLICAS=N of each service (REPLICAS_DISPATCH=3 etc. per service;
# make exports command-line variables to the recipe), each restarted when it dies; Ctrl-C stops them all
# (libs/horde-testing/src/horde_testing/local_stack.py).
run: setup
	@mkdir -p .local
	@if [ -e .local/run.pid ] && kill -0 "$$(cat .local/run.pid)" 2>/dev/null; then \
		echo "make run: a local stack from this checkout is already running (pid $$(cat .local/run.pid)); stop it first" >&2; exit 1; fi
	@echo $$$$ > .local/run.pid; exec .venv/bin/python -m horde_testing.local_stack run --dir .local

# promtool: tests/k8s run the alerting rules' unit tests (mk/k8s.mk installs it on first use).
test: setup promtool
	@$(UV) run --no-sync coverage erase
	@$(UV) run --no-sync coverage run -m pytest $(PYTEST_ARGS)
	@echo "--- horde_contract branch coverage ---"
	@$(UV) run --no-sync coverage report --include='*/horde_contract/*' --skip-covered

# The quick loop: every test but the end-to-end (tests/e2e, marker e2e) and the long ones (marker slow).
test-quick: setup
	@$(UV) run --no-sync pytest -m 'not llm and not e2e and not slow' $(PYTEST_ARGS)

test-e2e: setup
	@$(UV) run --no-sync pytest tests/e2e $(PYTEST_ARGS)

# Whole local stacks with two replicas of every service behind the one URL (marker replicas; about 3 min):
# 50 completions, cancels, faults and kill -9 failover; supervisord's restart and stop. CI runs it after test.
test-replicas: setup
	@$(UV) run --no-sync pytest -m replicas tests/e2e $(PYTEST_ARGS)

# Real clients against one local stack (tests/clients; about N min): installs what they need first (the npm
# packages of tests/clients/js, Debian's chromium), then runs the tests with HORDE_CLIENT_TESTS=1.
test-clients: setup
	@bash tests/clients/setup.sh
	@HORDE_CLIENT_TESTS=1 $(UV) run --no-sync pytest tests/clients -p no:cacheprovider $(PYTEST_ARGS)

# The long no-5xx run: schemathesis over the four services' OpenAPI documents and the body fuzz
# of every route, HORDE_FUZZ_EXAMPLES examples per operation (x12 per route for the body fuzz).
HORDE_FUZZ_EXAMPLES ?= 500
test-fuzz: setup
	@HORDE_FUZZ_EXAMPLES=$(HORDE_FUZZ_EXAMPLES) $(UV) run --no-sync pytest tests/e2e/test_no_5xx.py \
		-o timeout=0 -rA --durations=0 $(PYTEST_ARGS)

# Every check runs and the failed ones are listed at the end (make lint fails if one did): ruff, the format,
# the complexity limit ([tool.ruff.lint.mccabe]), mypy strict on every src, mypy --check-untyped-defs on every
# tests folder (one run each: the folders share module names such as conftest), and buf lint of proto/.
lint: setup
	@failed=; \
	check() { local name=$$1; shift; echo "== lint: $$name"; "$$@" || failed="$$failed $$name"; }; \
	check ruff $(UV) run --no-sync ruff check .; \
	check format $(UV) run --no-sync ruff format --check .; \
	check complexity $(UV) run --no-sync ruff check --select C901 .; \
	check mypy-src $(UV) run --no-sync mypy $(LINT_TYPED); \
	for tests in $(LINT_TESTS); do check "mypy-tests:$$tests" $(MYPY_TESTS) $$tests; done; \
	check proto-lint $(MAKE) --no-print-directory proto-lint; \
	if [ -n "$$failed" ]; then echo "make lint: failed:$$failed" >&2; exit 1; fi

proto-lint:
	@$(MAKE) --no-print-directory .local/buf/.installed-$(BUF_VERSION)
	@cd proto && ../$(BUF) lint

proto: setup
	@$(UV) run --no-sync bash proto/generate.sh

# The buf CLI (proto lint, breaking-change check) ships in npm's @bufbuild/buf: pinned, installed under .local.
BUF_VERSION := 1.75.0
BUF := .local/buf/node_modules/.bin/buf
.local/buf/.installed-$(BUF_VERSION):
	@rm -rf .local/buf && npm install --prefix .local/buf --no-save --no-audit --no-fund --loglevel=error \
		@bufbuild/buf@$(BUF_VERSION) && touch $@

# proto/buf.yaml's lint rules, no wire break against main's committed proto, and generated code up to date.
proto-check: proto .local/buf/.installed-$(BUF_VERSION)
	@cd proto && ../$(BUF) lint && ../$(BUF) breaking --against '../.git#branch=main,subdir=proto'
	@git diff --exit-code -- proto && test -z "$$(git status --porcelain -- proto)" \
		|| (echo "generated gRPC code differs from proto/: run make proto and commit" >&2; exit 1)

bench: setup
	@for b in bench/bench_*.py; do echo "== $$b"; $(UV) run --no-sync python $$b || exit 1; done

clean:
	rm -rf .local .venv .pytest_cache .mypy_cache .ruff_cache .coverage

-include mk/llm.mk
-include mk/k8s.mk
