"""A stand-in job process that starves as a Spark job with no usable executor does:
Spark's scheduler warning, over and over, and no end (run by a `launch_job` test)."""

import sys
import time

if __name__ == "__main__":
    while True:
        print(
            "25/11/30 07:00:00 WARN TaskSchedulerImpl: Initial job has not accepted any "
            "resources; check your cluster UI to ensure that workers are registered and have "
            "sufficient resources",
            flush=True,
        )
        time.sleep(0.05)
        sys.stdout.flush()
