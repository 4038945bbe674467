# syntax=docker/dockerfile:1
# Every Horde Chat image: the five services and the reference worker, one build ARG apart. Build from the
# repository root (the uv workspace; .dockerignore trims the context), e.g.
#   docker build --build-arg PACKAGE=horde-dispatch --build-arg PORTS="7102 7202" -t horde-dispatch:dev .
# PACKAGE is the workspace member to install; its console script of the same name is the image's command.
# PORTS lists the ports the process listens on (EXPOSE). deploy/k8s/images.toml is the table of every image
# with its build args; `make k8s-images` builds them all and `make k8s-check` checks this file against it.
#
# A build stage installs the locked member and its dependencies (no dev group, no editable installs) into
# /app/.venv in two layers: the third-party dependencies from uv.lock and the members' pyproject.toml files
# only, so a source edit reuses that layer; then the workspace members themselves. The runtime stage is the
# same Python image with that venv only, running as the unprivileged uid/gid 10001 (the manifests' runAsUser).
# horde-admission's image also carries `horde-admin` (horde-store), which the migration Job runs. The worker
# image has only the default backends (scripted, openai): the llamacpp extra compiles llama.cpp.

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ARG UV_VERSION=0.13.9
RUN pip install --no-cache-dir --disable-pip-version-check "uv==${UV_VERSION}"
ENV UV_COMPILE_BYTECODE=1 \
    UV_LINK_MODE=copy \
    UV_PYTHON_DOWNLOADS=never \
    UV_PROJECT_ENVIRONMENT=/app/.venv
WORKDIR /src
ARG PACKAGE
# The dependency layer: the lock and every workspace member's pyproject.toml, nothing else.
COPY uv.lock pyproject.toml ./
COPY proto/pyproject.toml proto/
COPY libs/horde-contract/pyproject.toml libs/horde-contract/
COPY libs/horde-core/pyproject.toml libs/horde-core/
COPY libs/horde-store/pyproject.toml libs/horde-store/
COPY libs/horde-testing/pyproject.toml libs/horde-testing/
COPY services/admission/pyproject.toml services/admission/
COPY services/dispatch/pyproject.toml services/dispatch/
COPY services/submit/pyproject.toml services/submit/
COPY services/janitor/pyproject.toml services/janitor/
COPY services/oai-front/pyproject.toml services/oai-front/
COPY worker/pyproject.toml worker/
RUN --mount=type=cache,target=/root/.cache/uv \
    test -n "${PACKAGE}" \
    && uv sync --frozen --no-dev --no-editable --no-install-workspace --package "${PACKAGE}"
# The sources: only this layer and the next are rebuilt after an edit.
COPY . .
RUN --mount=type=cache,target=/root/.cache/uv \
    uv sync --locked --no-dev --no-editable --package "${PACKAGE}" \
    && ln -s "/app/.venv/bin/${PACKAGE}" /app/.venv/bin/horde-entrypoint

FROM ${PYTHON_IMAGE}
ARG PACKAGE
ARG PORTS
RUN groupadd --system --gid 10001 horde \
    && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent \
       --shell /usr/sbin/nologin horde
COPY --from=build /app/.venv /app/.venv
# Services bind HORDE_BIND_HOST; the worker serves /metrics and /healthz on its metrics port. Each process
# reads only its own prefix, so one set of variables fits every image.
ENV PATH=/app/.venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    HORDE_BIND_HOST=0.0.0.0 \
    HORDE_WORKER_METRICS_HOST=0.0.0.0 \
    HORDE_WORKER_METRICS_PORT=7300
WORKDIR /app
USER 10001:10001
EXPOSE ${PORTS}
# horde-entrypoint is the PACKAGE's own console script (a link made in the build stage).
CMD ["horde-entrypoint"]
