"""`python -m coordinator`: run the coordinator (`serve`) or use its operator verbs."""

import os
import sys

from coordinator.cli import main

sys.exit(main(sys.argv[1:], os.environ))
