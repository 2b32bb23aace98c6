"""``python -m featuredp``: the command line."""

import sys

from featuredp.cli import main

if __name__ == "__main__":  # not when a test runner imports this module
    sys.exit(main())
