"""Engines that run clean passes (`base.Engine`).

One name per engine, the same in the config (`engine.name`) and on the command line
(`--engine`): `local` runs every pass in worker processes on this host (the default),
`spark` every pass on Spark (`spark/`), `auto` a pass on Spark only when its dirty
range's keys outgrow the local offset map (`routing.py`). None of them imports PySpark:
only a Spark job process does. `create_engine` imports the module of the engine chosen,
and only that one.
"""

from __future__ import annotations

from cleanerd.config import Config
from cleanerd.engine.base import CleanJob, Engine, WorkerCrashed

__all__ = ["CleanJob", "Engine", "WorkerCrashed", "create_engine"]


def create_engine(config: Config, name: str | None = None, *, in_process: bool = False) -> Engine:
    """The engine `name` (default: the config's `engine.name`), built from `config`.
    `in_process` (one-shot commands): local passes run in this process where one process
    does the work faster than a pool it would first start (`local.LocalEngine`)."""
    # Each engine's module is imported only when it is chosen: a local run never loads
    # the Spark engine's code (nor `auto`'s, which loads both).
    chosen = name or config.engine.name
    if chosen == "local":
        from cleanerd.engine.local import LocalEngine

        return LocalEngine.from_config(config, in_process=in_process)
    if chosen == "spark":
        from cleanerd.engine.spark.engine import SparkEngine

        return SparkEngine.from_config(config)
    if chosen == "auto":
        from cleanerd.engine.routing import auto_engine

        return auto_engine(config, in_process=in_process)
    raise ValueError(f"unknown engine {chosen!r} (known: local, spark, auto)")
