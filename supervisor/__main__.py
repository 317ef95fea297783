"""`python -m supervisor`: see `supervisor/cli.py` (options) and `supervisor/config.py` (environment)."""

import os
import sys

from supervisor.cli import main

sys.exit(main(sys.argv[1:], os.environ))
