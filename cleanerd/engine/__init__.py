"""Engines that run clean passes and audit scans (`base.Engine`).

One name per engine, the same in the config (`engine.name`) and on the command line
(`--engine`): `local` runs every pass in worker processes on this host (the default),
`spark` every pass on Spark (`spark/`), `auto` a pass on Spark only when its dirty
range's keys outgrow the local offset map (`routing.py`). None of them imports PySpark:
only a Spark job process does.
"""

from __future__ import annotations

from cleanerd.config import Config
from cleanerd.engine.base import AuditJob, CleanJob, Engine, WorkerCrashed
from cleanerd.engine.local import LocalEngine
from cleanerd.engine.routing import auto_engine
from cleanerd.engine.spark.engine import SparkEngine

__all__ = ["AuditJob", "CleanJob", "Engine", "WorkerCrashed", "create_engine"]


def create_engine(config: Config, name: str | None = None) -> Engine:
    """The engine `name` (default: the config's `engine.name`), built from `config`."""
    chosen = name or config.engine.name
    if chosen == "local":
        return LocalEngine.from_config(config)
    if chosen == "spark":
        return SparkEngine.from_config(config)
    if chosen == "auto":
        return auto_engine(config)
    raise ValueError(f"unknown engine {chosen!r} (known: local, spark, auto)")
