"""``python -m app.cli``: the ``exports`` command, for a process that has no console script on its PATH."""

import sys

from app.cli.main import main

sys.exit(main())
