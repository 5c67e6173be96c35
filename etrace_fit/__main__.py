"""``python -m etrace_fit`` is the ``etrace-fit`` command."""

import sys

from .cli import main

sys.exit(main())
