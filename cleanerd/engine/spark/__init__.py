"""The Spark engine: clean passes and audits whose per-key work runs on Apache Spark.

Two sides, in two processes, meeting only in a staging dir of files (`specs.py`):

- `engine.py` runs in the daemon's (or a command's) process: the `SparkEngine`, the
  launching of job processes, and the verification and install of their output. It
  never imports Spark.
- `clean_job.py` and `audit_job.py` are the job processes (``python -m``): Spark's
  driver and, for their executor stages, its Python workers. `session.py` is the only
  module that imports PySpark and PyArrow; `tasks.py` is what the jobs and the engine
  share about running cleanerd's code on Spark.
"""
