# syntax=docker/dockerfile:1
# cleanerd image: a venv built in one stage, copied into a slim runtime stage that runs
# as a non-root user. Match that user to the owner of the Kafka data:
#   docker build --build-arg UID=$(id -u kafka) --build-arg GID=$(id -g kafka) -t cleanerd .
#   docker run --rm -v /var/lib/kafka/data:/var/lib/kafka/data cleanerd dump ...

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS builder
ENV PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
WORKDIR /src
# Dependencies first, with only what pip needs to resolve them, so a code change does not
# reinstall them.
COPY pyproject.toml README.md ./
COPY cleanerd/__init__.py cleanerd/
RUN --mount=type=cache,target=/root/.cache/pip pip install .
COPY cleanerd/ cleanerd/
RUN --mount=type=cache,target=/root/.cache/pip pip install --no-deps --force-reinstall .

FROM ${PYTHON_IMAGE} AS runtime
ARG UID=10001
ARG GID=10001
RUN groupadd --system --gid "${GID}" cleanerd \
    && useradd --system --uid "${UID}" --gid cleanerd --home-dir /var/lib/cleanerd \
        --no-create-home --shell /usr/sbin/nologin cleanerd \
    && install -d -o cleanerd -g cleanerd /var/lib/cleanerd /var/cache/cleanerd
COPY --from=builder /opt/venv /opt/venv
COPY config/cleanerd.yaml /etc/cleanerd/cleanerd.yaml
# numba caches compiled code; the venv is read-only for the user, so point it elsewhere.
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    NUMBA_CACHE_DIR=/var/cache/cleanerd/numba
USER cleanerd
WORKDIR /var/lib/cleanerd
EXPOSE 9644
ENTRYPOINT ["cleanerd"]
CMD ["--help"]
