"""The collector around long-lived work: paused inside, what was made frozen after, the
collector's own state restored. Each case runs in a fresh interpreter, so this test
process never freezes its own objects."""

from __future__ import annotations

from tests.tools import run_python

_PROBE = """
import gc, sys
from cleanerd.collector import long_lived_objects
if sys.argv[1] == "disabled":
    gc.disable()
before = gc.get_freeze_count()
with long_lived_objects():
    inside = gc.isenabled()
    made = [[i] for i in range(5000)]
print(inside, gc.isenabled(), gc.get_freeze_count() - before >= 5000)
try:
    with long_lived_objects():
        raise ValueError
except ValueError:
    print(gc.isenabled())
"""


def test_pauses_the_collector_then_freezes_what_was_made_and_resumes_it() -> None:
    assert run_python(_PROBE, "enabled").split() == ["False", "True", "True", "True"]


def test_leaves_a_collector_that_was_off_off() -> None:
    assert run_python(_PROBE, "disabled").split() == ["False", "False", "True", "False"]
