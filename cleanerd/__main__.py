"""`python -m cleanerd` runs the command line."""

import sys

from cleanerd.cli import entry

sys.exit(entry())
