"""The frozen bundle's entry point: the ``memfit`` console script, ``memfit.gui.launcher:main``."""

import sys

from memfit.gui.launcher import main

if __name__ == "__main__":
    sys.exit(main())
