"""``python -m turnloom``: the same command line as ``turnloom``."""

from __future__ import annotations

import sys

from turnloom.cli import main

if __name__ == "__main__":
    sys.exit(main())
