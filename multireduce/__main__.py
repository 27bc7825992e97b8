"""``python -m multireduce``: the same command line as the ``multireduce`` console script."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
