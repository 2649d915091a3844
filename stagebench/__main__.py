"""``python -m stagebench`` is the ``stagebench`` command."""

import sys

from ._cli import main

sys.exit(main())
