# The standalone Sluice broker.
#
# Build with scripts/build-image.sh: it prepares the wheelhouse (.docker-build/wheels: sluice + grpcio, protobuf, numba,
# numpy, pyarrow) on the host, so nothing inside the build reaches the network. The base is any image with a
# CPython 3.11 `python3` that can make a venv: the official python:3.11-slim by default, or the Debian bookworm
# image scripts/ensure-docker.sh builds with debootstrap on machines without a registry.
#
#   docker run -d -p 127.0.0.1:10911:10911 -v sluice-store:/var/lib/sluice sluice-broker [--flush sync]
#
# The broker runs as user `sluice` (uid 10001): a named volume gets the right owner by itself; a host directory
# bind-mounted on /var/lib/sluice must be writable by that uid (chown 10001 DIR).
ARG BASE_IMAGE=python:3.11-slim
FROM ${BASE_IMAGE}

ARG SLUICE_UID=10001
ENV PATH=/opt/sluice/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    NUMBA_CACHE_DIR=/var/cache/sluice-numba

# Dependencies first, in their own layer: it stays cached while only sluice's source changes.
COPY .docker-build/wheels/deps/ /tmp/wheels/
# A venv keeps pip away from the system Python (Debian's is EXTERNALLY-MANAGED, PEP 668).
RUN python3 -m venv /opt/sluice \
    && /opt/sluice/bin/pip install --no-cache-dir --no-index --find-links /tmp/wheels /tmp/wheels/*.whl \
    && rm -rf /tmp/wheels \
    && useradd --system --uid "${SLUICE_UID}" --user-group --home-dir /var/lib/sluice --shell /usr/sbin/nologin sluice \
    && mkdir -p /var/lib/sluice "$NUMBA_CACHE_DIR" \
    && chown sluice:sluice /var/lib/sluice "$NUMBA_CACHE_DIR"

COPY .docker-build/wheels/sluice/ /tmp/wheels/
RUN /opt/sluice/bin/pip install --no-cache-dir --no-index --no-deps /tmp/wheels/*.whl \
    && rm -rf /tmp/wheels

USER sluice
# The compiled scan loops (broker/format/scan_kernel.py) are built now, into NUMBA_CACHE_DIR, not at the first
# large scan of a running broker (about 2 s of compilation holding the GIL).
RUN python3 -c "from broker.format import scan_kernel; scan_kernel.warm()"
WORKDIR /var/lib/sluice
# The store (commit log, consume queues, index, config) lives on a volume so it survives the container.
VOLUME /var/lib/sluice
EXPOSE 10911

# `sluice stats` is a Python process (gRPC import included): 10 s leaves room on a busy machine. With --auth it
# signs as the root user of the container's environment; with TLS it needs SLUICE_TLS_CA in that environment and a
# certificate valid for SLUICE_HEALTH_ENDPOINT (docs/security.md, "The broker image").
HEALTHCHECK --interval=10s --timeout=10s --start-period=20s --retries=3 \
    CMD SLUICE_ACCESS_KEY="${SLUICE_ACCESS_KEY:-$SLUICE_ROOT_ACCESS_KEY}" \
        SLUICE_SECRET_KEY="${SLUICE_SECRET_KEY:-$SLUICE_ROOT_SECRET_KEY}" \
        sluice stats --endpoint "${SLUICE_HEALTH_ENDPOINT:-127.0.0.1:10911}"

# Extra arguments (e.g. `--flush sync`) go after the image name and are appended.
ENTRYPOINT ["sluice", "broker", "--store", "/var/lib/sluice", "--listen", "0.0.0.0:10911"]
CMD []
