"""``python -m jobs.watch``: the same command as ``audit watch``."""

import sys

from jobs.watch.cli import main

sys.exit(main())
