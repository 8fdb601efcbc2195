# syntax=docker/dockerfile:1
# cleanerd images. A venv is built in a builder stage and only the venv is copied into a
# slim runtime stage, which runs the daemon as a non-root user. Match that user to the
# owner of the Kafka data:
#   docker build --build-arg UID=$(id -u kafka) --build-arg GID=$(id -g kafka) -t cleanerd .
#   docker run -d -v /var/lib/kafka/data:/var/lib/kafka/data -p 127.0.0.1:9644:9644 cleanerd
# The `spark` target adds Java 17 and the `spark` extra (PySpark) for `engine.name: spark`:
#   docker build --target spark -t cleanerd:spark .
#   docker run --init ... cleanerd:spark    # --init reaps the Spark JVM's children
# The default target (`runtime`) is the last stage, so `docker build .` builds it.

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

# --- builder: the venv with cleanerd and its dependencies --------------------------------
FROM ${PYTHON_IMAGE} AS builder
ENV PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
WORKDIR /src
# Dependencies first, from only what pip needs to resolve them, so that a code change
# does not reinstall them.
COPY pyproject.toml README.md ./
COPY cleanerd/__init__.py cleanerd/
RUN --mount=type=cache,target=/root/.cache/pip pip install .
COPY cleanerd/ cleanerd/
RUN --mount=type=cache,target=/root/.cache/pip pip install --no-deps --force-reinstall .
# Inside a container, loopback is unreachable from outside the container's network
# namespace; publish the port with `-p` to choose who reaches it. grep fails the build
# if the sample's listen line ever changes, instead of silently keeping loopback.
COPY config/cleanerd.yaml /tmp/cleanerd.sample.yaml
RUN sed 's/^  listen: "127\.0\.0\.1:9644"$/  listen: "0.0.0.0:9644"/' \
        /tmp/cleanerd.sample.yaml > /opt/cleanerd.yaml \
    && grep -q '^  listen: "0.0.0.0:9644"$' /opt/cleanerd.yaml

# --- builder-spark: the same venv plus PySpark -------------------------------------------
FROM builder AS builder-spark
RUN --mount=type=cache,target=/root/.cache/pip pip install '.[spark]'

# --- base: what both runnable images share -----------------------------------------------
FROM ${PYTHON_IMAGE} AS base
ARG UID=10001
ARG GID=10001
RUN groupadd --system --gid "${GID}" cleanerd \
    && useradd --system --uid "${UID}" --gid cleanerd --home-dir /var/lib/cleanerd \
        --no-create-home --shell /usr/sbin/nologin cleanerd \
    && install -d -o cleanerd -g cleanerd /var/lib/cleanerd /var/cache/cleanerd
COPY --from=builder /opt/cleanerd.yaml /etc/cleanerd/cleanerd.yaml
# numba caches compiled kernels next to the code by default; the venv is read-only for
# the user, so the cache goes to a directory it owns.
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    NUMBA_CACHE_DIR=/var/cache/cleanerd/numba
WORKDIR /var/lib/cleanerd
EXPOSE 9644
# The daemon handles SIGTERM and SIGINT itself, so it can run as PID 1.
ENTRYPOINT ["cleanerd"]
CMD ["run", "-c", "/etc/cleanerd/cleanerd.yaml"]

# --- spark: Java 17 and PySpark, for the spark engine ------------------------------------
FROM base AS spark
# Slim images drop /usr/share/man, where the JRE's postinst registers alternatives.
RUN mkdir -p /usr/share/man/man1 \
    && apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
        openjdk-17-jre-headless \
    && rm -rf /var/lib/apt/lists/*
COPY --from=builder-spark /opt/venv /opt/venv
USER cleanerd

# --- runtime (default): the daemon without Spark -----------------------------------------
FROM base AS runtime
COPY --from=builder /opt/venv /opt/venv
USER cleanerd
