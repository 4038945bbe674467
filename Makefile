# Horde Chat: two commands on a fresh machine — `make run` and `make test`.
# Every target installs what it needs on first use (uv, then the locked workspace).

SHELL := /bin/bash
UV := uv
LINT_TYPED := libs/horde-contract/src libs/horde-core/src libs/horde-store/src libs/horde-testing/src \
	services/admission/src services/dispatch/src services/submit/src services/janitor/src services/oai-front/src worker/src

.PHONY: help setup run test test-e2e test-fuzz lint proto proto-check bench k8s-check clean

help:
	@echo "make run         start the local stack (embedded stores, 5 services, a reference worker)"
	@echo "make test        set up and run the whole test suite"
	@echo "make run-llm     the local stack with a real model (llama.cpp, gemma3-270m) as the worker"
	@echo "make test-llm    the model tests (compiles llama.cpp on first use, ~7 min)"
	@echo "make test-fuzz   the long no-5xx run (schemathesis + body fuzz; HORDE_FUZZ_EXAMPLES=500)"
	@echo "make lint        ruff + mypy;  make proto / proto-check: regenerate / check gRPC code;  make k8s-check"
	@echo "make bench       run the benchmarks in bench/"

.venv/.synced: uv.lock pyproject.toml */pyproject.toml */*/pyproject.toml
	@command -v uv >/dev/null 2>&1 || python3 -m pip install --quiet uv
	@$(UV) sync --locked --quiet
	@touch $@

setup: .venv/.synced

run: setup
	@mkdir -p .local
	@if [ -e .local/run.pid ] && kill -0 "$$(cat .local/run.pid)" 2>/dev/null; then \
		echo "make run: a local stack from this checkout is already running (pid $$(cat .local/run.pid)); stop it first" >&2; exit 1; fi
	@rm -f .local/stores.env .local/ready
	@[ -s .local/proxy-passkey ] || python3 -c 'import secrets; print(secrets.token_urlsafe(24))' > .local/proxy-passkey
	@echo $$$$ > .local/run.pid; exec $(UV) run --no-sync honcho -f Procfile start

test: setup
	@$(UV) run --no-sync coverage erase
	@$(UV) run --no-sync coverage run -m pytest $(PYTEST_ARGS)
	@echo "--- horde_contract branch coverage ---"
	@$(UV) run --no-sync coverage report --include='*/horde_contract/*' --skip-covered

test-e2e: setup
	@$(UV) run --no-sync pytest tests/e2e $(PYTEST_ARGS)

# The long no-5xx run (issue 9 item 6): schemathesis over the four services' OpenAPI documents and the body fuzz
# of every route, HORDE_FUZZ_EXAMPLES examples per operation (x12 per route for the body fuzz).
HORDE_FUZZ_EXAMPLES ?= 500
test-fuzz: setup
	@HORDE_FUZZ_EXAMPLES=$(HORDE_FUZZ_EXAMPLES) $(UV) run --no-sync pytest tests/e2e/test_no_5xx.py \
		-o timeout=0 -rA --durations=0 $(PYTEST_ARGS)

lint: setup
	@$(UV) run --no-sync ruff check .
	@$(UV) run --no-sync mypy $(LINT_TYPED)

proto: setup
	@$(UV) run --no-sync bash proto/generate.sh

proto-check: proto
	@git diff --exit-code -- proto && test -z "$$(git status --porcelain -- proto)" \
		|| (echo "generated gRPC code differs from proto/: run make proto and commit" >&2; exit 1)

bench: setup
	@for b in bench/bench_*.py; do echo "== $$b"; $(UV) run --no-sync python $$b || exit 1; done

clean:
	rm -rf .local .venv .pytest_cache .mypy_cache .ruff_cache .coverage

-include mk/llm.mk
-include mk/k8s.mk
