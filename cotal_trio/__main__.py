"""``python -m cotal_trio`` runs the ``cotal`` command line."""

import sys

from .cli import main

sys.exit(main())
