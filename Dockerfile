# One image for the webhook, the device plugin and the certificate tool:
#   gpushare-webhook, gpushare-device-plugin, gpushare-certs (console scripts on PATH), and kubectl-gpushare.
# Build:  docker build -t REGISTRY/gpushare:0.1.0 .
# The base is pinned to a patch release; to pin it to a digest as well, build with
#   --build-arg PYTHON_IMAGE=python:3.11.13-slim-bookworm@sha256:<digest of the image you vetted>
ARG PYTHON_IMAGE=python:3.11.13-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
# Every dependency ships binary wheels for linux/amd64 and linux/arm64 (grpcio, cryptography, protobuf), so this
# stage needs no compiler, and the runtime stage gets neither a compiler nor pip in its virtual environment.
RUN python -m venv /opt/venv
COPY pyproject.toml README.md LICENSE gunicorn.conf.py /app/
COPY common /app/common
COPY contract /app/contract
COPY webhook /app/webhook
COPY node /app/node
COPY deviceplugin /app/deviceplugin
COPY dra /app/dra
COPY certs /app/certs
COPY kubectlplugin /app/kubectlplugin
# The project lives at /app (webhook.server.serve finds gunicorn.conf.py there, beside the webhook package); the
# venv points at it.
RUN /opt/venv/bin/pip install --config-settings editable_mode=compat -e /app \
    && /opt/venv/bin/pip uninstall --yes pip \
    && /opt/venv/bin/python -m compileall -q /app /opt/venv \
    && rm -rf /app/*.egg-info

FROM ${PYTHON_IMAGE} AS runtime
LABEL org.opencontainers.image.title="gpushare" \
      org.opencontainers.image.description="Admission webhook and kubelet device plugin for exact GPU-memory sharing" \
      org.opencontainers.image.licenses="Apache-2.0"
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
RUN groupadd --system --gid 65532 gpushare \
    && useradd --system --uid 65532 --gid 65532 --no-create-home --home-dir /nonexistent \
        --shell /usr/sbin/nologin gpushare
COPY --from=build /opt/venv /opt/venv
COPY --from=build /app /app
WORKDIR /app
# Numeric, so the kubelet can check runAsNonRoot without reading /etc/passwd. The device plugin's DaemonSet
# overrides it with root for the kubelet's sockets (see docs/deploy.md).
USER 65532:65532
EXPOSE 8443
CMD ["gpushare-webhook"]
