"""`python -m coordinator`: run the coordinator (`serve`) or use its operator verbs."""

import sys

from coordinator.cli import main

sys.exit(main(sys.argv[1:]))
