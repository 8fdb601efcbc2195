"""The Dockerfile's shape, checked statically (no Docker daemon is needed), and the
image's config as its build step writes it."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from cleanerd.config import MetricsConfig, load_config
from tests.paths import REPO

DOCKERFILE = REPO / "Dockerfile"
SAMPLE = REPO / "config" / "cleanerd.yaml"


def _instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) in order, continuation lines joined, comments dropped."""
    logical, current = [], ""
    for line in DOCKERFILE.read_text().splitlines():
        if line.lstrip().startswith("#") or not line.strip():
            continue
        current += line.rstrip().removesuffix("\\") + " "
        if not line.rstrip().endswith("\\"):
            logical.append(current.strip())
            current = ""
    return [(s.split(None, 1)[0].upper(), s.split(None, 1)[1]) for s in logical]


def _stages() -> dict[str, list[tuple[str, str]]]:
    """Each stage's instructions by stage name."""
    stages: dict[str, list[tuple[str, str]]] = {}
    name = ""
    for op, args in _instructions():
        if op == "FROM":
            name = args.split(" AS ")[-1].strip() if " AS " in args else args
            stages[name] = []
        elif name:
            stages[name].append((op, args))
    return stages


def _args(stage: list[tuple[str, str]], op: str) -> list[str]:
    return [a for o, a in stage if o == op]


def test_default_target_is_the_slim_runtime_running_the_daemon() -> None:
    """The last stage (`docker build .`) is `runtime`: the builder's venv only, a
    non-root user, exec-form ENTRYPOINT cleanerd and CMD run -c the image's config."""
    stages = _stages()
    assert list(stages)[-1] == "runtime"
    froms = [a for o, a in _instructions() if o == "FROM"]
    assert froms[0] == "${PYTHON_IMAGE} AS builder"
    assert "ARG PYTHON_IMAGE=python:3.11-slim-bookworm" in DOCKERFILE.read_text()
    runtime, base = stages["runtime"], stages["base"]
    assert _args(runtime, "COPY") == ["--from=builder /opt/venv /opt/venv"]
    assert _args(runtime, "USER") == ["cleanerd"]
    assert _args(base, "ENTRYPOINT") == ['["cleanerd"]']
    assert _args(base, "CMD") == ['["run", "-c", "/etc/cleanerd/cleanerd.yaml"]']
    assert _args(base, "EXPOSE") == [str(MetricsConfig().port)]
    env = " ".join(_args(base, "ENV"))
    assert "NUMBA_CACHE_DIR=/var/cache/cleanerd/numba" in env
    user_setup = " ".join(_args(base, "RUN"))
    assert 'useradd --system --uid "${UID}"' in user_setup
    assert "install -d -o cleanerd -g cleanerd /var/lib/cleanerd /var/cache/cleanerd" in user_setup
    assert {"UID=10001", "GID=10001"} <= set(_args(base, "ARG"))


def test_spark_target_adds_java_17_and_the_spark_extra() -> None:
    """`--target spark` installs openjdk-17-jre-headless and a venv with `.[spark]`,
    and runs as the same non-root user."""
    stages = _stages()
    spark = stages["spark"]
    assert "openjdk-17-jre-headless" in " ".join(_args(spark, "RUN"))
    assert _args(spark, "COPY") == ["--from=builder-spark /opt/venv /opt/venv"]
    assert _args(spark, "USER") == ["cleanerd"]
    assert "pip install '.[spark]'" in " ".join(_args(stages["builder-spark"], "RUN"))


def test_image_config_is_the_sample_listening_on_all_container_interfaces(
    tmp_path: Path,
) -> None:
    """The build step that writes the image's config, run on the real sample, gives a
    valid config that differs from the sample only in metrics.listen."""
    step = next(a for a in _args(_stages()["builder"], "RUN") if "/opt/cleanerd.yaml" in a)
    image_config = tmp_path / "cleanerd.yaml"
    script = step.replace("/tmp/cleanerd.sample.yaml", str(SAMPLE)).replace(
        "/opt/cleanerd.yaml", str(image_config)
    )
    subprocess.run(["sh", "-ec", script], check=True, timeout=30)
    sample, image = load_config(SAMPLE), load_config(image_config)
    assert image.metrics.listen == "0.0.0.0:9644"
    assert image.model_copy(update={"metrics": sample.metrics}) == sample
    changed = [
        line
        for line in image_config.read_text().splitlines()
        if line not in SAMPLE.read_text().splitlines()
    ]
    assert [re.sub(r"\s+", " ", line) for line in changed] == [' listen: "0.0.0.0:9644"']
