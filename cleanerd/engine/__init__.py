"""Engines that run clean passes and audit scans (`base.Engine`): `local` (default), `spark`."""

from __future__ import annotations

from cleanerd.config import Config
from cleanerd.engine.base import AuditJob, CleanJob, Engine, WorkerCrashed

__all__ = ["AuditJob", "CleanJob", "Engine", "WorkerCrashed", "create_engine"]


def create_engine(config: Config, name: str | None = None) -> Engine:
    """The engine `name` (default: the config's `engine.name`), built from `config`.

    Engines are imported on demand so `local` never imports PySpark. `spark` named here
    (`--engine spark`) runs every pass on Spark; `engine.name: spark` in the config runs
    on Spark only the passes whose keys outgrow the local map (`policy.py`)."""
    chosen = name or config.engine.name
    if chosen == "local":
        from cleanerd.engine.local import LocalEngine

        return LocalEngine.from_config(config)
    if chosen == "spark" and name == "spark":
        from cleanerd.engine.spark.engine import SparkEngine

        return SparkEngine.from_config(config)
    if chosen == "spark":
        from cleanerd.engine.policy import policy_engine

        return policy_engine(config)
    raise ValueError(f"unknown engine {chosen!r} (known: local, spark)")
