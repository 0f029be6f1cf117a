"""The frozen bundle's entry point: the ``memfit`` console script, ``gui.launcher:main``."""

import sys

from gui.launcher import main

if __name__ == "__main__":
    sys.exit(main())
