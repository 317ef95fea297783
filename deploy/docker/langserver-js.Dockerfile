# syntax=docker/dockerfile:1
# Image of the JavaScript language server (V8 isolates), under the supervisor.
# Build from the repository root:  docker build -f deploy/docker/langserver-js.Dockerfile -t durable-workflows/langserver-js .
#
# Multi-stage: the build stage installs the package (bytecode precompiled) into a
# virtualenv; the runtime stage copies only that virtualenv onto a slim base: no
# sources, no pip cache, no build tools. It runs as an unprivileged numeric uid
# and writes nothing outside /tmp (mount a tmpfs there), so it works with a
# read-only root filesystem, no capabilities and no-new-privileges.

FROM python:3.11-slim AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/venv
WORKDIR /src
COPY pyproject.toml README.md ./
COPY protos ./protos
COPY coordinator ./coordinator
COPY worker ./worker
COPY langserver_python ./langserver_python
COPY langserver_js ./langserver_js
COPY supervisor ./supervisor
COPY telemetry ./telemetry
RUN /opt/venv/bin/pip install . && /opt/venv/bin/python -m compileall -q /opt/venv

FROM python:3.11-slim AS runtime
COPY --from=build /opt/venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/tmp \
    TMPDIR=/tmp \
    LANGSERVER_JS_ADDR=0.0.0.0:50052
USER 10001:10001
WORKDIR /tmp
EXPOSE 50052
STOPSIGNAL SIGTERM
HEALTHCHECK --interval=10s --timeout=5s --start-period=20s --retries=3 CMD ["python", "-m", "supervisor.probe", "grpc", "127.0.0.1:50052", "langserver.v1.LanguageServer"]
ENTRYPOINT ["python", "-m", "supervisor", "--role", "langserver-js"]
