"""The frozen bundle's entry point: the ``memfit`` console script,
``memfit.gui.launcher:console``."""

from memfit.gui.launcher import console

if __name__ == "__main__":
    console()
