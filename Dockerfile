# checkpoint-exporter: the package in a virtualenv of its own (/opt/checkpoint-exporter, as the
# package install puts it), run as an unprivileged user, on a read-only root if you like.
# docs/install-image.md: building, pinning the base, running it, the health check, the torch
# flavour.
#   scripts/build-image              docker or podman; tags checkpoint-exporter:<version>
#   docker run -d --net=host --read-only -v /etc/checkpoint-exporter:/etc/checkpoint-exporter:ro \
#     -v /mnt/ckpt:/mnt/ckpt:ro -v /var/lib/checkpoint-exporter/spool:/var/lib/checkpoint-exporter/spool \
#     checkpoint-exporter:<version>
#
# The base: any Debian-like image with python3 (3.10+), its venv module and useradd (and
# libstdc++ for FLAVOR=full). By tag here; a release pins it by digest
# (--build-arg BASE=python:3.11-slim-bookworm@sha256:..., which scripts/build-image --save
# insists on).
ARG BASE=python:3.11-slim-bookworm

FROM ${BASE} AS build
# pip reads these from the environment: an internal index, or a wheelhouse for a build offline
# (PIP_NO_INDEX=1 PIP_FIND_LINKS=/wheelhouse, with the directory mounted: podman build -v).
ARG PIP_INDEX_URL
ARG PIP_EXTRA_INDEX_URL
ARG PIP_FIND_LINKS
ARG PIP_NO_INDEX
ARG PIP_TRUSTED_HOST
# slim: the exporter alone. full: with torch (CPU) too, which `restore-drill --full` needs for
# DCP checkpoints only (torch.save and safetensors files are read without it); about 0.9 GB more.
ARG FLAVOR=slim
ARG TORCH_REQUIREMENT=torch
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
# .dockerignore lets in only the package's source and the files its metadata names.
COPY . /src
RUN set -eu; \
    case "$FLAVOR" in \
      slim|full) ;; \
      *) echo "FLAVOR must be slim or full, not '$FLAVOR'" >&2; exit 1 ;; \
    esac; \
    python3 -m venv /opt/checkpoint-exporter; \
    pip="/opt/checkpoint-exporter/bin/python -m pip --no-cache-dir --disable-pip-version-check"; \
    $pip install /src; \
    if [ "$FLAVOR" = full ]; then \
      $pip install --index-url "$TORCH_INDEX_URL" "$TORCH_REQUIREMENT"; \
    fi; \
    # Nothing is installed at run time: the installers stay behind in this stage (setuptools
    # too, unless torch requires it).
    if [ "$FLAVOR" = slim ]; then $pip uninstall --yes setuptools; fi; \
    $pip uninstall --yes pip

FROM ${BASE}
ARG BASE
ARG FLAVOR=slim
ARG VERSION=unknown
LABEL org.opencontainers.image.title="checkpoint-exporter" \
      org.opencontainers.image.description="Prometheus exporter for GPU training checkpoints" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.base.name="${BASE}" \
      io.checkpoint-exporter.flavor="${FLAVOR}"
# A user of its own, without home or shell. Any other uid works too (a pod's runAsUser): nothing
# in the image is written at run time. Keep it one no training job runs as: the spool trusts the
# exporter's uid with restore drills for every job (docs/security.md).
RUN groupadd --system --gid 10001 exporter \
    && useradd --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent \
       --shell /usr/sbin/nologin exporter
COPY --from=build /opt/checkpoint-exporter /opt/checkpoint-exporter
ENV PATH=/opt/checkpoint-exporter/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
USER 10001:10001
EXPOSE 25780
# healthcheck finds serve as serve finds itself: the config file's web: block (listen address,
# web config and so TLS). Flags given to serve instead go to the probe as well: --health-cmd.
HEALTHCHECK --interval=30s --timeout=5s --start-period=30s --retries=3 \
    CMD ["checkpoint-exporter", "healthcheck", "--config.file=/etc/checkpoint-exporter/config.yaml"]
ENTRYPOINT ["checkpoint-exporter"]
CMD ["serve", "--config.file=/etc/checkpoint-exporter/config.yaml"]
