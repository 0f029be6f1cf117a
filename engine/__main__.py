"""``python -m memfit.engine`` runs the command line (see :mod:`memfit.engine.cli`)."""

import sys

from memfit.engine.cli import main

sys.exit(main())
