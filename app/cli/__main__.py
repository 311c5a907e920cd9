"""``python -m app.cli``: the ``kiln`` command."""

import sys

from app.cli.cli import main

sys.exit(main())
